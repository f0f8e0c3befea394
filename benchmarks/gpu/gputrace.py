"""``run.py --profile-gpu-trace``: what the GPU's streams did during the profile run.

At c=256 NVML reports the GPU ~99% busy while the batches served needed ~90% of the window by
the raw model's cost per batch (``gpu_bench.md``, "fed all the time"): NVML counts a moment as
busy when any stream runs anything, so it cannot say whether the instances' streams overlapped,
how long each stood idle between batches, or what the copies took. A trace of the GPU's own
activity can. The server starts with ``gputrace_hook/`` first on ``PYTHONPATH``; :func:`start`
and :func:`stop` signal the executors at the profile window's edges (the hook records a couple of
seconds from the first), and :func:`summary` reads each trace into:

- per stream: the share of the traced span it was busy, its kernels and copies, and the idle
  gaps between its busy stretches (count, median, p90, their share of the span);
- the share of the span during which 0, 1, 2, ... streams were busy at once;
- the copies' time by direction (host to device, device to host, device to device, memset).
"""

from __future__ import annotations

import itertools
import json
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import profile_hooks

HOOK = Path(__file__).resolve().parent / "gputrace_hook"
start = profile_hooks.start  # SIGUSR1 to the profiled processes: the window opens
stop = profile_hooks.stop  # SIGUSR2: it closes
GPU_CATEGORIES = frozenset({"kernel", "gpu_memcpy", "gpu_memset"})
COPY_KINDS = ("HtoD", "DtoH", "DtoD", "Memset")

Interval = tuple[float, float]


def server_env(directory: Path) -> dict[str, str]:
    """Environment additions for ``infermux serve`` (traces go to ``directory``)."""
    return profile_hooks.server_env(HOOK, "INFERMUX_BENCH_GPU_TRACE", directory)


def merged(intervals: list[Interval]) -> list[Interval]:
    """``intervals`` (start, end) joined where they touch or overlap, in order."""
    out: list[Interval] = []
    for begin, end in sorted(intervals):
        if out and begin <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], end))
        else:
            out.append((begin, end))
    return out


def _quantile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


def _copy_kind(name: str) -> str:
    return next((kind for kind in COPY_KINDS if kind in name), "other")


def analyze(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The figures above from a Chrome trace's events (times in µs)."""
    gpu = [e for e in events if e.get("ph") == "X" and e.get("cat") in GPU_CATEGORIES]
    if not gpu:
        return {"gpu_events": 0}
    begin = min(float(e["ts"]) for e in gpu)
    end = max(float(e["ts"]) + float(e.get("dur", 0)) for e in gpu)
    span = max(end - begin, 1e-9)
    by_stream: dict[int, list[Interval]] = defaultdict(list)
    kernels: dict[int, int] = defaultdict(int)
    copies: dict[str, float] = defaultdict(float)
    for e in gpu:
        stream = int(e.get("args", {}).get("stream", -1))
        start_us = float(e["ts"])
        by_stream[stream].append((start_us, start_us + float(e.get("dur", 0))))
        if e["cat"] == "kernel":
            kernels[stream] += 1
        else:
            copies[_copy_kind(str(e.get("name", "")))] += float(e.get("dur", 0))
    streams = []
    edges: list[tuple[float, int]] = []
    for stream, intervals in sorted(by_stream.items()):
        busy = merged(intervals)
        gaps = [b[0] - a[1] for a, b in itertools.pairwise(busy)]
        edges += [(a, 1) for a, _ in busy] + [(b, -1) for _, b in busy]
        streams.append(
            {
                "stream": stream,
                "busy_pct": 100 * sum(b - a for a, b in busy) / span,
                "kernels": kernels[stream],
                "activities": len(intervals),
                "gaps": len(gaps),
                "gap_p50_us": _quantile(gaps, 0.5),
                "gap_p90_us": _quantile(gaps, 0.9),
                "gaps_pct": 100 * sum(gaps) / span,
            }
        )
    at_once: dict[int, float] = defaultdict(float)
    level, last = 0, begin
    for moment, change in sorted(edges):  # at one moment, ends (-1) before starts (+1)
        if moment > last:
            at_once[level] += moment - last
        level, last = level + change, moment
    return {
        "gpu_events": len(gpu),
        "span_us": span,
        "streams": streams,
        "busy_at_once_pct": {k: 100 * v / span for k, v in sorted(at_once.items())},
        "any_busy_pct": 100 * (span - at_once.get(0, 0.0)) / span,
        "copies_pct": {k: 100 * v / span for k, v in sorted(copies.items())},
    }


def render(figures: dict[str, Any], title: str) -> str:
    if not figures.get("gpu_events"):
        return f"## {title}: no GPU activity in the trace"
    lines = [
        f"## {title}: {figures['gpu_events']:,} GPU activities over "
        f"{figures['span_us'] / 1000:,.1f} ms; any stream busy {figures['any_busy_pct']:.1f}%",
        "",
        "| stream | busy % | kernels | activities | gaps | gap p50 µs | gap p90 µs | gaps % |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for s in figures["streams"]:
        lines.append(
            f"| {s['stream']} | {s['busy_pct']:.1f} | {s['kernels']:,} | {s['activities']:,} | "
            f"{s['gaps']:,} | {s['gap_p50_us']:.1f} | {s['gap_p90_us']:.1f} | {s['gaps_pct']:.1f} |"
        )
    at_once = ", ".join(f"{k}: {v:.1f}%" for k, v in figures["busy_at_once_pct"].items())
    copies = ", ".join(f"{k} {v:.1f}%" for k, v in figures["copies_pct"].items()) or "none"
    lines += ["", f"Streams busy at once (share of the span): {at_once}", f"Copies: {copies}"]
    return "\n".join(lines)


def summary(directory: Path, pids: list[int], title: str, *, wait_s: float = 60.0) -> str:
    """Text of each pid's trace (waiting up to ``wait_s`` for them: writing one takes a while)."""
    deadline = time.monotonic() + wait_s
    paths = [directory / f"gputrace-{pid}.json" for pid in pids]
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.2)
    parts = [f"# GPU trace: {title}"]
    for pid, path in zip(pids, paths, strict=True):
        if not path.exists():
            parts.append(f"## pid {pid}: no trace (not written in {wait_s:g} s)")
            continue
        events = json.loads(path.read_text()).get("traceEvents", [])
        parts.append(render(analyze(events), f"pid {pid}"))
    return "\n\n".join(parts)
