"""The data plane a server's settings describe, with its repository (one place for both the
in-process server and the executor process to build it the same way)."""

from __future__ import annotations

from infermux import __version__
from infermux.backends import BackendRegistry
from infermux.repository import ONLY, ControlMode, LoadObserver, ModelRepository, Shard
from infermux.runtime import COMPLETIONS
from infermux.settings import ServerSettings
from infermux.types import ServerMetadata

from .cuda_shared_memory import CudaSharedMemoryRegistry
from .inputs import InputLimits
from .plane import DataPlane
from .shared_memory import SharedMemoryRegistry

# Only what is really served is announced; perf_analyzer and clients key behaviour off this list,
# and tests/unit/dataplane/test_extensions.py calls each one's endpoint. schedule_policy: the
# request parameters priority and timeout (scheduling/queue.py); trace: the settings of
# observability/trace_settings.py; classification: dataplane/classification.py.
EXTENSIONS = (
    "binary_tensor_data",
    "classification",
    "logging",
    "model_configuration",
    "model_repository",
    "parameters",
    "schedule_policy",
    "statistics",
    "trace",
)
SHM_EXTENSIONS = ("system_shared_memory", "cuda_shared_memory")


def extensions(settings: ServerSettings) -> tuple[str, ...]:
    return EXTENSIONS + (SHM_EXTENSIONS if settings.allow_client_shm else ())


def server_metadata(settings: ServerSettings) -> ServerMetadata:
    """What ``GET /v2`` answers for these settings (front-end processes answer it themselves)."""
    return ServerMetadata(settings.server_name, __version__, extensions(settings))


def build_repository(
    settings: ServerSettings,
    observer: LoadObserver | None = None,
    shard: Shard = ONLY,
) -> ModelRepository:
    """The repository of ``settings`` (every process that serves models builds it here;
    decoupled models are served by each: their streams cross processes too)."""
    return ModelRepository(
        settings.model_repositories,
        BackendRegistry(),
        control_mode=ControlMode(settings.model_control_mode),
        startup_models=settings.load_models,
        poll_seconds=settings.repository_poll_secs,
        observer=observer,
        histograms=settings.allow_metrics,
        shard=shard,
        execution_timeout_ms=settings.execution_timeout_ms,
        load_concurrency=settings.model_load_threads,
        exit_on_error=settings.exit_on_error,
        auto_complete=settings.auto_complete_config,
    )


def build_dataplane(settings: ServerSettings, repository: ModelRepository) -> DataPlane:
    """The data plane over ``repository``; its models' own requests (BLS) go through it too."""
    COMPLETIONS.spin_seconds = settings.gpu_completion_spin_us / 1e6  # the process's GPU batches
    plane = DataPlane(
        repository,
        version=__version__,
        name=settings.server_name,
        extensions=extensions(settings),
        strict_readiness=settings.strict_readiness,
        log_requests=settings.log_verbose > 1,
        shared_memory=SharedMemoryRegistry(
            enabled=settings.allow_client_shm, max_regions=settings.max_shm_regions
        ),
        cuda_shared_memory=CudaSharedMemoryRegistry(
            enabled=settings.allow_client_shm, max_regions=settings.max_shm_regions
        ),
        limits=InputLimits(settings.max_input_elements, settings.max_bytes_element_size),
    )
    repository.server.attach(plane.infer, plane.infer_stream)
    return plane
