"""Triton's gRPC API (``inference.GRPCInferenceService``) on ``grpc.aio``."""

from infermux.frontends.grpc.server import GrpcBindError, GrpcServer
from infermux.frontends.grpc.servicer import InferenceServicer

__all__ = ["GrpcBindError", "GrpcServer", "InferenceServicer"]
