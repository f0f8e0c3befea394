"""What ``infermux bench`` writes: JSON (everything), CSV (perf_analyzer's columns, so tools
that read perf_analyzer's ``-f`` files read these), and a latency-versus-throughput plot
(PNG, or HTML with the plot and the table; needs matplotlib: ``pip install 'infermux[bench]'``)."""

from __future__ import annotations

import base64
import csv
import html
import io
import json
import math
import os
import platform
from typing import Any

from .measure import Level
from .options import BenchOptions

CSV_COLUMNS = (
    "Inferences/Second",
    "Client Send",
    "Network+Server Send/Recv",
    "Server Queue",
    "Server Compute Input",
    "Server Compute Infer",
    "Server Compute Output",
    "Client Recv",
    "p50 latency",
    "p90 latency",
    "p95 latency",
    "p99 latency",
)


def write(options: BenchOptions, levels: list[Level]) -> None:
    if options.json_path is not None:
        options.json_path.write_text(json.dumps(document(options, levels), indent=2) + "\n")
    if options.csv_path is not None:
        options.csv_path.write_text(csv_text(options, levels))
    if options.plot_path is not None:
        plot(options, levels)


def document(options: BenchOptions, levels: list[Level]) -> dict[str, Any]:
    settings = {k: (str(v) if k.endswith("_path") else v) for k, v in options.__dict__.items()}
    return {
        "tool": "infermux bench",
        "host": {"cpus": os.cpu_count(), "machine": platform.machine()},
        "options": settings,
        "levels": [level.to_json() for level in levels],
    }


def csv_text(options: BenchOptions, levels: list[Level]) -> str:
    """perf_analyzer's CSV (µs, one row per level, sorted by throughput). The client's own send
    and receive times are inside tritonclient here, so they are 0 and the rest of the latency
    not spent in the server's queue and compute is 'Network+Server Send/Recv'."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(("Request Rate" if options.open_loop else "Concurrency", *CSV_COLUMNS))
    for level in sorted(levels, key=lambda lv: lv.inferences_per_s):
        s, lat = level.server, level.latency_us
        stages = [
            s.get(k, math.nan)
            for k in ("queue_us", "compute_input_us", "compute_infer_us", "compute_output_us")
        ]
        known = [v for v in stages if math.isfinite(v)]
        network = lat.get("avg", math.nan) - sum(known)
        row = [
            f"{level.level:g}",
            f"{level.inferences_per_s:.2f}",
            0,
            _us(network),
            *(_us(v) for v in stages),
            0,
            *(_us(lat.get(p, math.nan)) for p in ("p50", "p90", "p95", "p99")),
        ]
        writer.writerow(row)
    return out.getvalue()


def _us(value: float) -> int | str:
    return round(value) if math.isfinite(value) else ""


def plot(options: BenchOptions, levels: list[Level]) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise RuntimeError("--plot needs matplotlib: pip install 'infermux[bench]'") from None
    assert options.plot_path is not None
    figure, axis = plt.subplots(figsize=(7, 4.5))
    x = [level.inferences_per_s for level in levels]
    for key in ("p50", "p99"):
        axis.plot(
            x,
            [level.latency_us.get(key, math.nan) / 1000 for level in levels],
            marker="o",
            label=key,
        )
    for level, xv in zip(levels, x, strict=True):
        axis.annotate(f"{level.level:g}", (xv, level.latency_us.get("p99", math.nan) / 1000),
                      textcoords="offset points", xytext=(4, 4), fontsize=8)  # fmt: skip
    axis.set_xlabel("inferences / s")
    axis.set_ylabel("latency (ms)")
    axis.set_title(
        f"{options.model} over {options.protocol}"
        + (" + shm" if options.shared_memory != "none" else "")
    )
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png", dpi=120)
    plt.close(figure)
    if options.plot_path.suffix.lower() == ".html":
        encoded = base64.b64encode(buffer.getvalue()).decode()
        rows = "".join(
            f"<tr><td>{lv.level:g}</td><td>{lv.inferences_per_s:,.1f}</td>"
            + "".join(
                f"<td>{lv.latency_us.get(p, math.nan) / 1000:,.2f}</td>"
                for p in ("p50", "p90", "p95", "p99", "p99.9")
            )
            + f"<td>{lv.failures}</td></tr>"
            for lv in levels
        )
        options.plot_path.write_text(
            f"<!doctype html><meta charset=utf-8><title>{html.escape(options.model)}</title>"
            f"<img src='data:image/png;base64,{encoded}'><table border=1 cellpadding=4>"
            "<tr><th>level</th><th>infer/s</th><th>p50 ms</th><th>p90 ms</th><th>p95 ms</th>"
            f"<th>p99 ms</th><th>p99.9 ms</th><th>failed</th></tr>{rows}</table>"
        )
    else:
        options.plot_path.write_bytes(buffer.getvalue())
