"""Runs :class:`HttpApp` on uvicorn (httptools parser) inside infermux's own event loop."""

from __future__ import annotations

import contextlib
import logging
import socket
from collections.abc import Iterator, Sequence

import uvicorn

from infermux.frontends.http.app import HttpApp

logger = logging.getLogger(__name__)


class _EmbeddedServer(uvicorn.Server):
    # infermux owns SIGINT/SIGTERM for all its front ends and asks each to stop; uvicorn must not
    # install (and later re-raise) its own handlers.
    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class HttpServer:
    """One HTTP listener. ``serve`` returns after ``shutdown`` once in-flight requests finished."""

    def __init__(
        self,
        app: HttpApp,
        *,
        host: str,
        port: int,
        graceful_timeout: int = 30,
        log_level: str = "warning",
    ) -> None:
        config = uvicorn.Config(
            app,
            host=host,
            port=port,
            http="httptools",
            loop="none",  # the loop is infermux's (uvloop when available)
            lifespan="off",
            access_log=False,
            log_level=log_level,
            timeout_graceful_shutdown=graceful_timeout,
            server_header=False,
        )
        self._server = _EmbeddedServer(config)
        self.host, self.port = host, port

    @property
    def started(self) -> bool:
        return self._server.started

    async def serve(self, sockets: Sequence[socket.socket] | None = None) -> None:
        """Serve on ``sockets`` (already bound, so bind errors surface before models load)."""
        await self._server.serve(sockets=list(sockets) if sockets is not None else None)

    def shutdown(self) -> None:
        """Stop accepting; ``serve`` returns once open requests are answered."""
        self._server.should_exit = True
