"""The ingress's data plane in Ray mode: the V2 operations of infermux's front ends, answered by
the models' Ray Serve replicas through deployment handles (no Ray proxy on the path).

A request's routing key (the ``routing_key`` parameter or the ``infermux-routing-key`` header)
is passed along for the affinity router (``affinity.py``). Ray's refusals become the V2 statuses
clients expect: a full queue (``ray_max_queued_requests``) is 503 like a full infermux queue, a
replica that died under a request is 503, an unknown model 404.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Mapping
from typing import Any

from ray import serve
from ray.exceptions import RayActorError
from ray.serve.exceptions import BackPressureError, DeploymentUnavailableError

from infermux import __version__
from infermux.dataplane.assembly import EXTENSIONS
from infermux.dataplane.plane import SERVER_NAME
from infermux.errors import (
    ErrorCode,
    FailureReason,
    InfermuxError,
    ModelLoadError,
    NotFoundError,
    RejectedError,
    UnavailableError,
    UnsupportedError,
)
from infermux.model_config import ModelConfig
from infermux.observability.logs import log_settings, update_log_settings
from infermux.ray.deploy import DEPLOYMENT, Deployer, app_name
from infermux.routing.router import ROUTING_KEY_PARAMETER, TrafficReport
from infermux.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
)

logger = logging.getLogger(__name__)

STATUS_TTL_S = 1.0  # readiness reads Ray's application status at most this often


class RayDataPlane:
    """:class:`~infermux.dataplane.Operations` over Ray Serve deployments."""

    def __init__(self, deployer: Deployer, *, explicit: bool, name: str = SERVER_NAME) -> None:
        self._deployer = deployer
        self._explicit = explicit
        self._handles: dict[tuple[str, str], Any] = {}
        self._described: dict[tuple[str, str], tuple[ModelMetadata, ModelConfig]] = {}
        self._metadata = ServerMetadata(name, __version__, EXTENSIONS)
        self._shutting_down = False
        self._ready_at = 0.0
        self._ready = False

    # -- health and metadata ----------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    def begin_shutdown(self) -> None:
        self._shutting_down = True

    async def ready(self) -> bool:
        if self._shutting_down:
            return False
        if time.monotonic() - self._ready_at > STATUS_TTL_S:
            self._ready = await asyncio.to_thread(self._deployer.all_running)
            self._ready_at = time.monotonic()
        return self._ready

    async def model_ready(self, name: str, version: str = "") -> bool:
        if name not in self._deployer.deployed:
            return False
        try:
            return bool(await self._handle(name, "ready").remote(version))
        except Exception:
            return False

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return (await self._describe(name, version))[0]

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        return (await self._describe(name, version))[1]

    async def _describe(self, name: str, version: str) -> tuple[ModelMetadata, ModelConfig]:
        key = (name, version)
        if key not in self._described:
            reply = await self._call(name, "describe", version)
            self._described[key] = (reply[1], reply[2])
        return self._described[key]

    # -- inference --------------------------------------------------------------------------------

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        # One response, final: decoupled models are refused at load in this mode
        # by Ray replicas (dataplane/assembly.py says why), so every model served here answers once.
        yield await self.infer(request)

    async def infer(self, request: InferRequest) -> InferResponse:
        key = request.parameters.get(ROUTING_KEY_PARAMETER)
        reply = await self._call(
            request.model_name, "infer", request, routing_key=key if isinstance(key, str) else ""
        )
        response: InferResponse = reply[1]
        return response

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        """Statistics of one replica per model (Ray has no call to every replica of a
        deployment; ``docs/scale-out.md``)."""
        names = [name] if name else sorted(self._deployer.deployed)
        stats: list[ModelStats] = []
        for model in names:
            stats.extend((await self._call(model, "statistics", version))[1])
        return stats

    async def _call(self, name: str, method: str, *args: Any, **kwargs: Any) -> tuple[Any, ...]:
        if name not in self._deployer.deployed:
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        try:
            reply: tuple[Any, ...] = await self._handle(name, method).remote(*args, **kwargs)
        except BackPressureError:
            raise RejectedError(
                f"model '{name}': every replica is busy and its queue is full "
                "(ray_max_queued_requests)"
            ) from None
        except (RayActorError, DeploymentUnavailableError) as exc:
            raise UnavailableError(
                f"model '{name}': the replica serving this request is gone ({type(exc).__name__})"
            ) from None
        if reply[0] == "error":
            _, code, reason, message = reply
            error = InfermuxError(message, ErrorCode(code))
            error.reason = FailureReason(reason)
            raise error
        return reply

    def _handle(self, name: str, method: str) -> Any:
        # One handle per (model, method), kept: ``handle.method`` would build a new handle
        # object on every request.
        handle = self._handles.get((name, method))
        if handle is None:
            base = serve.get_deployment_handle(DEPLOYMENT, app_name(name))
            handle = self._handles[(name, method)] = base.options(method_name=method)
        return handle

    # -- model repository -------------------------------------------------------------------------

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        rows = await asyncio.to_thread(self._deployer.index)
        return [r for r in rows if r.state == "READY"] if ready_only else rows

    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        self._check_explicit("load")
        if files:  # the replicas read their model from the repository
            raise UnsupportedError(
                f"failed to load '{name}': override files are not supported with --ray yet"
            )
        try:
            await asyncio.to_thread(self._deployer.deploy, name, config_override)
        except InfermuxError as exc:
            if exc.message.startswith("failed to load"):
                raise
            # Triton's wording, which clients look for, with infermux's reason after it.
            raise ModelLoadError(f"failed to load '{name}': {exc}", exc.code) from exc
        finally:
            self._forget(name)

    async def unload_model(self, name: str) -> None:
        self._check_explicit("unload")
        await asyncio.to_thread(self._deployer.undeploy, name)
        self._forget(name)

    async def redeploy(self, name: str) -> None:
        """Roll ``name``'s replicas to its current files (poll mode)."""
        await asyncio.to_thread(self._deployer.deploy, name)
        self._forget(name)

    def _forget(self, name: str) -> None:
        for key in [k for k in self._handles if k[0] == name]:
            del self._handles[key]
        for key in [k for k in self._described if k[0] == name]:
            del self._described[key]

    def _check_explicit(self, what: str) -> None:
        if not self._explicit:
            raise UnsupportedError(
                f"explicit model {what} is not allowed unless --model-control-mode=explicit"
            )

    # -- not offered in Ray mode ------------------------------------------------------------------

    async def traffic(self, name: str) -> TrafficReport:
        raise _not_in_ray("traffic policies")

    async def set_traffic(self, name: str, policy: str | None) -> None:
        raise _not_in_ray("traffic policies")

    async def promote(self, name: str, version: int) -> None:
        raise _not_in_ray("traffic policies")

    async def rollback(self, name: str) -> None:
        raise _not_in_ray("traffic policies")

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        raise _not_in_ray("client shared memory")

    async def shm_unregister(self, name: str = "") -> None:
        raise _not_in_ray("client shared memory")

    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        return []

    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        raise _not_in_ray("client shared memory")

    async def cuda_shm_unregister(self, name: str = "") -> None:
        raise _not_in_ray("client shared memory")

    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return []

    async def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        # The ingress process's own logging; replicas log as their deployment started them.
        return dict(update_log_settings(changes) if changes else log_settings())

    async def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        raise _not_in_ray("trace settings")


def _not_in_ray(what: str) -> UnsupportedError:
    return UnsupportedError(
        f"{what} are not served with --ray: replicas run on other machines (set them in the "
        "model's config and let the deploy roll)"
    )
