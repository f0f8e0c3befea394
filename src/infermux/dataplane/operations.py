"""The seam between front ends and whatever serves the V2 operations.

Front ends call these methods and nothing else. In one process :class:`~.plane.DataPlane`
implements them directly; with several front-end processes, :class:`~.remote.RemoteDataPlane`
implements them by forwarding each call to the executor process, which runs the one
``DataPlane`` that owns the models. Everything that may need the executor is ``async`` for that
reason; ``live`` and ``server_metadata`` are answered by the front end's own process.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Any, Protocol

from infermux.model_config import ModelConfig
from infermux.routing.router import TrafficReport
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


class Operations(Protocol):
    """Every V2 operation. Each method raises an :class:`~infermux.errors.InfermuxError` on
    failure (the front end only translates it into its transport's status)."""

    def live(self) -> bool: ...
    def server_metadata(self) -> ServerMetadata: ...
    async def ready(self) -> bool: ...
    async def model_ready(self, name: str, version: str = "") -> bool: ...
    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata: ...
    async def model_config(self, name: str, version: str = "") -> ModelConfig: ...
    async def infer(self, request: InferRequest) -> InferResponse: ...
    def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses to ``request`` in order, the last one ``final``: exactly one for most
        models; zero or more, then a final flag (maybe on an empty response), for a decoupled
        model, whose ``infer`` refuses it. Raises an InfermuxError when the request fails before
        it runs; later failures are responses with ``error`` set, and the stream may go on.
        Reading slowly holds the model back (bounded buffering); closing the iterator early
        gives the request up."""
        ...

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]: ...
    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]: ...
    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load or reload ``name``: with ``config_override`` (ModelConfig JSON) as its config,
        from ``files`` (path in the model directory -> content, Triton's ``file:`` override;
        needs ``config_override``) instead of its repository directory when given."""

    async def unload_model(self, name: str) -> None: ...
    async def traffic(self, name: str) -> TrafficReport: ...
    async def set_traffic(self, name: str, policy: str | None) -> None: ...
    async def promote(self, name: str, version: int) -> None: ...
    async def rollback(self, name: str) -> None: ...
    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None: ...
    async def shm_unregister(self, name: str = "") -> None: ...
    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]: ...
    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None: ...
    async def cuda_shm_unregister(self, name: str = "") -> None: ...
    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]: ...
    async def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]: ...
    async def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Triton's trace extension: the settings of ``model`` (the global ones when ""),
        after applying ``changes`` (name -> value as the client sent it, None clearing it)."""
