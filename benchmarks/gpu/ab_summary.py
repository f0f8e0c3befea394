"""One table per A/B run of ``run.py`` (several server runs, or points repeated on one server):
for each infermux run and point, perf_analyzer's reported figure and its steady state (the mean of
the passes after the first, which is a ramp: ``docs/benchmarks.md``), both against the raw
ceiling, the average batch, the share of executions below half ``max_batch_size``, executor CPU
per request and NVML utilisation, and where a closed loop's requests are (Little's law on
perf_analyzer's server-side split): the time and the number of requests outside the executor
(client, gRPC, the front ends and their hold, the ring), which is what the batches lack.

    python3 benchmarks/gpu/ab_summary.py RUN_DIR [RUN_DIR ...]   (each holding gpu_bench.json)
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from report_tables import fmt, points


def steady(passes: list[dict[str, Any]]) -> float | None:
    """The mean throughput of the passes after the first (None: fewer than two passes)."""
    rest = [float(p["items_per_s"]) for p in passes[1:]]
    return sum(rest) / len(rest) if rest else None


def small_share(batch_sizes: dict[str, int], half: int) -> float | None:
    """The fraction of executions with fewer than ``half`` rows."""
    total = sum(batch_sizes.values())
    if not total:
        return None
    return sum(n for rows, n in batch_sizes.items() if int(rows) < half) / total


def outside(point: dict[str, Any]) -> str:
    """perf_analyzer's time outside the executor (client send/recv and "network + server
    send/recv": everything before the batcher's queue and after the answer) in ms, and by
    Little's law the requests there on average: throughput x time."""
    parts = [
        point.get(k) for k in ("pa_client_send_us", "pa_network_server_us", "pa_client_recv_us")
    ]
    if parts[1] is None:
        return "-"
    us = sum(float(p or 0) for p in parts)
    return f"{us / 1000:.1f} ({float(point['items_per_s']) * us / 1e6:.0f})"


def rows(doc: dict[str, Any]) -> list[list[str]]:
    table = []
    for model, entry in doc["models"].items():
        ceiling = float(entry["raw"]["ceiling_items_per_s"])
        half = int(entry["raw"]["max_batch"]) // 2
        for name, point in points(entry):
            if not point.get("items_per_s"):
                continue
            flat = steady(point.get("pa_passes") or [])
            share = small_share(point.get("batch_sizes") or {}, half)
            table.append(
                [
                    model,
                    name,
                    f"{point['protocol']} c={point['concurrency']}",
                    f"{point['items_per_s']:,.0f} ({point['items_per_s'] / ceiling:.3f}x)",
                    f"{flat:,.0f} ({flat / ceiling:.3f}x)" if flat else "-",
                    str(len(point.get("pa_passes") or [])),
                    str(point.get("avg_batch")),
                    fmt(share, ".0%"),
                    str(point.get("executor_cpu_us_per_request")),
                    str(point.get("gpu_util_mean")),
                    outside(point),
                ]
            )
    return table


HEADER = [
    "model", "run", "point", "reported", "passes 2+", "passes", "avg batch",
    "below half", "executor us/req", "GPU %", "outside ms (requests)",
]  # fmt: skip


def markdown(table: list[list[str]]) -> str:
    lines = ["| " + " | ".join(HEADER) + " |", "|" + "---|" * len(HEADER)]
    lines += ["| " + " | ".join(row) + " |" for row in table]
    return "\n".join(lines)


def frontend_timing(folder: Path) -> str | None:
    """The front ends' own timings of a run (``fe-timing/fe-<pid>.json``, written by the tuning
    hook's ``INFERMUX_BENCH_FE_TIMING``), summed over the front ends: µs per gRPC call in the
    handler, in its call to the executor (hold, hops, executor, the answer's wake-up) and per
    held micro-batch in the hold. None when the run has none."""
    files = sorted((folder / "fe-timing").glob("fe-*.json"))
    total = _summed(files)
    calls, holds = total.get("calls", 0), total.get("holds", 0)
    if not calls:
        return None
    handler = total["handler_ns"] / calls / 1000
    executor = total["executor_ns"] / calls / 1000
    hold = total["hold_ns"] / holds / 1000 if holds else 0.0
    line = (
        f"front ends ({len(files)}, {calls:,} calls): handler {handler:,.0f} µs per call, "
        f"of which the executor call {executor:,.0f} and the handler's own work "
        f"{handler - executor:,.0f}; {holds:,} micro-batches held {hold:,.0f} µs each"
    )
    if total.get("lag_probes"):
        line += f"{_lag(total)} in the front ends' loops"
    inside = _summed(sorted((folder / "fe-timing").glob("ex-*.json")))
    requests = inside.get("requests", 0)
    if requests:
        resident = inside["residence_ns"] / requests / 1000
        line += (
            f"\nexecutor ({inside['frames']:,} frames, {requests:,} requests): "
            f"{resident:,.0f} µs per request from its frame's dispatch to its answer's send "
            f"(waiting to start {inside['start_wait_ns'] / requests / 1000:,.0f}); the executor "
            f"call's rest, ring hops and the answers' wake-ups with the hold: "
            f"{executor - resident:,.0f} µs"
        )
        if inside.get("lag_probes"):
            line += f"{_lag(inside)} in the executor's loop"
    return line


def _summed(files: list[Path]) -> dict[str, int]:
    """The timing files' counters added up (a maximum's key kept as the largest)."""
    total: dict[str, int] = {}
    for path in files:
        for key, value in json.loads(path.read_text()).items():
            merge = max if key.endswith("_max_ns") else int.__add__
            total[key] = merge(total.get(key, 0), int(value))
    return total


def _lag(sums: dict[str, int]) -> str:
    probes = sums["lag_probes"]
    return (
        f"; a callback waited {sums['lag_ns'] / probes / 1000:,.0f} µs on average "
        f"(at most {sums['lag_max_ns'] / 1000:,.0f}, {probes:,} probes)"
    )


def main() -> None:
    for folder in sys.argv[1:]:
        doc = json.loads((Path(folder) / "gpu_bench.json").read_text())
        print(f"{folder} (ceiling from its raw step)\n\n{markdown(rows(doc))}\n")
        timing = frontend_timing(Path(folder))
        if timing:
            print(timing + "\n")


if __name__ == "__main__":
    main()
