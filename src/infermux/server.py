"""The composition root: builds repository, data plane and front ends, and owns their lifetime.

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
import socket
from pathlib import Path

from infermux import __version__
from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.frontends import unix_socket
from infermux.frontends.grpc import GrpcBindError, GrpcServer
from infermux.frontends.http import HttpApp, HttpServer
from infermux.progress import LoadProgress
from infermux.repository import ControlMode, ModelRepository
from infermux.settings import DISABLED_PORT, ServerSettings

logger = logging.getLogger("infermux")

# Only what is really served is announced; perf_analyzer and clients key behaviour off this list.
EXTENSIONS = (
    "binary_tensor_data",
    "model_configuration",
    "model_repository",
    "parameters",
    "statistics",
)
SHM_EXTENSIONS = ("system_shared_memory", "cuda_shared_memory")


class StartupError(Exception):
    """The server cannot start (bad repository path, port in use, ...); the message says why."""


class InfermuxServer:
    """One infermux server process. ``run`` serves until :meth:`request_shutdown`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._progress = LoadProgress() if LoadProgress.wanted() else None
        self.repository = ModelRepository(
            settings.model_repositories,
            BackendRegistry(),
            control_mode=ControlMode(settings.model_control_mode),
            startup_models=settings.load_models,
            poll_seconds=settings.repository_poll_secs,
            observer=self._progress,
        )
        extensions = EXTENSIONS + (SHM_EXTENSIONS if settings.allow_client_shm else ())
        self.dataplane = DataPlane(
            self.repository,
            version=__version__,
            extensions=extensions,
            strict_readiness=settings.strict_readiness,
            shared_memory=SharedMemoryRegistry(enabled=settings.allow_client_shm),
            cuda_shared_memory=CudaSharedMemoryRegistry(enabled=settings.allow_client_shm),
        )
        self._stop = asyncio.Event()
        self._socket_files: list[Path] = []
        self.endpoints: list[str] = []

    def request_shutdown(self) -> None:
        """Begin a graceful shutdown (safe to call from a signal handler, and more than once)."""
        if not self._stop.is_set():
            logger.info("shutting down: finishing in-flight requests")
        self.dataplane.begin_shutdown()
        self._stop.set()

    async def run(self) -> None:
        """Load models, serve until asked to stop, then shut down gracefully."""
        s = self.settings
        http_sockets = self._http_sockets() if s.allow_http else []
        grpc = self._grpc_server() if s.allow_grpc else None
        try:
            with self._progress or contextlib.nullcontext():
                await self.repository.start()
            if grpc is not None:
                await grpc.start()
        except BaseException as exc:
            for sock in http_sockets:
                sock.close()
            await self.repository.close()
            if isinstance(exc, GrpcBindError):
                raise StartupError(str(exc)) from None
            raise
        http: HttpServer | None = None
        serving: asyncio.Task[None] | None = None
        try:
            if http_sockets:
                http = HttpServer(
                    HttpApp(self.dataplane, max_body=s.http_max_input_size),
                    graceful_timeout=s.exit_timeout_secs,
                    log_level="debug" if s.log_verbose > 1 else "warning",
                )
                serving = asyncio.create_task(http.serve(http_sockets), name="http")
                await http.wait_started(serving)
            self._announce(http_sockets, grpc)
            await self._stop.wait() if serving is None else await _first(serving, self._stop)
        finally:
            await self._shutdown(http, serving, grpc, http_sockets)

    def _http_sockets(self) -> list[socket.socket]:
        s = self.settings
        sockets = []
        try:
            if s.http_port != DISABLED_PORT:
                sockets.append(_listen(s.host, s.http_port))
            if s.http_uds is not None:
                sockets.append(unix_socket.listen_unix(s.http_uds))
                self._socket_files.append(s.http_uds)
        except (OSError, unix_socket.SocketPathError) as exc:
            for sock in sockets:
                sock.close()
            raise StartupError(str(exc)) from None
        return sockets

    def _grpc_server(self) -> GrpcServer:
        s = self.settings
        addresses = []
        if s.grpc_port != DISABLED_PORT:
            host = f"[{s.host}]" if ":" in s.host else s.host
            addresses.append(f"{host}:{s.grpc_port}")
        if s.grpc_uds is not None:
            try:
                unix_socket.clear_stale(s.grpc_uds)
            except unix_socket.SocketPathError as exc:
                raise StartupError(str(exc)) from None
            addresses.append(f"unix:{s.grpc_uds}")
            self._socket_files.append(s.grpc_uds)
        return GrpcServer(
            self.dataplane,
            addresses=addresses,
            max_message_bytes=s.grpc_max_message_size,
            graceful_timeout=s.exit_timeout_secs,
        )

    def _announce(self, http_sockets: list[socket.socket], grpc: GrpcServer | None) -> None:
        s = self.settings
        for sock in http_sockets:
            name = sock.getsockname()
            if isinstance(name, tuple):
                self.endpoints.append(f"HTTP on http://{s.host}:{name[1]}")
            else:
                self.endpoints.append(f"HTTP on unix:{name}")
        if grpc is not None:
            if grpc.bound_port is not None:
                self.endpoints.append(f"gRPC on {s.host}:{grpc.bound_port}")
            if s.grpc_uds is not None:
                unix_socket.set_mode(s.grpc_uds)
                self.endpoints.append(f"gRPC on unix:{s.grpc_uds}")
        models = self.repository.index(ready_only=True)
        logger.info(
            "infermux %s ready: %s (models: %s)",
            __version__,
            ", ".join(self.endpoints),
            ", ".join(f"{e.name}:{e.version}" for e in models) or "none",
        )

    async def _shutdown(
        self,
        http: HttpServer | None,
        serving: asyncio.Task[None] | None,
        grpc: GrpcServer | None,
        http_sockets: list[socket.socket],
    ) -> None:
        self.dataplane.begin_shutdown()
        if http is not None:
            http.shutdown()
        stopping = [grpc.stop()] if grpc is not None else []
        if serving is not None:
            stopping.append(_quietly(serving))
        await asyncio.gather(*stopping)
        for sock in http_sockets:
            sock.close()
        await self.repository.close()
        self.dataplane.close()
        for path in self._socket_files:
            unix_socket.remove(path)
        logger.info("infermux stopped")


async def _first(task: asyncio.Task[None], event: asyncio.Event) -> None:
    stopped = asyncio.ensure_future(event.wait())
    try:
        await asyncio.wait({task, stopped}, return_when=asyncio.FIRST_COMPLETED)
    finally:
        stopped.cancel()


async def _quietly(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task


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
