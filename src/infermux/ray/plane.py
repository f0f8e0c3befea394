"""The ingress's data plane in Ray mode: the V2 operations of infermux's front ends, answered by
the models' Ray Serve replicas through deployment handles (no Ray proxy on the path).

A request's routing key (the ``routing_key`` parameter or the ``infermux-routing-key`` header)
is passed along for the affinity router (``affinity.py``). Ray's refusals become the V2 statuses
clients expect: a full queue (``ray_max_queued_requests``) is 503 like a full infermux queue, a
replica that died under a request is 503, an unknown model 404.

A decoupled model's requests are streamed from its replica (``streams.py``): responses are
yielded as they arrive, within a credit window, and a reader that leaves cancels the request
in the replica (Ray cancels the replica's generator), where the model sees it cancelled.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

import ray
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
from infermux.ray.streams import StreamCredits, Taken
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
        self._credits: Any = None  # the StreamCredits actor, made with the first stream

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
        config = await self.model_config(request.model_name, request.model_version)
        if not config.decoupled:
            yield await self.infer(request)
            return
        if self._credits is None:
            # Each stalled stream's replica holds one wait() in it: room for very many.
            actor = ray.remote(StreamCredits).options(num_cpus=0, max_concurrency=100_000)
            self._credits = actor.remote()
        stream = uuid.uuid4().hex
        taken = Taken(self._credits, stream)
        handle = self._handle(request.model_name, "infer_stream", stream=True)
        key = request.parameters.get(ROUTING_KEY_PARAMETER)
        replies = handle.remote(
            request,
            routing_key=key if isinstance(key, str) else "",
            stream=stream,
            credits=self._credits,
        )
        ended = False
        try:
            while True:
                reply = await self._next(request.model_name, replies)
                if reply is None:
                    ended = True
                    return
                response: InferResponse = _unwrap(reply)[1]
                taken.took()
                yield response
                if response.final:
                    ended = True
                    return
        except InfermuxError:
            ended = True  # the replica's stream is over: it failed
            raise
        finally:
            taken.close()
            if not ended:  # the reader left: Ray cancels the replica's generator
                replies.cancel()

    async def _next(self, name: str, replies: Any) -> tuple[Any, ...] | None:
        """The next item of a streaming call (None at its end), Ray's failures translated."""
        try:
            reply: tuple[Any, ...] = await replies.__anext__()
        except StopAsyncIteration:
            return None
        except Exception as exc:
            raise _translated(name, exc) from None
        return reply

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
        except Exception as exc:
            raise _translated(name, exc) from None
        return _unwrap(reply)

    def _handle(self, name: str, method: str, *, stream: bool = False) -> Any:
        # One handle per (model, method), kept: ``handle.method`` would build a new handle
        # object on every request.
        handle = self._handles.get((name, method))
        if handle is None:
            base = serve.get_deployment_handle(DEPLOYMENT, app_name(name))
            handle = self._handles[(name, method)] = base.options(method_name=method, stream=stream)
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


def _translated(name: str, exc: Exception) -> Exception:
    """Ray's refusals as the V2 statuses clients expect; anything else as it is."""
    if isinstance(exc, BackPressureError):
        return RejectedError(
            f"model '{name}': every replica is busy and its queue is full (ray_max_queued_requests)"
        )
    if isinstance(exc, (RayActorError, DeploymentUnavailableError)):
        return UnavailableError(
            f"model '{name}': the replica serving this request is gone ({type(exc).__name__})"
        )
    return exc


def _unwrap(reply: tuple[Any, ...]) -> tuple[Any, ...]:
    """A replica's tagged answer; raises the error it carries."""
    if reply[0] == "error":
        _, code, reason, message = reply
        error = InfermuxError(message, ErrorCode(code))
        error.reason = FailureReason(reason)
        raise error
    return reply


def _not_in_ray(what: str) -> UnsupportedError:
    return UnsupportedError(
        f"{what} are not served with --ray: replicas run on other machines (set them in the "
        "model's config and let the deploy roll)"
    )
