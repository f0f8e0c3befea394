"""What ``infermux bench`` is asked to do (flags named after perf_analyzer's where they match)."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from pathlib import Path

PROTOCOLS = ("http", "grpc")
INPUT_DATA = ("zero", "random")


@dataclass(frozen=True)
class BenchOptions:
    model: str
    url: str = ""
    """host:port; default localhost:8000 (HTTP) or localhost:8001 (gRPC)."""
    protocol: str = "http"
    shared_memory: str = "none"
    model_version: str = ""
    batch_size: int = 1
    concurrency: tuple[int, ...] = (1,)
    request_rate: tuple[float, ...] = ()
    """Open loop when given: requests per second, swept instead of the concurrency."""
    distribution: str = "constant"
    input_data: str = "random"
    """``zero``, ``random`` or a path: ``.npz`` (one array per input) or ``.json``
    (``{"INPUT0": [[...]], ...}``), batched as given."""
    shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)
    warmup_s: float = 2.0
    window_s: float = 2.0
    stability: float = 0.10
    max_windows: int = 10
    processes: int = 1
    json_path: Path | None = None
    csv_path: Path | None = None
    plot_path: Path | None = None

    @property
    def address(self) -> str:
        return self.url or ("localhost:8001" if self.protocol == "grpc" else "localhost:8000")

    @property
    def levels(self) -> list[float]:
        return (
            list(self.request_rate) if self.request_rate else [float(c) for c in self.concurrency]
        )

    @property
    def open_loop(self) -> bool:
        return bool(self.request_rate)


def build_parser(parser: argparse.ArgumentParser | None = None) -> argparse.ArgumentParser:
    p = parser or argparse.ArgumentParser(prog="infermux bench")
    p.add_argument("model", help="model name")
    p.add_argument("-u", "--url", default="", help="host:port (default localhost:8000 / :8001)")
    p.add_argument("-i", "--protocol", choices=PROTOCOLS, default="http")
    p.add_argument(
        "--shared-memory",
        choices=("none", "system"),
        default="none",
        help="send inputs and receive outputs through system shared memory",
    )
    p.add_argument("-x", "--model-version", default="")
    p.add_argument("-b", "--batch-size", type=_positive_int, default=1)
    p.add_argument(
        "--concurrency-range",
        default="1",
        metavar="START[:END[:STEP]]",
        help="closed loop: in-flight requests per level (default 1); END doubles from START "
        "when STEP is omitted",
    )
    p.add_argument(
        "--request-rate-range",
        default="",
        metavar="START[:END[:STEP]]",
        help="open loop: requests/s per level (replaces --concurrency-range)",
    )
    p.add_argument(
        "--request-distribution",
        choices=("constant", "poisson"),
        default="constant",
        help="open loop: gaps between sends (default constant)",
    )
    p.add_argument("--input-data", default="random", help="zero, random, or a .npz/.json file")
    p.add_argument(
        "--shape",
        action="append",
        default=[],
        metavar="NAME:D1,D2",
        help="shape (without the batch dimension) of an input with variable dimensions",
    )
    p.add_argument("--warmup", type=_non_negative_float, default=2.0, metavar="SECONDS")
    p.add_argument(
        "-p",
        "--measurement-interval",
        type=_positive_float,
        default=2.0,
        metavar="SECONDS",
        help="one measurement window (default 2)",
    )
    p.add_argument(
        "-s",
        "--stability-percentage",
        type=_positive_float,
        default=10.0,
        help="stable: 3 windows within this %% of their mean (default 10)",
    )
    p.add_argument("--max-trials", type=_positive_int, default=10, help="windows before giving up")
    p.add_argument(
        "--processes", type=_positive_int, default=1, help="load generator processes (default 1)"
    )
    p.add_argument("--json", type=Path, dest="json_path", help="write the results as JSON")
    p.add_argument(
        "-f", "--csv", type=Path, dest="csv_path", help="write perf_analyzer-compatible CSV"
    )
    p.add_argument(
        "--plot",
        type=Path,
        dest="plot_path",
        help="latency vs throughput plot (.png, or .html with the table)",
    )
    return p


def parse_options(argv: list[str]) -> BenchOptions:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        concurrency = tuple(int(v) for v in _range(args.concurrency_range, integer=True))
        rates = (
            tuple(_range(args.request_rate_range, integer=False)) if args.request_rate_range else ()
        )
        shapes = dict(_shape(item) for item in args.shape)
    except ValueError as exc:
        parser.error(str(exc))
    return BenchOptions(
        model=args.model,
        url=args.url,
        protocol=args.protocol,
        shared_memory=args.shared_memory,
        model_version=args.model_version,
        batch_size=args.batch_size,
        concurrency=concurrency,
        request_rate=rates,
        distribution=args.request_distribution,
        input_data=args.input_data,
        shapes=shapes,
        warmup_s=args.warmup,
        window_s=args.measurement_interval,
        stability=args.stability_percentage / 100,
        max_windows=max(3, args.max_trials),
        processes=args.processes,
        json_path=args.json_path,
        csv_path=args.csv_path,
        plot_path=args.plot_path,
    )


def _range(text: str, *, integer: bool) -> list[float]:
    """perf_analyzer's START[:END[:STEP]]; without STEP the levels double (1, 2, 4, ...)."""
    parts = text.split(":")
    try:
        numbers = [float(p) for p in parts]
    except ValueError:
        raise ValueError(f"range '{text}': expected START[:END[:STEP]] numbers") from None
    if not 1 <= len(numbers) <= 3 or any(n <= 0 for n in numbers):
        raise ValueError(f"range '{text}': expected positive START[:END[:STEP]]")
    if integer and any(n != int(n) for n in numbers):
        raise ValueError(f"range '{text}': concurrency levels are whole numbers")
    start = numbers[0]
    end = numbers[1] if len(numbers) > 1 else start
    if end < start:
        raise ValueError(f"range '{text}': END is below START")
    levels = []
    value = start
    while value <= end + 1e-9:
        levels.append(value)
        value = value + numbers[2] if len(numbers) == 3 else value * 2
    return levels


def _shape(item: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = item.rpartition(":")
    try:
        shape = tuple(int(d) for d in dims.split(","))
    except ValueError:
        raise ValueError(f"--shape '{item}': expected NAME:D1,D2,...") from None
    if not name or any(d < 1 for d in shape):
        raise ValueError(f"--shape '{item}': expected NAME:D1,D2,... with positive dimensions")
    return name, shape


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1: {text}")
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"must be > 0: {text}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be >= 0: {text}")
    return value
