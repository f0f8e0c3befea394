"""The listeners of one process: HTTP and gRPC front ends over one :class:`Operations`.

Used by the in-process server and by each front-end process alike. Binding comes first and is
separate (:func:`http_sockets`), so that a busy port fails before models load, and so that a
supervisor can bind the HTTP sockets once and hand them to every front-end process it starts.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from pathlib import Path
from typing import Any

from infermux.dataplane import Operations
from infermux.errors import StartupError
from infermux.frontends import access, tls, unix_socket
from infermux.frontends.grpc import GrpcBindError, GrpcServer
from infermux.frontends.http import HttpApp, HttpServer
from infermux.settings import DISABLED_PORT, ServerSettings

logger = logging.getLogger("infermux")


def http_sockets(settings: ServerSettings) -> tuple[list[socket.socket], list[Path]]:
    """Listening sockets for every HTTP address, and the socket files made (to remove later)."""
    s = settings
    sockets: list[socket.socket] = []
    files: list[Path] = []
    if not s.allow_http:
        return sockets, files
    try:
        if s.http_port != DISABLED_PORT:
            sockets.append(listen(s.host, s.http_port))
        if s.http_uds is not None:
            sockets.append(unix_socket.listen_unix(s.http_uds))
            files.append(s.http_uds)
    except (OSError, unix_socket.SocketPathError) as exc:
        for sock in sockets:
            sock.close()
        raise StartupError(str(exc)) from None
    return sockets, files


def http_endpoints(host: str, sockets: list[socket.socket], *, tls: bool = False) -> list[str]:
    """Where ``sockets`` listen, as the ready log line says it."""
    endpoints = []
    scheme = "https" if tls else "http"
    for sock in sockets:
        name = sock.getsockname()
        if isinstance(name, tuple):
            endpoints.append(f"HTTP on {scheme}://{host}:{name[1]}")
        else:
            endpoints.append(f"HTTP on unix:{name}")
    return endpoints


def listen(host: str, port: int) -> socket.socket:
    """A non-blocking TCP listener on ``host:port`` (a busy port raises :class:`StartupError`)."""
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


class FrontEnds:
    """HTTP on the given sockets and gRPC on the settings' addresses, over ``operations``.

    ``grpc_port`` overrides the settings' port (a front-end process after the first binds the
    port the first one got for port 0); ``reuse_port`` shares the gRPC port between processes;
    ``grpc_uds=False`` leaves the gRPC unix socket to another process (one path, one owner).
    """

    def __init__(
        self,
        settings: ServerSettings,
        operations: Operations,
        sockets: list[socket.socket],
        *,
        grpc_port: int | None = None,
        reuse_port: bool = False,
        grpc_uds: bool = True,
    ) -> None:
        self._settings = settings
        self._operations = operations
        self._sockets = sockets
        self.socket_files: list[Path] = []
        self.endpoints: list[str] = []
        self._tls = tls.load(settings)  # a bad pair fails here, before anything listens
        self._access = access.load(settings)
        self._grpc = self._grpc_server(grpc_port, reuse_port, grpc_uds)
        self._http: HttpServer | None = None
        self._serving: asyncio.Task[None] | None = None

    @property
    def grpc_port(self) -> int | None:
        """The TCP port gRPC listens on (known once started), None without TCP gRPC."""
        return self._grpc.bound_port if self._grpc is not None else None

    @property
    def serving(self) -> asyncio.Task[None] | None:
        """The HTTP server's task (it ends if the server fails), None without HTTP."""
        return self._serving

    def _grpc_server(self, port: int | None, reuse_port: bool, uds: bool) -> GrpcServer | None:
        s = self._settings
        if not s.allow_grpc:
            return None
        addresses = []
        port = s.grpc_port if port is None else port
        if port != DISABLED_PORT:
            host = f"[{s.host}]" if ":" in s.host else s.host
            addresses.append(f"{host}:{port}")
        if s.grpc_uds is not None and uds:
            try:
                unix_socket.clear_stale(s.grpc_uds)
            except unix_socket.SocketPathError as exc:
                raise StartupError(str(exc)) from None
            addresses.append(f"unix:{s.grpc_uds}")
            self.socket_files.append(s.grpc_uds)
        if not addresses:
            return None
        return GrpcServer(
            self._operations,
            addresses=addresses,
            max_message_bytes=s.grpc_max_message_size,
            stream_in_flight=s.grpc_max_stream_in_flight,
            graceful_timeout=s.exit_timeout_secs,
            reuse_port=reuse_port,
            credentials=self._tls.grpc_credentials() if self._tls is not None else None,
            access=self._access,
        )

    async def bind_grpc(self) -> None:
        """Bind and start gRPC (raises :class:`StartupError` naming a busy address)."""
        if self._grpc is None:
            return
        try:
            await self._grpc.start()
        except GrpcBindError as exc:
            raise StartupError(str(exc)) from None

    async def start_http(self) -> None:
        """Serve HTTP on the sockets; returns once the server accepts."""
        s = self._settings
        if not self._sockets:
            return
        self._http = HttpServer(
            HttpApp(self._operations, max_body=s.http_max_input_size, access=self._access),
            graceful_timeout=s.exit_timeout_secs,
            log_level="debug" if s.log_verbose > 1 else "warning",
            tls=(self._tls.cert, self._tls.key) if self._tls is not None and s.tls_http else None,
            limits=s.http_limits,
        )
        self._serving = asyncio.create_task(self._http.serve(self._sockets), name="http")
        await self._http.wait_started(self._serving)

    def announce(self) -> list[str]:
        """Where this process listens, as log-friendly strings (also kept in :attr:`endpoints`)."""
        s = self._settings
        https = self._tls is not None and s.tls_http
        self.endpoints = http_endpoints(s.host, self._sockets, tls=https)
        if self._grpc is not None:
            if self._grpc.bound_port is not None:
                self.endpoints.append(f"gRPC on {s.host}:{self._grpc.bound_port}")
            if s.grpc_uds is not None and s.grpc_uds in self.socket_files:
                unix_socket.set_mode(s.grpc_uds)
                self.endpoints.append(f"gRPC on unix:{s.grpc_uds}")
        return self.endpoints

    async def serve_until(self, stop: asyncio.Event) -> None:
        """Return when ``stop`` is set, or when the HTTP server ends (a failed server ends
        the process too)."""
        stopped = asyncio.ensure_future(stop.wait())
        waits: set[asyncio.Future[Any]] = {stopped}
        if self._serving is not None:
            waits.add(self._serving)
        try:
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
        finally:
            stopped.cancel()

    async def stop(self) -> None:
        """Stop accepting; let admitted requests and RPCs finish (up to the exit timeout)."""
        if self._http is not None:
            self._http.shutdown()
        stopping = [self._grpc.stop()] if self._grpc is not None else []
        if self._serving is not None:
            stopping.append(_quietly(self._serving))
        await asyncio.gather(*stopping)
        for sock in self._sockets:
            sock.close()
        for path in self.socket_files:
            unix_socket.remove(path)


async def _quietly(task: asyncio.Task[None]) -> None:
    with contextlib.suppress(asyncio.CancelledError):
        await task
