"""The V2 operations, independent of any transport.

Front ends decode the wire format into :mod:`infermux.types`, call one method here and encode the
answer; everything they need is here, so HTTP, gRPC and any later front end behave identically.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from infermux.errors import InvalidArgumentError
from infermux.model_config import ModelConfig
from infermux.repository import ModelRepository
from infermux.types import (
    InferRequest,
    InferResponse,
    ModelMetadata,
    RepositoryIndexEntry,
    ServerMetadata,
    TensorMetadata,
)

from .validation import to_model_request, to_output_tensors

logger = logging.getLogger(__name__)

SERVER_NAME = "infermux"


class DataPlane:
    """Every V2 operation over one :class:`ModelRepository`."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        version: str,
        extensions: Sequence[str] = (),
        strict_readiness: bool = True,
    ) -> None:
        self._repository = repository
        self._metadata = ServerMetadata(SERVER_NAME, version, tuple(extensions))
        self._strict = strict_readiness
        self._shutting_down = False

    # -- health and metadata ----------------------------------------------------------------------

    def live(self) -> bool:
        """The server process is up and able to answer."""
        return True

    def ready(self) -> bool:
        """Ready for inference: not shutting down and, with strict readiness, every model ready."""
        if self._shutting_down:
            return False
        return self._repository.all_ready() if self._strict else True

    def begin_shutdown(self) -> None:
        """Report not-ready from now on so that load balancers stop sending traffic."""
        self._shutting_down = True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    def model_ready(self, name: str, version: str = "") -> bool:
        return self._repository.is_ready(name, version)

    def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._repository.get(name, version).config

    def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
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

    # -- inference --------------------------------------------------------------------------------

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, schedule and run one request; raises an :class:`InfermuxError` on failure."""
        model = self._repository.get(request.model_name, request.model_version)
        model_request = to_model_request(model.config, request)
        result = await model.scheduler.submit(model_request)
        outputs = to_output_tensors(model.config, model_request, result)
        return InferResponse(
            model_name=model.name,
            model_version=str(model.version),
            outputs=outputs,
            id=request.id,
        )

    # -- repository -------------------------------------------------------------------------------

    def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        return self._repository.index(ready_only=ready_only)

    async def load_model(self, name: str, *, config_override: str | None = None) -> None:
        """Load or reload ``name`` (explicit control mode only)."""
        self._repository.check_explicit("load")
        if config_override is not None and not config_override.strip():
            raise InvalidArgumentError("parameter 'config' must be a non-empty ModelConfig JSON")
        await self._repository.load(name, config_override)

    async def unload_model(self, name: str) -> None:
        """Unload ``name`` after its admitted requests finish (explicit control mode only)."""
        self._repository.check_explicit("unload")
        await self._repository.unload(name)
