"""The composition root: builds repository, data plane and front ends, and owns their lifetime.

With one front end (``--frontends 1``) everything runs in this process, as built here. With
more, :mod:`infermux.processes` runs the same pieces split over processes; :func:`serve` picks.

Start-up binds every listener first (so a busy port fails fast, before models load), then loads
the models, then serves. Shutdown order (on SIGINT/SIGTERM): report not-ready, stop accepting on
every front end, let every admitted request finish (front ends wait for open requests and RPCs,
schedulers drain their queues), unload the models, unmap shared memory, remove socket files, exit 0.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
from typing import Protocol

from infermux import __version__
from infermux.dataplane.assembly import EXTENSIONS, SHM_EXTENSIONS, build_dataplane
from infermux.dataplane.assembly import build_repository as _build_repository
from infermux.errors import StartupError
from infermux.frontends import unix_socket
from infermux.frontends.metrics import MetricsEndpoint, metrics_socket
from infermux.frontends.serving import FrontEnds, http_sockets
from infermux.observability.progress import LoadProgress
from infermux.observability.tracing import TRACING
from infermux.processes import Supervisor
from infermux.runtime import garbage
from infermux.settings import ServerSettings

__all__ = ["EXTENSIONS", "SHM_EXTENSIONS", "InfermuxServer", "StartupError", "serve"]

logger = logging.getLogger("infermux")


class InfermuxServer:
    """One infermux server process. ``run`` serves until :meth:`request_shutdown`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._progress = LoadProgress() if LoadProgress.wanted() else None
        self.repository = _build_repository(settings, self._progress)
        self.dataplane = build_dataplane(settings, self.repository)
        self._stop = asyncio.Event()
        self.endpoints: list[str] = []

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (safe to call from a signal handler, and more than once)."""
        if not self._stop.is_set():
            logger.info("shutting down: finishing in-flight requests")
        self.dataplane.begin_shutdown()
        self._stop.set()

    async def run(self) -> None:
        """Load models, serve until asked to stop, then shut down gracefully."""
        sockets, socket_files = http_sockets(self.settings)
        metrics: MetricsEndpoint | None = None
        try:
            metrics_sock = metrics_socket(self.settings)
            if metrics_sock is not None:
                metrics = MetricsEndpoint(
                    self.settings, self.repository, self.dataplane.router, metrics_sock
                )
            fronts = FrontEnds(self.settings, self.dataplane, sockets)
            TRACING.start(self.settings.trace)
            with self._progress or contextlib.nullcontext():
                await self.repository.start()
            await fronts.bind_grpc()
        except BaseException:
            for sock in sockets:
                sock.close()
            if metrics is not None:
                metrics.close()
            await self.repository.close()
            TRACING.shutdown()
            raise
        try:
            # What start-up built (torch, the models) is not walked again; before HTTP listens,
            # so that its one full collection holds up no request.
            garbage.settle()
            await fronts.start_http()
            self.endpoints = fronts.announce()
            if metrics is not None:
                await metrics.start()
                self.endpoints.append(metrics.address)
            models = self.repository.index(ready_only=True)
            logger.info(
                "infermux %s ready: %s (models: %s)",
                __version__,
                ", ".join(self.endpoints),
                ", ".join(f"{e.name}:{e.version}" for e in models) or "none",
            )
            await fronts.serve_until(self._stop)
        finally:
            self.dataplane.begin_shutdown()
            await fronts.stop()
            await self.repository.close()
            if metrics is not None:
                await metrics.stop()
            TRACING.shutdown()
            self.dataplane.close()
            for path in socket_files:
                unix_socket.remove(path)
            logger.info("infermux stopped")


class _Stoppable(Protocol):
    def request_shutdown(self) -> None: ...
    async def run(self) -> None: ...


async def serve(settings: ServerSettings) -> None:
    """Run a server (in this process, or supervising front-end and executor processes) with
    SIGINT/SIGTERM wired to a graceful shutdown."""
    server: _Stoppable
    if settings.ray_address:
        from infermux.ray.ingress import RayServer  # Ray is an optional extra

        server = RayServer(settings)
    elif settings.frontends > 1 or settings.executors > 1:
        server = Supervisor(settings)
    else:
        server = InfermuxServer(settings)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        with contextlib.suppress(NotImplementedError):  # not on Windows
            loop.add_signal_handler(sig, server.request_shutdown)
    await server.run()
