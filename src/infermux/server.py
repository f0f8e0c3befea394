"""The composition root: builds repository, data plane and front ends, and owns their lifetime.

Shutdown order (on SIGINT/SIGTERM): report not-ready, stop accepting connections, let every
admitted request finish (front ends wait for open requests, schedulers drain their queues), unload
the models, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket

from infermux import __version__
from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.frontends.http import HttpApp, HttpServer
from infermux.repository import ControlMode, ModelRepository
from infermux.settings import ServerSettings

logger = logging.getLogger("infermux")

# Only what is really served is announced; perf_analyzer and clients key behaviour off this list.
EXTENSIONS = ("binary_tensor_data", "model_configuration", "model_repository", "parameters")


class StartupError(Exception):
    """The server cannot start (bad repository path, port in use, ...); the message says why."""


class InfermuxServer:
    """One infermux server process. ``run`` serves until :meth:`request_shutdown`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self.repository = ModelRepository(
            settings.model_repositories,
            BackendRegistry(),
            control_mode=ControlMode(settings.model_control_mode),
            startup_models=settings.load_models,
            poll_seconds=settings.repository_poll_secs,
        )
        self.dataplane = DataPlane(
            self.repository,
            version=__version__,
            extensions=EXTENSIONS,
            strict_readiness=settings.strict_readiness,
        )
        self._stop = asyncio.Event()
        self.http_port = settings.http_port

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (safe to call from a signal handler, and more than once)."""
        if not self._stop.is_set():
            logger.info("shutting down: finishing in-flight requests")
        self.dataplane.begin_shutdown()
        self._stop.set()

    async def run(self) -> None:
        """Load models, serve until asked to stop, then shut down gracefully."""
        s = self.settings
        http_socket = _listen(s.host, s.http_port)
        self.http_port = http_socket.getsockname()[1]
        try:
            await self.repository.start()
        except Exception:
            http_socket.close()
            raise
        http = HttpServer(
            HttpApp(self.dataplane, max_body=s.http_max_input_size),
            host=s.host,
            port=self.http_port,
            graceful_timeout=s.exit_timeout_secs,
            log_level="debug" if s.log_verbose > 1 else "warning",
        )
        serving = asyncio.create_task(http.serve(sockets=[http_socket]), name="http")
        # uvicorn exposes no 'started' event to wait on, only a flag.
        while not http.started and not serving.done():  # noqa: ASYNC110
            await asyncio.sleep(0.01)
        if serving.done():
            await serving
        logger.info(
            "infermux %s ready: HTTP on http://%s:%d (models: %s)",
            __version__,
            s.host,
            self.http_port,
            ", ".join(f"{e.name}:{e.version}" for e in self.repository.index(ready_only=True))
            or "none",
        )
        stopped = asyncio.create_task(self._stop.wait())
        await asyncio.wait({serving, stopped}, return_when=asyncio.FIRST_COMPLETED)
        http.shutdown()
        with contextlib.suppress(asyncio.CancelledError):
            await serving
        stopped.cancel()
        await self.repository.close()
        logger.info("infermux stopped")


def _listen(host: str, port: int) -> socket.socket:
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise StartupError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    sock.listen(2048)
    sock.setblocking(False)
    return sock


async def serve(settings: ServerSettings) -> None:
    """Run a server with SIGINT/SIGTERM wired to a graceful shutdown."""
    server = InfermuxServer(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, server.request_shutdown)
    await server.run()
