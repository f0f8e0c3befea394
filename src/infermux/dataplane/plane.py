"""The V2 operations, independent of any transport.

Front ends decode the wire format into :mod:`infermux.types`, call one method here and encode the
answer; everything they need is here, so HTTP, gRPC and any later front end behave identically.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from infermux.errors import InvalidArgumentError
from infermux.model_config import ModelConfig
from infermux.observability.logs import log_settings, update_log_settings
from infermux.observability.tracing import TRACING
from infermux.repository import ModelRepository
from infermux.routing.policy import parse_policy
from infermux.routing.router import Router, TrafficReport
from infermux.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
    TensorMetadata,
)

from .cuda_shared_memory import CudaSharedMemoryRegistry
from .inference import Inference
from .inputs import InputLimits
from .regions import Regions
from .shared_memory import SharedMemoryRegistry

SERVER_NAME = "infermux"


class DataPlane:
    """Every V2 operation over one :class:`ModelRepository`."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        version: str,
        name: str = SERVER_NAME,
        extensions: Sequence[str] = (),
        strict_readiness: bool = True,
        log_requests: bool = False,
        shared_memory: SharedMemoryRegistry | None = None,
        cuda_shared_memory: CudaSharedMemoryRegistry | None = None,
        router: Router | None = None,
        limits: InputLimits | None = None,
    ) -> None:
        self._repository = repository
        self.router = router or Router(repository)
        self._shm = shared_memory or SharedMemoryRegistry(enabled=False)
        self._cuda = cuda_shared_memory or CudaSharedMemoryRegistry(enabled=False)
        self._regions = Regions(self._shm, self._cuda)
        self._inference = Inference(
            self.router,
            self._regions,
            self._shm,
            limits or InputLimits(),
            log_requests=log_requests,
        )
        self._metadata = ServerMetadata(name, version, tuple(extensions))
        self._strict = strict_readiness
        self._shutting_down = False
        self._on_shm_forgotten: list[Callable[[str], Awaitable[None]]] = []

    # -- health and metadata ----------------------------------------------------------------------

    def live(self) -> bool:
        """The server process is up and able to answer."""
        return True

    async def ready(self) -> bool:
        """Ready for inference: not shutting down and, with strict readiness, every model ready."""
        if self._shutting_down:
            return False
        return self._repository.all_ready() if self._strict else True

    def begin_shutdown(self) -> None:
        """Report not-ready from now on so that load balancers stop sending traffic."""
        self._shutting_down = True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    async def model_ready(self, name: str, version: str = "") -> bool:
        return self._repository.is_ready(name, version)

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._repository.get(name, version).config

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        config = self._repository.get(name, version).config
        versions = self._repository.ready_versions(name)
        if version:
            versions = [int(version)]
        return ModelMetadata(
            name=config.name,
            versions=tuple(str(v) for v in versions),
            platform=config.platform or config.backend,
            inputs=tuple(
                TensorMetadata(t.name, t.datatype, config.full_shape(t)) for t in config.inputs
            ),
            outputs=tuple(
                TensorMetadata(t.name, t.datatype, config.full_shape(t)) for t in config.outputs
            ),
        )

    # -- inference (dataplane/inference.py) ---------------------------------------------------

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, schedule and run one request; raises an :class:`InfermuxError` on failure."""
        return await self._inference.infer(request)

    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses to one request, in order, the last one ``final``
        (:meth:`Inference.infer_stream <infermux.dataplane.inference.Inference.infer_stream>`)."""
        return self._inference.infer_stream(request)

    async def infer_many(
        self,
        request: InferRequest,
        rows: Sequence[int],
        *,
        inputs_apart: bool = False,
        outputs_apart: bool = False,
    ) -> InferResponse:
        """A front end's micro-batch of ``len(rows)`` requests, run as one (see
        :meth:`Inference.infer_many <infermux.dataplane.inference.Inference.infer_many>`)."""
        return await self._inference.infer_many(
            request, rows, inputs_apart=inputs_apart, outputs_apart=outputs_apart
        )

    # -- statistics -------------------------------------------------------------------------------

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        """Statistics of every served version of ``name`` (of every model when ``name`` is "")."""
        if not name:
            if version:
                raise InvalidArgumentError("a model version needs a model name")
            models = self._repository.served()
        elif version:
            models = [self._repository.get(name, version)]
        else:
            self._repository.get(name)  # raises the precise not-found/unavailable error
            models = [m for m in self._repository.served() if m.name == name]
        return [m.stats.snapshot() for m in models]

    # -- system shared memory ---------------------------------------------------------------------

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._regions.check_free(name, cuda=False)
        self._shm.register(name, key, offset, byte_size)

    async def shm_unregister(self, name: str = "") -> None:
        self._shm.unregister(name)
        for hook in self._on_shm_forgotten:
            await hook(name)

    def on_shm_forgotten(self, hook: Callable[[str], Awaitable[None]]) -> None:
        """Await ``hook(name)`` after every system-region unregistration ("": all), before it
        is answered: front ends that read regions themselves drop theirs in it."""
        self._on_shm_forgotten.append(hook)

    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        return self._shm.status(name)

    # -- CUDA shared memory -----------------------------------------------------------------------

    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self._regions.check_free(name, cuda=True)
        self._cuda.register(name, raw_handle, device_id, byte_size)

    async def cuda_shm_unregister(self, name: str = "") -> None:
        self._cuda.unregister(name)

    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return self._cuda.status(name)

    # -- logging extension ------------------------------------------------------------------------

    async def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """This process's log settings (Triton's logging extension), after applying
        ``changes`` when given: all of them or, when one is refused, none."""
        if changes:
            self.apply_log_changes(changes)
        return dict(log_settings())

    def apply_log_changes(self, changes: dict[str, Any]) -> None:
        """Apply log setting ``changes`` to this process (from a client, or from the
        supervisor when a client changed them through another process)."""
        verbose = update_log_settings(changes)["log_verbose_level"]
        self._inference.log_requests = int(verbose) > 1  # as --log-verbose 2: a line per request

    # -- trace extension --------------------------------------------------------------------------

    async def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The trace settings of ``model`` (global when ""), after applying ``changes`` when
        given (Triton's trace extension, ``observability/trace_settings.py``)."""
        if model and not self._repository.is_ready(model, ""):
            raise InvalidArgumentError(f"Request for unknown model : {model}")
        return dict(TRACING.trace_settings(model, changes))

    def close(self) -> None:
        """Release what the data plane holds itself (shared-memory mappings, shadow runs)."""
        self._inference.close()
        self._shm.close()
        self._cuda.close()

    # -- traffic policies (admin) -----------------------------------------------------------------

    async def traffic(self, name: str) -> TrafficReport:
        """The traffic policy in force for ``name``, its served versions and shadow figures."""
        return self.router.report(name)

    async def set_traffic(self, name: str, policy: str | None) -> None:
        """Put a policy (JSON) in force for ``name``; None returns to the config's."""
        self.router.set_policy(name, parse_policy(policy) if policy is not None else None)

    async def promote(self, name: str, version: int) -> None:
        """Send all of ``name``'s traffic to ``version`` from the next request on."""
        self.router.promote(name, version)

    async def rollback(self, name: str) -> None:
        """Undo the last traffic policy change of ``name``."""
        self.router.rollback(name)

    # -- repository -------------------------------------------------------------------------------

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        return self._repository.index(ready_only=ready_only)

    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load or reload ``name`` (explicit control mode only), from ``files`` when given
        (see :meth:`ModelRepository.load <infermux.repository.ModelRepository.load>`)."""
        self._repository.check_explicit("load")
        if config_override is not None and not config_override.strip():
            raise InvalidArgumentError(
                f"failed to load '{name}': parameter 'config' must be a non-empty ModelConfig JSON"
            )
        await self._repository.load(name, config_override, files)

    async def unload_model(self, name: str) -> None:
        """Unload ``name`` after its admitted requests finish (explicit control mode only)."""
        self._repository.check_explicit("unload")
        await self._repository.unload(name)
