"""The ``infermux serve`` flags (``tritonserver``'s names) and their parsing into settings."""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from infermux.cli.http_limit_options import add_http_limit_arguments, http_limits
from infermux.cli.option_types import (
    add_bool,
    non_negative_int,
    port,
    positive,
    verbosity,
)
from infermux.cli.process_options import add_process_arguments
from infermux.cli.triton_flags import add_triton_arguments, triton_settings
from infermux.settings import (
    CHANNEL_POLL_MIN_CORES,
    DEFAULT_CHANNEL_POLL_US,
    DEFAULT_GPU_COMPLETION_SPIN_US,
    DEFAULT_GRPC_MAX_MESSAGE_SIZE,
    DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT,
    DEFAULT_HOST,
    DEFAULT_MAX_BYTES_ELEMENT_SIZE,
    DEFAULT_MAX_INPUT_ELEMENTS,
    DEFAULT_MAX_INPUT_SIZE,
    DEFAULT_SERVER_NAME,
    DEFAULT_TRACE_URL,
    DISABLED_PORT,
    ServerSettings,
    auto_frontends,
    builtin_repositories,
    builtin_repository,
    default_channel_poll_us,
    parse_trace_config,
)


class Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:
        # One line, as the CLI contract promises; the full usage is one --help away.
        self.exit(2, f"{self.prog}: error: {message} (see --help)\n")


SERVE_HELP = "serve a model repository over the KServe V2 protocol"


def build_serve_parser() -> argparse.ArgumentParser:
    """The ``infermux serve`` parser on its own."""
    return add_serve_arguments(Parser(prog="infermux serve", description=SERVE_HELP))


def add_serve_arguments(serve: argparse.ArgumentParser) -> argparse.ArgumentParser:
    serve.epilog = (
        f"Without --model-repository, serves the built-in examples ({builtin_repository()})."
    )
    serve.add_argument(
        "--model-repository",
        "--model-store",
        action="append",
        type=Path,
        metavar="DIR",
        help="model repository directory (repeatable); default: the built-in examples",
    )
    serve.add_argument(
        "--host",
        help=f"address to bind (default {DEFAULT_HOST}: local only; use 0.0.0.0 to expose)",
    )
    serve.add_argument(
        "--server-name",
        "--id",
        default=DEFAULT_SERVER_NAME,
        metavar="NAME",
        help=f"the name GET /v2 and gRPC ServerMetadata answer (default {DEFAULT_SERVER_NAME}; "
        "'triton' for tools that check it)",
    )
    serve.add_argument(
        "--http-port", type=port, default=8000, help="HTTP port (default 8000; 0: any; -1: none)"
    )
    serve.add_argument(
        "--grpc-port", type=port, default=8001, help="gRPC port (default 8001; 0: any; -1: none)"
    )
    serve.add_argument(
        "--http-uds", type=Path, metavar="PATH", help="also serve HTTP on this unix socket"
    )
    serve.add_argument(
        "--grpc-uds", type=Path, metavar="PATH", help="also serve gRPC on this unix socket"
    )
    serve.add_argument(
        "--tls-cert",
        type=Path,
        metavar="PEM",
        help="serve HTTPS and gRPC over TLS with this certificate (chain); needs --tls-key",
    )
    serve.add_argument(
        "--tls-key", type=Path, metavar="PEM", help="the unencrypted private key of --tls-cert"
    )
    serve.add_argument(
        "--auth-token-file",
        type=Path,
        metavar="FILE",
        help="require 'Authorization: Bearer <token in FILE>' (HTTP header or gRPC metadata) "
        "for every endpoint but health; admin endpoints are then refused unless "
        "--admin-token-file is given too",
    )
    serve.add_argument(
        "--admin-token-file",
        type=Path,
        metavar="FILE",
        help="require this token for admin endpoints (model load/unload, shared-memory "
        "registration, traffic policy changes)",
    )
    serve.add_argument(
        "--max-shm-regions",
        type=positive(int),
        default=256,
        metavar="N",
        help="client shared-memory regions registered at once, system and CUDA each (default 256)",
    )
    serve.add_argument(
        "--max-input-elements",
        type=positive(int),
        default=DEFAULT_MAX_INPUT_ELEMENTS,
        metavar="N",
        help=f"elements one input tensor may hold, whatever the transport (default "
        f"{DEFAULT_MAX_INPUT_ELEMENTS})",
    )
    serve.add_argument(
        "--max-bytes-element-size",
        type=positive(int),
        default=DEFAULT_MAX_BYTES_ELEMENT_SIZE,
        metavar="BYTES",
        help=f"largest element of a BYTES input (default {DEFAULT_MAX_BYTES_ELEMENT_SIZE})",
    )
    add_bool(serve, "--allow-http", True, "serve the HTTP front end")
    add_bool(serve, "--allow-grpc", True, "serve the gRPC front end")
    serve.add_argument(
        "--grpc-max-message-size",
        type=positive(int),
        default=DEFAULT_GRPC_MAX_MESSAGE_SIZE,
        metavar="BYTES",
        help=f"largest gRPC message received; larger gets RESOURCE_EXHAUSTED (default "
        f"{DEFAULT_GRPC_MAX_MESSAGE_SIZE}, as --http-max-input-size)",
    )
    serve.add_argument(
        "--grpc-max-stream-in-flight",
        type=positive(int),
        default=DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT,
        metavar="N",
        help="requests of one ModelStreamInfer stream read and not yet answered; the stream is "
        f"not read further until one is (default {DEFAULT_GRPC_MAX_STREAM_IN_FLIGHT})",
    )
    serve.add_argument(
        "--metrics-port",
        type=port,
        default=8002,
        help="Prometheus metrics port, at /metrics (default 8002; 0: any; -1: none)",
    )
    add_bool(serve, "--allow-metrics", True, "serve Prometheus metrics")
    add_bool(serve, "--allow-gpu-metrics", True, "include GPU utilisation, memory and power")
    serve.add_argument(
        "--gpu-completion-spin-us",
        type=non_negative_int,
        default=DEFAULT_GPU_COMPLETION_SPIN_US,
        metavar="US",
        help="a GPU batch launched while no other is in flight is polled by the event loop for "
        "up to this long, instead of waking the loop from a sleep when it ends: lower latency "
        f"at low load for CPU while it polls (default {DEFAULT_GPU_COMPLETION_SPIN_US}; 0: never)",
    )
    serve.add_argument(
        "--channel-poll-us",
        type=non_negative_int,
        default=None,
        metavar="US",
        help="with --frontends > 1, at the lowest load (one request at a time) a front end polls "
        "its channel for the answer, and the executor every channel for the next request, for "
        "up to this long instead of sleeping until woken: lower latency at c=1 for CPU while "
        f"they poll (default {DEFAULT_CHANNEL_POLL_US} with {CHANNEL_POLL_MIN_CORES} cores or "
        "more, else 0: never)",
    )
    serve.add_argument(
        "--trace-config",
        action="append",
        default=[],
        metavar="[MODE,]SETTING=VALUE",
        help="OpenTelemetry tracing, as tritonserver's: mode=opentelemetry turns it on; "
        "rate=N traces 1 request in N (default 1000); opentelemetry,url=URL is the OTLP/HTTP "
        f"endpoint (default {DEFAULT_TRACE_URL}); opentelemetry,resource=KEY=VALUE; "
        "level=OFF|TIMESTAMPS (repeatable)",
    )
    serve.add_argument(
        "--model-control-mode",
        type=str.lower,
        choices=("none", "poll", "explicit"),
        default="none",
        help="none: load all at start; poll: also reload on change; explicit: load via API",
    )
    serve.add_argument(
        "--repository-poll-secs",
        type=positive(float),
        default=15.0,
        metavar="SECONDS",
        help="poll interval in poll mode (default 15)",
    )
    serve.add_argument(
        "--load-model",
        action="append",
        default=[],
        metavar="NAME",
        help="in explicit mode, model to load at startup (repeatable; '*' loads all)",
    )
    add_bool(serve, "--strict-readiness", True, "ready only when every model is ready")
    add_bool(serve, "--allow-client-shm", False, "allow clients to register shared memory")
    serve.add_argument(
        "--log-verbose",
        type=verbosity,
        nargs="?",
        const=1,
        default=0,
        metavar="LEVEL",
        help="verbose logging level (0 = off; 1: debug, failed requests; 2: every request)",
    )
    serve.add_argument(
        "--log-format",
        choices=("default", "ISO8601", "json"),
        default="default",
        help="log lines as text (default), text with ISO 8601 times, or JSON objects",
    )
    serve.add_argument(
        "--http-max-input-size",
        type=positive(int),
        default=DEFAULT_MAX_INPUT_SIZE,
        metavar="BYTES",
        help=f"largest HTTP request body accepted (default {DEFAULT_MAX_INPUT_SIZE})",
    )
    add_process_arguments(serve)
    serve.add_argument(
        "--exit-timeout-secs",
        type=non_negative_int,
        default=30,
        metavar="SECONDS",
        help="how long shutdown waits for in-flight requests (default 30)",
    )
    serve.add_argument(
        "--ray",
        dest="ray_address",
        default="",
        metavar="ADDRESS",
        help="serve the models as Ray Serve deployments on the Ray cluster at ADDRESS (auto, "
        "HOST:PORT) with this process's HTTP/gRPC front ends as the ingress; needs "
        "pip install 'infermux[ray]' (docs/scale-out.md)",
    )
    serve.add_argument(
        "--execution-timeout-ms",
        type=non_negative_int,
        default=0,
        metavar="MS",
        help="bound on one model execution (default 0: none; a model's execution_timeout_ms "
        "parameter overrides it); an instance that overruns fails its batch with 503 and is "
        "replaced",
    )
    add_http_limit_arguments(serve)
    add_triton_arguments(serve)
    return serve


def parse_settings(argv: Sequence[str]) -> ServerSettings:
    """Parse ``serve`` flags into settings; invalid combinations exit 2 with one line."""
    return parse_serve(argv)[0]


def parse_serve(argv: Sequence[str]) -> tuple[ServerSettings, list[str]]:
    """:func:`parse_settings`, and one warning line per tritonserver flag that has no effect
    (to be logged once logging is set up, so that they follow ``--log-format``)."""
    serve_parser = build_serve_parser()
    args = serve_parser.parse_args(argv)
    if args.load_model and args.model_control_mode != "explicit":
        serve_parser.error("--load-model requires --model-control-mode=explicit")
    if (args.tls_cert is None) != (args.tls_key is None):
        serve_parser.error("--tls-cert and --tls-key go together: a certificate and its key")
    ports = [p for p in (args.http_port, args.grpc_port, args.metrics_port) if p > 0]
    if len(ports) != len(set(ports)):
        serve_parser.error("--http-port, --grpc-port and --metrics-port must differ")
    for front, number, uds in (
        ("http", args.http_port, args.http_uds),
        ("grpc", args.grpc_port, args.grpc_uds),
    ):
        if number == DISABLED_PORT and uds is None:
            serve_parser.error(f"--{front}-port -1 needs --{front}-uds (nothing to listen on)")
    if args.http_uds is not None and args.http_uds == args.grpc_uds:
        serve_parser.error("--http-uds and --grpc-uds must differ")
    try:
        trace = parse_trace_config(args.trace_config)
    except ValueError as exc:
        serve_parser.error(f"--trace-config {exc}")
    repositories = tuple(args.model_repository or builtin_repositories())
    for repo in repositories:
        if not repo.is_dir():
            serve_parser.error(f"--model-repository {repo}: not a directory")
    triton, warnings = triton_settings(args, serve_parser.error)
    settings = ServerSettings(
        model_repositories=repositories,
        server_name=args.server_name,
        http_port=args.http_port,
        grpc_port=args.grpc_port,
        metrics_port=args.metrics_port,
        model_control_mode=args.model_control_mode,
        repository_poll_secs=args.repository_poll_secs,
        load_models=tuple(args.load_model),
        strict_readiness=args.strict_readiness,
        allow_client_shm=args.allow_client_shm,
        log_verbose=args.log_verbose,
        log_format=args.log_format,
        allow_metrics=args.allow_metrics,
        allow_gpu_metrics=args.allow_gpu_metrics,
        gpu_completion_spin_us=args.gpu_completion_spin_us,
        channel_poll_us=(
            default_channel_poll_us() if args.channel_poll_us is None else args.channel_poll_us
        ),
        trace=trace,
        http_max_input_size=args.http_max_input_size,
        http_limits=http_limits(args),
        exit_timeout_secs=args.exit_timeout_secs,
        execution_timeout_ms=args.execution_timeout_ms,
        ray_address=args.ray_address,
        allow_http=args.allow_http,
        allow_grpc=args.allow_grpc,
        http_uds=args.http_uds,
        tls_cert=args.tls_cert,
        tls_key=args.tls_key,
        auth_token_file=args.auth_token_file,
        admin_token_file=args.admin_token_file,
        max_shm_regions=args.max_shm_regions,
        max_input_elements=args.max_input_elements,
        max_bytes_element_size=args.max_bytes_element_size,
        grpc_uds=args.grpc_uds,
        grpc_max_message_size=args.grpc_max_message_size,
        grpc_max_stream_in_flight=args.grpc_max_stream_in_flight,
        frontends=args.frontends or auto_frontends(ipc_arena_mb=args.ipc_arena_mb),
        executors=args.executors,
        ipc_arena_mb=args.ipc_arena_mb,
        frontend_heartbeat_timeout_secs=args.frontend_heartbeat_timeout_secs,
        executor_heartbeat_timeout_secs=args.executor_heartbeat_timeout_secs,
        executor_ready_timeout_ms=args.executor_ready_timeout_ms,
    )
    return dataclasses.replace(settings, **triton), warnings
