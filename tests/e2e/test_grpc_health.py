"""The standard gRPC health service on infermux's gRPC port, black-box with grpc's own stub."""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest
import tritonclient.grpc as grpcclient
from grpc_health.v1 import health_pb2, health_pb2_grpc

from tests.support import ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


def status(url: str, service: str) -> int:
    with grpc.insecure_channel(url) as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        reply = stub.Check(health_pb2.HealthCheckRequest(service=service), timeout=10)
        return int(reply.status)


def test_serving_when_ready(test_server: ServerProcess) -> None:
    triton = grpcclient.InferenceServerClient(test_server.grpc_url)
    expected = SERVING if triton.is_server_ready() else NOT_SERVING
    triton.close()
    for service in ("", "inference.GRPCInferenceService"):
        assert status(test_server.grpc_url, service) == expected
    with pytest.raises(grpc.RpcError) as caught:
        status(test_server.grpc_url, "other.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_not_serving_until_every_model_is_ready(tmp_path: Path, frontends: str) -> None:
    write_model(tmp_path, "good")
    write_model(tmp_path, "later", versions=())  # no version yet: the model cannot be ready
    args = ("--model-repository", str(tmp_path), "--frontends", frontends)
    with start_server(*args, "--model-control-mode", "explicit", "--load-model", "*") as server:
        triton = grpcclient.InferenceServerClient(server.grpc_url)
        assert not triton.is_server_ready()
        assert status(server.grpc_url, "") == NOT_SERVING
        assert status(server.grpc_url, "inference.GRPCInferenceService") == NOT_SERVING
        triton.unload_model("later")
        assert triton.is_server_ready()
        assert status(server.grpc_url, "") == SERVING
        assert status(server.grpc_url, "inference.GRPCInferenceService") == SERVING
        triton.close()
        assert server.stop() == 0
