"""Runs an ASGI app (the V2 :class:`HttpApp`, the metrics endpoint) on uvicorn
(httptools parser) inside infermux's own event loop."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Awaitable, Callable, Iterator, Sequence
from pathlib import Path

import uvicorn

from infermux.frontends.http.protocol import protocol_class
from infermux.frontends.http.transport import Receive, Scope, Send
from infermux.settings import HttpLimits

AsgiApp = Callable[[Scope, Receive, Send], Awaitable[None]]

logger = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    # infermux owns SIGINT/SIGTERM for all its front ends and asks each to stop; uvicorn must not
    # install (and later re-raise) its own handlers.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """HTTP on bound sockets; ``serve`` returns after ``shutdown`` once open requests end.
    Each connection is held to ``limits`` (header sizes, timeouts, the connection cap)."""

    def __init__(
        self,
        app: AsgiApp,
        *,
        graceful_timeout: int = 30,
        log_level: str = "warning",
        tls: tuple[Path, Path] | None = None,
        limits: HttpLimits | None = None,
    ):
        cert, key = tls if tls is not None else (None, None)
        config = uvicorn.Config(
            app,
            http=protocol_class(limits or HttpLimits()),  # httptools, bounded (protocol.py)
            loop="none",  # the loop is infermux's (uvloop when available)
            lifespan="off",
            access_log=False,
            log_level=log_level,
            timeout_graceful_shutdown=graceful_timeout,
            server_header=False,
            ssl_certfile=cert,  # HTTPS on every TCP socket given to serve (tls.py)
            ssl_keyfile=key,
        )
        self._server = _EmbeddedServer(config)

    async def serve(self, sockets: Sequence[socket.socket]) -> None:
        """Serve on ``sockets`` (bound by the caller, so bind errors surface before models load)."""
        await self._server.serve(sockets=list(sockets))

    async def wait_started(self, serving: asyncio.Task[None]) -> None:
        """Return once uvicorn accepts connections (or re-raise why ``serving`` ended)."""
        # uvicorn exposes a 'started' flag but no event to wait on.
        while not self._server.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if serving.done():
            await serving

    def shutdown(self) -> None:
        """Stop accepting; ``serve`` returns once open requests are answered."""
        self._server.should_exit = True
