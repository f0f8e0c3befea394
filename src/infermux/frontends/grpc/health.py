"""The standard ``grpc.health.v1.Health`` service, answered from the data plane's readiness.

Load balancers and Kubernetes' gRPC probes speak this service, not Triton's ``ServerReady``.
``Check`` asks the data plane each time (no state kept between calls can go stale, and a
front end's readiness already includes its executors'); ``Watch`` streams changes, found by
asking once a second while anybody watches. Both the whole server ("") and
``inference.GRPCInferenceService`` are SERVING exactly when the server is ready; any other
service name is NOT_FOUND (Check) or SERVICE_UNKNOWN (Watch), as the protocol says.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any

from grpc_health.v1 import health_pb2
from grpc_health.v1._async import HealthServicer

from infermux.dataplane import Operations

logger = logging.getLogger(__name__)

SERVICES = ("", "inference.GRPCInferenceService")
WATCH_POLL_S = 1.0

_SERVING = health_pb2.HealthCheckResponse.SERVING
_NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class Health(HealthServicer):  # type: ignore[misc]  # grpc_health's base class is untyped
    """``grpc.health.v1.Health`` over ``dataplane``'s readiness, for ``grpc.aio``."""

    def __init__(self, dataplane: Operations, *, poll_s: float = WATCH_POLL_S) -> None:
        super().__init__()
        self._dp = dataplane
        self._poll_s = poll_s
        self._watching = 0
        self._poller: asyncio.Task[None] | None = None

    async def refresh(self) -> None:
        """Set every service's status from the data plane's readiness now."""
        try:
            ready = await self._dp.ready()
        except Exception:  # an executor gone mid-question: not ready, as /v2/health/ready says
            logger.debug("readiness check failed", exc_info=True)
            ready = False
        for service in SERVICES:
            await self.set(service, _SERVING if ready else _NOT_SERVING)

    async def Check(self, request: Any, context: Any) -> Any:
        await self.refresh()
        return await super().Check(request, context)

    async def Watch(self, request: Any, context: Any) -> None:
        await self.refresh()
        self._watching += 1
        if self._poller is None:
            self._poller = asyncio.create_task(self._poll())
        try:
            await super().Watch(request, context)
        finally:
            self._watching -= 1
            if self._watching == 0 and self._poller is not None:
                self._poller.cancel()
                self._poller = None

    async def stop(self) -> None:
        """NOT_SERVING from now on (the server is stopping), told to every watcher."""
        if self._poller is not None:
            self._poller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._poller
            self._poller = None
        await self.enter_graceful_shutdown()

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self._poll_s)
            await self.refresh()
