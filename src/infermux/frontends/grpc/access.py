"""The access rules of :mod:`infermux.frontends.access` for gRPC: a server interceptor that
reads the ``authorization`` metadata and aborts with UNAUTHENTICATED or PERMISSION_DENIED.
Installed only when a token is set, so an open server pays nothing per call."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information

from infermux.frontends.access import Access, Denied, Kind

_SERVICE = "/inference.GRPCInferenceService/"
_HEALTH = "/grpc.health.v1.Health/"  # probes carry no token, as /v2/health/* need none
_KINDS = {
    "ServerLive": Kind.HEALTH,
    "ServerReady": Kind.HEALTH,
    "RepositoryModelLoad": Kind.ADMIN,
    "RepositoryModelUnload": Kind.ADMIN,
    "SystemSharedMemoryRegister": Kind.ADMIN,
    "SystemSharedMemoryUnregister": Kind.ADMIN,
    "CudaSharedMemoryRegister": Kind.ADMIN,
    "CudaSharedMemoryUnregister": Kind.ADMIN,
    "TraceSetting": Kind.ADMIN,
    "LogSettings": Kind.ADMIN,
}
"""Every other RPC of the service (inference, metadata, statistics, status) is INFERENCE."""


def kind_of(method: str) -> Kind:
    if method.startswith(_HEALTH):
        return Kind.HEALTH
    name = method.removeprefix(_SERVICE)
    return _KINDS.get(name, Kind.INFERENCE)


class AccessInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]  # untyped base
    def __init__(self, access: Access) -> None:
        self._access = access

    async def intercept_service(
        self,
        continuation: Callable[[Any], Awaitable[Any]],
        handler_call_details: Any,
    ) -> Any:
        metadata = dict(handler_call_details.invocation_metadata or ())
        try:
            self._access.check(kind_of(handler_call_details.method), metadata.get("authorization"))
        except Denied as denied:
            return _refusal(await continuation(handler_call_details), denied)
        return await continuation(handler_call_details)


def _refusal(handler: Any, denied: Denied) -> Any:
    """A handler for ``handler``'s method that only aborts, without reading the request.

    It is a streaming-request handler whatever the method's shape (the wire is the same): for a
    unary one, grpc.aio would receive and deserialize the whole message before the handler runs,
    so an unauthenticated client could make the server hold and parse a message up to the size
    cap. Unread, the body stays behind HTTP/2 flow control and is dropped with the call.
    """
    if handler is None:
        return None
    code = (
        grpc.StatusCode.UNAUTHENTICATED
        if denied.unauthenticated
        else (grpc.StatusCode.PERMISSION_DENIED)
    )

    async def refuse(requests: AsyncIterator[Any], context: Any) -> None:
        await context.abort(code, denied.message)

    return grpc.stream_stream_rpc_method_handler(
        refuse, response_serializer=handler.response_serializer
    )
