"""What a run reads besides the load itself: infermux's statistics, and the machine, package
versions and commit the numbers belong to (py-spy: pyspy.py)."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import batch_counters, machine_info, stats_counters

__all__ = ["batch_counters", "stats_counters"]  # siblings read them from here

ROOT = Path(__file__).resolve().parent.parent.parent
PACKAGES = (
    "infermux",
    "torch",
    "torchvision",
    "transformers",
    "tritonclient",
    "litserve",
    "fastapi",
    "uvicorn",
    "grpcio",
    "protobuf",
    "aiohttp",
    "uvloop",
    "numpy",
    "nvidia-ml-py",
    "py-spy",
)


def stats_delta(before: dict[str, int], after: dict[str, int]) -> dict[str, Any]:
    d = {k: after[k] - before[k] for k in before}

    def per_request_us(key: str) -> float | None:
        n = d[f"{key}_count"]
        return round(d[f"{key}_ns"] / n / 1e3, 1) if n else None

    executions = d["execution_count"]
    return {
        "avg_batch": round(d["inference_count"] / executions, 2) if executions else None,
        "server_inferences": d["inference_count"],
        "server_executions": executions,
        "server_request_us": per_request_us("success"),
        "server_queue_us": per_request_us("queue"),
        "server_compute_input_us": per_request_us("compute_input"),
        "server_compute_infer_us": per_request_us("compute_infer"),
        "server_compute_output_us": per_request_us("compute_output"),
    }


def batch_delta(
    before: dict[int, tuple[int, int]], after: dict[int, tuple[int, int]]
) -> dict[str, Any]:
    """The window's executions by batch size (``batch_sizes``: rows -> executions) and each
    size's mean compute infer (``compute_infer_us_by_batch``), from two :func:`batch_counters`."""
    sizes: dict[str, int] = {}
    infer_us: dict[str, float] = {}
    for size in sorted(after):
        count = after[size][0] - before.get(size, (0, 0))[0]
        if count > 0:
            ns = after[size][1] - before.get(size, (0, 0))[1]
            sizes[str(size)] = count
            infer_us[str(size)] = round(ns / count / 1e3, 1)
    return {"batch_sizes": sizes, "compute_infer_us_by_batch": infer_us}


def padding(batch_sizes: dict[str, int], buckets: list[int]) -> dict[str, Any] | None:
    """What padding batches up to the CUDA graph ``buckets`` cost: each execution of ``rows``
    replays the smallest bucket that holds it (as infermux pads), so ``padded_rows_pct`` is the
    share of the rows the GPU ran that were padding. None without buckets (eager) or batches."""
    if not buckets or not batch_sizes:
        return None
    ordered = sorted(buckets)
    real = run = 0
    for size_text, count in batch_sizes.items():
        size = int(size_text)
        bucket = next((b for b in ordered if b >= size), size)  # past the largest: eager
        real += size * count
        run += bucket * count
    return {"padded_rows_pct": round(100 * (run - real) / run, 1)}


def machine() -> dict[str, Any]:
    return machine_info()


def versions() -> dict[str, str]:
    out = {}
    for package in PACKAGES:
        try:
            out[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            out[package] = "not installed"
    return out


def git_commit() -> dict[str, Any]:
    try:
        done = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True
        )
        dirty = subprocess.run(
            ["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no"],
            capture_output=True,
            text=True,
        )
    except OSError:
        return {"commit": None}
    return {
        "commit": done.stdout.strip() or None,
        "dirty": dirty.stdout.strip().splitlines() if done.returncode == 0 else None,
    }
