"""The method handlers of ``inference.GRPCInferenceService``, built from the service's descriptor
with deserializers that do not raise.

grpc.aio deserializes a request before the handler runs; when protobuf cannot parse the bytes,
grpc logs a full traceback and answers UNKNOWN, for every such call a client cares to send. Here
bytes that do not parse become a :class:`Malformed` value instead, which the servicer answers
with INVALID_ARGUMENT and one rate-limited log line (``servicer.py``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
from google.protobuf import message_factory
from tritonclient.grpc import service_pb2

SERVICE = service_pb2.DESCRIPTOR.services_by_name["GRPCInferenceService"]

_MAKERS = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


@dataclass(frozen=True, slots=True)
class Malformed:
    """What a request that protobuf cannot parse deserializes to."""

    message_type: str
    reason: str

    def describe(self) -> str:
        return f"the request does not parse as a protobuf {self.message_type} message"


def tolerant(message_class: Any) -> Callable[[bytes], Any]:
    """``message_class.FromString`` that returns :class:`Malformed` rather than raising."""
    parse = message_class.FromString
    name = message_class.DESCRIPTOR.full_name

    def deserialize(data: bytes) -> Any:
        try:
            return parse(data)
        except Exception as exc:  # DecodeError, or anything else the parser finds: client bytes
            return Malformed(name, str(exc) or type(exc).__name__)

    return deserialize


def add_to_server(servicer: Any, server: Any) -> None:
    """Serve every RPC of the service from ``servicer``'s method of the same name, as the
    generated ``add_GRPCInferenceServiceServicer_to_server`` does, with tolerant deserializers."""
    add_service(server, SERVICE, servicer, tolerant)


def add_service(
    server: Any,
    service: Any,
    servicer: Any,
    deserializer: Callable[[Any], Callable[[bytes], Any]] = lambda cls: cls.FromString,
) -> None:
    """Serve ``service`` (a protobuf service descriptor) from ``servicer``'s methods of the same
    names, through a generic handler only.

    Not as *registered* methods, which the generated ``add_*_to_server`` functions also make:
    grpc.aio's server keeps one pending request-call future per registered method and waits on
    all of them (``asyncio.wait``) for every call it accepts, so each RPC paid for every method of
    every service (23 futures here: 14.9 µs per wait against 6.2 µs for the one generic future,
    ``docs/decisions.md``, *gRPC handlers: generic only*). The generic handler's lookup by name
    is one dict access."""
    handlers = {}
    for method in service.methods:
        request = message_factory.GetMessageClass(method.input_type)
        response = message_factory.GetMessageClass(method.output_type)
        make = _MAKERS[method.client_streaming, method.server_streaming]
        handlers[method.name] = make(
            getattr(servicer, method.name),
            request_deserializer=deserializer(request),
            response_serializer=response.SerializeToString,
        )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler(service.full_name, handlers),)
    )
