"""What a run reads besides the load itself: infermux's statistics, and the machine, package
versions and commit the numbers belong to (py-spy: pyspy.py)."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Any

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


def stats_counters(document: Any) -> dict[str, int]:
    stats = document["model_stats"][0]
    out = {
        "inference_count": int(stats["inference_count"]),
        "execution_count": int(stats["execution_count"]),
    }
    for key in ("success", "queue", "compute_input", "compute_infer", "compute_output"):
        entry = stats["inference_stats"].get(key, {"count": 0, "ns": 0})
        out[f"{key}_count"] = int(entry["count"])
        out[f"{key}_ns"] = int(entry["ns"])
    return out


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


def machine() -> dict[str, Any]:
    cpu = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "platform": platform.platform(),
        "cpu_model": cpu,
        "nproc": os.cpu_count(),
        "python": sys.version.split()[0],
        "loadavg_start": [round(v, 2) for v in os.getloadavg()],
    }


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
