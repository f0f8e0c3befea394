"""The metrics endpoint: ``GET /metrics`` in the Prometheus text format on ``--metrics-port``.

It runs in the process that owns the models (the one process, or the executor behind several
front-end processes), on that process's event loop, where the counters it reads live. With
several executors (``--executors N``) the supervisor serves it, merging what each executor sends
(:func:`infermux.observability.metrics.merge`).
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Awaitable, Callable

from prometheus_client import CollectorRegistry

from infermux.errors import StartupError
from infermux.frontends.http.server import HttpServer
from infermux.frontends.http.transport import Receive, Scope, Send
from infermux.frontends.serving import listen
from infermux.observability import metrics
from infermux.repository import ModelRepository
from infermux.routing.router import Router
from infermux.settings import DISABLED_PORT, ServerSettings

PATH = "/metrics"


class MetricsApp:
    """A raw ASGI application answering ``GET``/``HEAD /metrics`` (404 elsewhere, 405 for other
    methods) with what ``source`` renders: a registry, or a coroutine that gathers the text."""

    def __init__(self, source: CollectorRegistry | Callable[[], Awaitable[bytes]]) -> None:
        self._source = source

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        method = scope["method"]
        if scope["path"] != PATH:
            status, body, headers = 404, b"not found: metrics are at /metrics\n", []
        elif method not in ("GET", "HEAD"):
            status, body, headers = 405, b"method not allowed\n", [(b"allow", b"GET, HEAD")]
        else:
            source = self._source
            if isinstance(source, CollectorRegistry):
                body = metrics.render(source)
            else:
                body = await source()
            status, headers = 200, []
        content_type = metrics.CONTENT_TYPE if status == 200 else "text/plain; charset=utf-8"
        headers += [
            (b"content-type", content_type.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if method == "HEAD" else body})


def metrics_socket(settings: ServerSettings) -> socket.socket | None:
    """The metrics listener, bound now (a busy port fails before models load); None when
    metrics are off."""
    if not settings.allow_metrics or settings.metrics_port == DISABLED_PORT:
        return None
    return listen(settings.host, settings.metrics_port)


class MetricsEndpoint:
    """Serves ``/metrics`` on ``sock``: for ``repository`` and its ``router``, or what the
    ``source`` coroutine gathers (the supervisor of several executors)."""

    def __init__(
        self,
        settings: ServerSettings,
        repository: ModelRepository | None,
        router: Router | None,
        sock: socket.socket,
        source: Callable[[], Awaitable[bytes]] | None = None,
    ) -> None:
        self._sock = sock
        app: MetricsApp
        if source is not None:
            app = MetricsApp(source)
        else:
            assert repository is not None, "a repository or a source"
            app = MetricsApp(metrics.registry(repository, router, gpu=settings.allow_gpu_metrics))
        self._server = HttpServer(app, graceful_timeout=1)
        self._task: asyncio.Task[None] | None = None

    @property
    def address(self) -> str:
        host, port = self._sock.getsockname()[:2]
        return f"metrics on http://{host}:{port}{PATH}"

    async def start(self) -> None:
        self._task = asyncio.create_task(self._server.serve([self._sock]), name="metrics")
        try:
            await self._server.wait_started(self._task)
        except OSError as exc:
            raise StartupError(f"metrics endpoint failed: {exc}") from None

    async def stop(self) -> None:
        self._server.shutdown()
        if self._task is not None:
            await asyncio.gather(self._task, return_exceptions=True)
        self.close()

    def close(self) -> None:
        """Release the listener (when start-up failed before :meth:`start`)."""
        self._sock.close()
