"""Alternating A/B runs of ``run.sh``: several server configurations, measured in turn.

On a noisy shared machine a configuration measured first, or in a quieter minute, wins by luck;
so each round runs every configuration once, the order reversed on odd rounds, and the median
over rounds is what counts. Used by ``benchmarks/frontends/simple_cpu.py`` (front-end processes)
and ``benchmarks/observability/overhead.py`` (metrics and tracing on and off).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "benchmarks" / "perf_analyzer" / "run.sh"
FIGURES = ("throughput_infer_per_s", "p50_us", "p99_us")


@dataclass
class Config:
    """One server configuration: ``infermux serve`` flags and extra ``run.sh`` environment."""

    label: str
    server_args: str
    env: Mapping[str, str] = field(default_factory=dict)


def point(work: Path, config: Config, concurrency: int, modes: str, window: str) -> dict[str, Any]:
    """One run.sh invocation; {mode: result} for the modes that produced a result."""
    slug = re.sub(r"[^\w+.-]+", "_", config.label)
    out = work / f"{slug}-c{concurrency}"
    env = dict(
        os.environ,
        PYTHON=sys.executable,
        OUT=str(out),
        MODES=modes,
        CONCURRENCY=str(concurrency),
        SERVER_ARGS=config.server_args,
        PA_WINDOW=window,
        **config.env,
    )
    subprocess.run(["bash", str(RUN)], env=env, check=False, capture_output=True, timeout=900)
    summary = Path(f"{out}.json")
    if not summary.exists():
        return {}
    return {r["mode"]: r for r in json.loads(summary.read_text())["results"]}


def alternate(
    configs: list[Config],
    levels: list[int],
    modes: str,
    rounds: int,
    work: Path,
    *,
    window: str = "-p 2000 --max-trials 8",
) -> dict[str, list[dict[str, Any]]]:
    """Every result, keyed ``mode|label|concurrency``, over ``rounds`` alternating rounds."""
    runs: dict[str, list[dict[str, Any]]] = {}
    for r in range(rounds):
        for config in configs if r % 2 == 0 else list(reversed(configs)):
            for c in levels:
                found = point(work / f"round{r}", config, c, modes, window)
                for mode, result in found.items():
                    runs.setdefault(f"{mode}|{config.label}|{c}", []).append(result)
                print(f"round {r} {config.label} c={c}: {sorted(found)}", flush=True)
    return runs


def medians(runs: dict[str, list[dict[str, Any]]], key: str) -> dict[str, Any] | None:
    """Median throughput and latencies of the successful runs under ``key`` (None if none)."""
    results = [x for x in runs.get(key, []) if x.get("ok")]
    if not results:
        return None
    cell: dict[str, Any] = {k: statistics.median(float(x[k]) for x in results) for k in FIGURES}
    cell["runs"] = [float(x["throughput_infer_per_s"]) for x in results]
    return cell
