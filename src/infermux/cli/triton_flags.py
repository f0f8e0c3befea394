"""``tritonserver`` flags that ``infermux serve`` accepts so that a Triton user's launch script or
Helm chart runs unchanged (the table in docs/configuration.md).

Flags with an infermux meaning are aliases in ``serve_options.py`` (``--model-store``, ``--id``)
or land here in the same settings as infermux's own (``--http-address`` is ``--host``,
``--grpc-server-cert`` is ``--tls-cert`` for gRPC only). The others are in :data:`FOREIGN`: each
is parsed as tritonserver parses it (a bad value exits 2 naming the flag), then either accepted
with one warning naming it, or refused, naming it, where serving without it would change what
users rely on (forwarded headers, restricted APIs). A value that asks for what infermux does
anyway (``--reuse-http-port=false``) is accepted silently. No flag is ignored without a word.
"""

from __future__ import annotations

import argparse
import operator
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NoReturn

from infermux.cli.option_types import (
    add_bool,
    boolean,
    non_negative_int,
    positive,
)
from infermux.settings import DEFAULT_HOST, DEFAULT_MODEL_LOAD_THREADS

Error = Callable[[str], NoReturn]


def _setting(value: str) -> str:
    """``[NAME,]SETTING=VALUE`` (``--backend-config``, ``--host-policy``, ``--cache-config``)."""
    head, equals, given = value.partition("=")
    if not equals or not given or not head.rpartition(",")[2]:
        raise argparse.ArgumentTypeError(f"expected [NAME,]SETTING=VALUE, got '{value}'")
    return value


def _device_pair(kind: Callable[[str], Any]) -> Callable[[str], str]:
    """``DEVICE:VALUE`` (``--cuda-memory-pool-byte-size 0:67108864``)."""

    def parse(value: str) -> str:
        device, colon, given = value.partition(":")
        try:
            int(device)
            kind(given)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected DEVICE:VALUE, got '{value}'") from None
        if not colon:
            raise argparse.ArgumentTypeError(f"expected DEVICE:VALUE, got '{value}'")
        return value

    return parse


def _choice(*names: str) -> Callable[[str], str]:
    def parse(value: str) -> str:
        if value.lower() not in names:
            raise argparse.ArgumentTypeError(f"expected one of {', '.join(names)}, got '{value}'")
        return value.lower()

    return parse


def _text(value: str) -> str:
    return value


@dataclass(frozen=True)
class Foreign:
    """A tritonserver flag with no infermux meaning."""

    flag: str
    metavar: str
    parse: Callable[[str], Any]
    why: str
    """Why it has no effect (warned) or what to use instead (refused); completes the line."""
    action: Literal["warn", "refuse"] = "warn"
    same: Callable[[Any], bool] | None = None
    """Values (a bool, or the string given) that ask for what infermux does anyway: accepted
    without a word."""

    @property
    def dest(self) -> str:
        return "triton_" + self.flag.lstrip("-").replace("-", "_")


_off = operator.not_


def _is(expected: str) -> Callable[[str], bool]:
    return lambda given: given.lower() == expected


def _as_given(parse: Callable[[str], Any]) -> Callable[[str], Any]:
    """Check a value as tritonserver would, but keep it as written (warnings quote it)."""

    def check(value: str) -> str:
        parse(value)
        return value

    check.__name__ = getattr(parse, "__name__", "value")  # argparse names the type in errors
    return check


_GRPC_DEFAULTS = "gRPC's own defaults apply"

# fmt: off
FOREIGN: tuple[Foreign, ...] = (
    # Server, repository, backends
    Foreign("--backend-config", "[BACKEND,]SETTING=VALUE", _setting,
            "backends take their options from the model config's parameters (docs/backends.md)"),
    Foreign("--backend-directory", "DIR", _text, "backends are Python packages, not libraries"),
    Foreign("--repoagent-directory", "DIR", _text, "repository agents are not supported"),
    Foreign("--model-load-retry-count", "N", non_negative_int,
            "a failed load is not retried (load it again through the repository API)",
            same=_is("0")),
    Foreign("--model-namespacing", "BOOL", boolean,
            "a model name must be unique across the repositories", "refuse", same=_off),
    # HTTP and gRPC
    Foreign("--http-thread-count", "N", positive(int),
            "HTTP runs on each front-end process's event loop (see --frontends)"),
    Foreign("--reuse-http-port", "BOOL", boolean,
            "only infermux's own front-end processes share the port", same=_off),
    Foreign("--reuse-grpc-port", "BOOL", boolean,
            "only infermux's own front-end processes share the port", same=_off),
    Foreign("--http-header-forward-pattern", "REGEX", _text,
            "headers are not forwarded to models as request parameters", "refuse"),
    Foreign("--grpc-header-forward-pattern", "REGEX", _text,
            "metadata is not forwarded to models as request parameters", "refuse"),
    Foreign("--http-restricted-api", "APIS:KEY=VALUE", _text,
            "restrict admin APIs with --admin-token-file instead", "refuse"),
    Foreign("--grpc-restricted-protocol", "PROTOCOLS:KEY=VALUE", _text,
            "restrict admin APIs with --admin-token-file instead", "refuse"),
    Foreign("--grpc-use-ssl-mutual", "BOOL", boolean,
            "client certificates are not verified (terminate mutual TLS in a proxy, or use "
            "--auth-token-file)", "refuse", same=_off),
    Foreign("--grpc-infer-allocation-pool-size", "N", non_negative_int,
            "no pool of request objects to size"),
    Foreign("--grpc-infer-response-compression-level", "LEVEL",
            _choice("none", "low", "medium", "high"),
            "the server does not compress answers on its own", same=_is("none")),
    Foreign("--grpc-keepalive-time", "MS", non_negative_int, _GRPC_DEFAULTS),
    Foreign("--grpc-keepalive-timeout", "MS", non_negative_int, _GRPC_DEFAULTS),
    Foreign("--grpc-keepalive-permit-without-calls", "BOOL", boolean, _GRPC_DEFAULTS),
    Foreign("--grpc-http2-max-pings-without-data", "N", non_negative_int, _GRPC_DEFAULTS),
    Foreign("--grpc-http2-min-recv-ping-interval-without-data", "MS", non_negative_int,
            _GRPC_DEFAULTS),
    Foreign("--grpc-http2-max-ping-strikes", "N", non_negative_int, _GRPC_DEFAULTS),
    Foreign("--grpc-max-connection-age", "MS", non_negative_int, _GRPC_DEFAULTS),
    Foreign("--grpc-max-connection-age-grace", "MS", non_negative_int, _GRPC_DEFAULTS),
    Foreign("--allow-sagemaker", "BOOL", boolean, "there is no SageMaker endpoint", "refuse",
            same=_off),
    Foreign("--allow-vertex-ai", "BOOL", boolean, "there is no Vertex AI endpoint", "refuse",
            same=_off),
    # Metrics and tracing
    Foreign("--allow-cpu-metrics", "BOOL", boolean, "no CPU metrics are exported", same=_off),
    Foreign("--metrics-interval-ms", "MS", positive(float), "metrics are read when scraped"),
    Foreign("--metrics-config", "SETTING=VALUE", _setting,
            "latencies are histograms (docs/observability.md)"),
    Foreign("--trace-file", "FILE", _text, "traces go to OpenTelemetry (--trace-config)"),
    Foreign("--trace-level", "LEVEL", _text, "use --trace-config level=..."),
    Foreign("--trace-rate", "N", non_negative_int, "use --trace-config rate=..."),
    Foreign("--trace-count", "N", int, "set trace_count at run time: POST /v2/trace/setting"),
    Foreign("--trace-log-frequency", "N", non_negative_int, "traces go to OpenTelemetry"),
    # Caches, rate limiter, memory and devices
    Foreign("--response-cache-byte-size", "BYTES", non_negative_int,
            "there is no response cache: every request is computed"),
    Foreign("--cache-config", "CACHE,SETTING=VALUE", _setting,
            "there is no response cache: every request is computed"),
    Foreign("--cache-directory", "DIR", _text, "there is no response cache"),
    Foreign("--rate-limit", "MODE", _choice("off", "execution_count"),
            "instances run as soon as they are free (no rate limiter)", same=_is("off")),
    Foreign("--rate-limit-resource", "NAME:COUNT[:DEVICE]", _text, "there is no rate limiter"),
    Foreign("--pinned-memory-pool-byte-size", "BYTES", non_negative_int,
            "there is no pinned-memory pool to size"),
    Foreign("--cuda-memory-pool-byte-size", "GPU:BYTES", _device_pair(int),
            "CUDA memory comes from each framework's own allocator"),
    Foreign("--cuda-virtual-address-size", "GPU:BYTES", _device_pair(int),
            "there is no implicit state to size"),
    Foreign("--min-supported-compute-capability", "CC", float,
            "every visible GPU is used (narrow them with CUDA_VISIBLE_DEVICES)"),
    Foreign("--buffer-manager-thread-count", "N", non_negative_int, "no copy thread pool"),
    Foreign("--host-policy", "NAME,SETTING=VALUE", _setting, "no NUMA or CPU-core policy"),
    Foreign("--model-load-gpu-limit", "GPU:FRACTION", _device_pair(float),
            "loads are not limited by GPU memory in use"),
)
# fmt: on


def add_triton_arguments(serve: argparse.ArgumentParser) -> None:
    """tritonserver's flags that are not infermux's own (the aliases are with those)."""
    group = serve.add_argument_group(
        "tritonserver flags", "accepted so that tritonserver command lines run unchanged"
    )
    for flag in ("--http-address", "--grpc-address", "--metrics-address"):
        group.add_argument(flag, metavar="ADDR", help="the same as --host (one address for all)")
    add_bool(group, "--exit-on-error", False, "exit when a model fails to load at start-up")
    add_bool(group, "--strict-model-config", None, "true: configs are not completed from the model")
    group.add_argument(
        "--disable-auto-complete-config",
        action="store_true",
        help="configs are not completed from the model (auto_complete_config is not called)",
    )
    group.add_argument(
        "--model-load-thread-count",
        type=positive(int),
        default=DEFAULT_MODEL_LOAD_THREADS,
        metavar="N",
        help=f"models loaded at once (default {DEFAULT_MODEL_LOAD_THREADS})",
    )
    group.add_argument("--log-file", type=Path, metavar="FILE", help="log to FILE, not stderr")
    for level in ("info", "warning", "error"):
        add_bool(group, f"--log-{level}", True, f"log {level} lines")
    add_bool(group, "--grpc-use-ssl", False, "gRPC over TLS (HTTP stays plain)")
    for name, what in (("cert", "certificate"), ("key", "key"), ("root-cert", "root cert")):
        group.add_argument(
            f"--grpc-server-{name}" if name != "root-cert" else "--grpc-root-cert",
            type=Path,
            metavar="PEM",
            help=f"with --grpc-use-ssl: the server's {what}",
        )
    foreign = serve.add_argument_group(
        "tritonserver flags without effect here",
        "accepted with a warning naming them, or refused where that would change behaviour",
    )
    for spec in FOREIGN:
        is_bool = spec.parse is boolean
        foreign.add_argument(
            spec.flag,
            dest=spec.dest,
            action="append",
            type=spec.parse if is_bool else _as_given(spec.parse),
            nargs="?" if is_bool else None,
            const=True if is_bool else None,
            metavar=spec.metavar,
            help=("refused: " if spec.action == "refuse" else "ignored: ") + spec.why,
        )


def triton_settings(args: argparse.Namespace, error: Error) -> tuple[dict[str, Any], list[str]]:
    """The settings tritonserver's flags give, and one warning line per flag without effect;
    a refused flag or a contradiction calls ``error`` (exit 2, naming the flag)."""
    warnings: list[str] = []
    fields: dict[str, Any] = {"host": _host(args, error)}
    for spec in FOREIGN:
        given: list[Any] | None = getattr(args, spec.dest)
        if given is None or (spec.same is not None and all(map(spec.same, given))):
            continue
        values = " ".join(str(v).lower() if isinstance(v, bool) else str(v) for v in given)
        if spec.action == "refuse":
            error(f"{spec.flag} {values}: not supported: {spec.why}")
        warnings.append(f"{spec.flag} {values} is tritonserver's and has no effect: {spec.why}")
    fields.update(_grpc_tls(args, error, warnings))
    fields.update(
        exit_on_error=args.exit_on_error,
        # As in Triton: either flag turns completion off; --strict-model-config=false (or
        # nothing) leaves it on.
        auto_complete_config=not (
            args.disable_auto_complete_config or args.strict_model_config is True
        ),
        model_load_threads=args.model_load_thread_count,
        log_file=args.log_file,
        log_info=args.log_info,
        log_warning=args.log_warning,
        log_error=args.log_error,
    )
    return fields, warnings


def _host(args: argparse.Namespace, error: Error) -> str:
    given = {
        flag: value
        for flag, value in (
            ("--host", args.host),
            ("--http-address", args.http_address),
            ("--grpc-address", args.grpc_address),
            ("--metrics-address", args.metrics_address),
        )
        if value is not None
    }
    if len(set(given.values())) > 1:
        named = " and ".join(f"{flag} {value}" for flag, value in given.items())
        error(f"{named} differ: infermux binds HTTP, gRPC and metrics to one address")
    return next(iter(given.values()), DEFAULT_HOST)


def _grpc_tls(args: argparse.Namespace, error: Error, warnings: list[str]) -> dict[str, Any]:
    """``--grpc-use-ssl`` with its certificate and key: infermux's TLS pair, gRPC only."""
    files: Sequence[tuple[str, Path | None]] = (
        ("--grpc-server-cert", args.grpc_server_cert),
        ("--grpc-server-key", args.grpc_server_key),
        ("--grpc-root-cert", args.grpc_root_cert),
    )
    if not args.grpc_use_ssl:
        for flag, path in files:
            if path is not None:
                warnings.append(f"{flag} {path} has no effect without --grpc-use-ssl=true")
        return {}
    if args.tls_cert is not None:
        error("--grpc-use-ssl and --tls-cert: give one (--tls-cert is TLS on HTTP and gRPC)")
    if args.grpc_server_cert is None or args.grpc_server_key is None:
        error("--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key")
    if args.grpc_root_cert is not None:
        warnings.append(
            f"--grpc-root-cert {args.grpc_root_cert} has no effect: client certificates are "
            "not verified (as by tritonserver without --grpc-use-ssl-mutual)"
        )
    return {"tls_cert": args.grpc_server_cert, "tls_key": args.grpc_server_key, "tls_http": False}
