"""Runs :class:`InferenceServicer` on a ``grpc.aio`` server inside infermux's own event loop."""

from __future__ import annotations

import contextlib
import logging
import os
import socket
from collections.abc import Sequence
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
from grpc_health.v1 import health_pb2

from infermux.dataplane import Operations
from infermux.frontends.access import OPEN, Access
from infermux.frontends.grpc import handlers
from infermux.frontends.grpc.access import AccessInterceptor
from infermux.frontends.grpc.health import Health
from infermux.frontends.grpc.servicer import InferenceServicer
from infermux.settings import DEFAULT_GRPC_MAX_MESSAGE_SIZE, DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT

logger = logging.getLogger(__name__)

HEALTH_SERVICE = health_pb2.DESCRIPTOR.services_by_name["Health"]

MAX_SEND_BYTES = 2**31 - 1
"""gRPC's own ceiling for one message, which Triton and tritonclient also use: an answer's size
is the model's doing, not the client's, so only received messages have a lower default bound."""


class GrpcBindError(Exception):
    """A gRPC listen address could not be bound; the message names it and, if known, why."""


class GrpcServer:
    """One gRPC listener on one or more addresses (``host:port`` or ``unix:/path``).

    ``start`` binds every address (raising :class:`GrpcBindError` naming the first that fails) and
    starts serving; ``stop`` stops accepting and lets running RPCs finish for up to
    ``graceful_timeout`` seconds before cancelling them. ``reuse_port`` lets the front-end
    processes of one server bind the same port (the kernel spreads connections over them).
    ``max_message_bytes`` bounds received messages (grpc refuses a larger one from its length
    prefix, RESOURCE_EXHAUSTED, before reading it); ``stream_in_flight`` bounds the requests of
    one ``ModelStreamInfer`` stream read and not yet answered (``servicer.py``).
    """

    def __init__(
        self,
        dataplane: Operations,
        *,
        addresses: Sequence[str],
        max_message_bytes: int = DEFAULT_GRPC_MAX_MESSAGE_SIZE,
        stream_in_flight: int = DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT,
        graceful_timeout: float,
        reuse_port: bool = False,
        credentials: Any = None,
        access: Access = OPEN,
    ) -> None:
        if not addresses:
            raise ValueError("GrpcServer needs at least one address")
        self._dataplane = dataplane
        self.addresses = list(addresses)
        self._max_message_bytes = max_message_bytes
        self._stream_in_flight = stream_in_flight
        self._graceful_timeout = graceful_timeout
        self._reuse_port = reuse_port
        self._credentials = credentials  # TLS on TCP addresses (tls.py); None: plain
        self._access = access
        self._server: Any = None
        self._health: Health | None = None
        self._ports: dict[str, int] = {}

    @property
    def bound_port(self) -> int | None:
        """The TCP port bound for the first ``host:port`` address (the real one for port 0)."""
        return next((p for a, p in self._ports.items() if not _is_unix(a)), None)

    async def start(self) -> None:
        if self._server is not None:
            raise RuntimeError("GrpcServer.start called twice")
        server = grpc.aio.server(
            interceptors=[] if self._access.open else [AccessInterceptor(self._access)],
            options=[
                ("grpc.max_send_message_length", MAX_SEND_BYTES),
                ("grpc.max_receive_message_length", self._max_message_bytes),
                # grpc turns SO_REUSEPORT on by default, so a second server on a busy port would
                # bind silently and share its traffic; Triton also leaves it off by default.
                # Several front-end processes of one server share their port on purpose.
                ("grpc.so_reuseport", int(self._reuse_port)),
            ],
        )
        handlers.add_to_server(
            InferenceServicer(self._dataplane, stream_in_flight=self._stream_in_flight), server
        )
        self._health = Health(self._dataplane)
        handlers.add_service(server, HEALTH_SERVICE, self._health)
        try:
            for address in self.addresses:
                self._ports[address] = _bind(server, address, self._credentials)
        except GrpcBindError:
            await server.stop(None)  # releases the addresses already bound
            self._ports.clear()
            raise
        await server.start()
        self._server = server
        logger.debug("gRPC listening on %s", ", ".join(self.addresses))

    async def stop(self) -> None:
        """Stop accepting RPCs, wait for running ones (up to the graceful timeout), then return."""
        if self._server is None:
            return
        server, self._server = self._server, None
        if self._health is not None:
            await self._health.stop()
        await server.stop(self._graceful_timeout)


def _is_unix(address: str) -> bool:
    return address.startswith(("unix:", "unix-abstract:"))


def _bind(server: Any, address: str, credentials: Any = None) -> int:
    try:
        if credentials is not None and not _is_unix(address):
            port: int = server.add_secure_port(address, credentials)
        else:
            port = server.add_insecure_port(address)
    except RuntimeError:
        port = 0
    if port == 0:
        raise GrpcBindError(f"cannot listen for gRPC on '{address}': {_why_not(address)}")
    return port


def _why_not(address: str) -> str:
    """Best-effort reason a bind failed: grpc only logs it, so try the same bind ourselves."""
    if _is_unix(address):
        family, target = socket.AF_UNIX, address.partition(":")[2]
        if address.startswith("unix-abstract:"):
            target = "\0" + target
        where: Any = target
    else:
        host, _, port = address.rpartition(":")
        host = host.strip("[]")
        if not port.isdigit():
            return "expected 'host:port' or 'unix:/path'"
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        where = (host, int(port))
    with contextlib.closing(socket.socket(family, socket.SOCK_STREAM)) as probe:
        try:
            probe.bind(where)
        except OSError as exc:
            return exc.strerror or str(exc)
        except (TypeError, ValueError) as exc:  # e.g. a NUL byte in the host or path
            return str(exc)
    if family == socket.AF_UNIX and not where.startswith("\0"):
        with contextlib.suppress(OSError):
            os.unlink(where)  # the probe's own socket file
    return "grpc could not bind it"
