"""What a gRPC inference call brings beside its message, shared by the unary and the streaming
handlers: the request decoded (an unknown model reported before a malformed tensor, as Triton
does), the call's metadata (W3C trace context, routing key) and its deadline, and the one log
line for a malformed message."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from typing import Any

from infermux.dataplane import Operations
from infermux.errors import InvalidArgumentError
from infermux.frontends.grpc import codec
from infermux.frontends.grpc.handlers import Malformed
from infermux.frontends.model_first import unknown_model_first
from infermux.observability import tracing
from infermux.observability.logs import RateLimitedLog
from infermux.routing.router import ROUTING_KEY_HEADER, ROUTING_KEY_PARAMETER
from infermux.types import InferRequest

logger = logging.getLogger(__name__)
_client_faults = RateLimitedLog(logger)

Message = Any  # protobuf messages: tritonclient's generated modules carry no type information
Context = Any  # grpc.aio.ServicerContext


async def decode(dataplane: Operations, message: Message) -> InferRequest:
    """The request ``message`` carries; a decoding error for a model that does not exist is
    reported as the unknown model (what Triton checks first)."""
    try:
        return codec.decode_infer_request(message)
    except InvalidArgumentError as exc:
        await unknown_model_first(dataplane, message.model_name, message.model_version, exc)


def report_malformed(method: str, peer: str, request: Malformed) -> None:
    # One line, no traceback: the fault is the client's, and a client can send these at will.
    _client_faults.report(
        "malformed", "malformed gRPC %s request from %s: %s", method, peer, request.reason
    )


def deadline_ns(context: Context) -> int:
    """The call's deadline as a ``time.monotonic_ns()`` instant (0: the client set none).
    grpc.aio cancels the handler then; the instant travels to an executor process, which must
    not start the request after it (``InferRequest.deadline_ns``)."""
    remaining = context.time_remaining()
    return 0 if remaining is None else time.monotonic_ns() + int(remaining * 1e9)


def from_metadata(request: InferRequest, metadata: Iterable[tuple[str, str]]) -> None:
    """What infermux reads from the call's metadata: the W3C trace context and a routing key."""
    pairs = list(metadata)
    request.trace_context = tracing.carrier(pairs)
    for key, value in pairs:
        if key == ROUTING_KEY_HEADER:
            request.parameters.setdefault(ROUTING_KEY_PARAMETER, value)
