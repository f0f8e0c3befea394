"""Windows, stability and figures of one load level, and the server's own breakdown."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

PERCENTILES = (50, 90, 95, 99, 99.9)
STABLE_WINDOWS = 3


@dataclass
class Window:
    start: float
    end: float
    latencies: list[float] = field(default_factory=list)
    failures: int = 0

    @property
    def throughput(self) -> float:
        return len(self.latencies) / (self.end - self.start)

    @property
    def p99(self) -> float:
        return float(np.percentile(self.latencies, 99)) if self.latencies else math.inf


def stable(windows: list[Window], tolerance: float) -> bool:
    """perf_analyzer's rule: the last three windows' throughput and p99 each within
    ``tolerance`` of their mean."""
    if len(windows) < STABLE_WINDOWS:
        return False
    last = windows[-STABLE_WINDOWS:]
    for values in ([w.throughput for w in last], [w.p99 for w in last]):
        mean = sum(values) / len(values)
        if not mean or not math.isfinite(mean):
            return False
        if any(abs(v - mean) > tolerance * mean for v in values):
            return False
    return True


@dataclass
class Level:
    """The figures of one concurrency or request-rate level (over its last three windows)."""

    level: float
    requests_per_s: float
    inferences_per_s: float
    latency_us: dict[str, float]
    failures: int
    windows: int
    stable: bool
    client_cpu_s: float
    client_cpu_cores: float
    """Load-generator CPU seconds per second of measurement (1.0 = one core busy)."""
    server: dict[str, float]

    def to_json(self) -> dict[str, Any]:
        return dict(self.__dict__)


def summarize(
    level: float,
    windows: list[Window],
    *,
    batch_size: int,
    cpu_s: float,
    wall_s: float,
    server: dict[str, float],
    is_stable: bool,
) -> Level:
    used = windows[-STABLE_WINDOWS:]
    latencies = np.array([x for w in used for x in w.latencies]) * 1e6
    seconds = sum(w.end - w.start for w in used)
    requests = len(latencies) / seconds if seconds else 0.0
    figures = (
        {f"p{p:g}": float(np.percentile(latencies, p)) for p in PERCENTILES}
        if len(latencies)
        else {}
    )
    figures["avg"] = float(latencies.mean()) if len(latencies) else math.nan
    return Level(
        level=level,
        requests_per_s=requests,
        inferences_per_s=requests * batch_size,
        latency_us=figures,
        failures=sum(w.failures for w in windows),
        windows=len(windows),
        stable=is_stable,
        client_cpu_s=cpu_s,
        client_cpu_cores=cpu_s / wall_s if wall_s else 0.0,
        server=server,
    )


_KEYS = {
    "success": ("success",),
    "queue": ("queue",),
    "compute_input": ("compute_input", "computeInput"),
    "compute_infer": ("compute_infer", "computeInfer"),
    "compute_output": ("compute_output", "computeOutput"),
}


def server_totals(document: dict[str, Any], version: str) -> dict[str, tuple[int, int]]:
    """(count, ns) per statistic from a statistics answer (HTTP JSON or gRPC as JSON), summed
    over the matching versions."""
    totals = dict.fromkeys(_KEYS, (0, 0))
    rows = document.get("model_stats") or document.get("modelStats") or []
    for row in rows:
        if version and str(row.get("version", "")) != version:
            continue
        stats = row.get("inference_stats") or row.get("inferenceStats") or {}
        for key, names in _KEYS.items():
            value: dict[str, Any] = next((stats[n] for n in names if n in stats), {})
            count, ns = totals[key]
            totals[key] = (count + int(value.get("count", 0)), ns + int(value.get("ns", 0)))
    return totals


def server_breakdown(
    before: dict[str, tuple[int, int]], after: dict[str, tuple[int, int]]
) -> dict[str, float]:
    """Average µs per successful request the server spent in each stage between two reads."""
    count = after["success"][0] - before["success"][0]
    result: dict[str, float] = {"requests": float(count)}
    for key in _KEYS:
        ns = after[key][1] - before[key][1]
        result[f"{key}_us"] = ns / count / 1000 if count > 0 else math.nan
    return result
