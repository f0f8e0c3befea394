"""Plots ``gpu_bench.json``: per model, throughput and latency against concurrency for every
server/protocol, with the raw in-process ceiling, and GPU utilisation where NVML was available.

    python benchmarks/gpu/plot.py OUT/gpu_bench.json [MORE.json ...] [--output OUT/gpu_bench.png]

Several JSON files (e.g. one run per model, split to fit the GPU box's 10-minute limit) are
merged into one figure. Needs matplotlib (not on the GPU box; run it where the JSON lands).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only, no display
import matplotlib.pyplot as plt

STYLE = {"grpc_shm": "-", "grpc": "--", "http": ":", "http_json": "-."}
STYLE.update({f"pa_{k}": v for k, v in STYLE.items()}, pa_grpc_cuda_shm=(0, (5, 1, 1, 1)))
COLOR = {"infermux": "tab:blue", "litserve": "tab:orange", "fastapi": "tab:green"}
PA_COLOR = "tab:purple"  # infermux driven by perf_analyzer


def series(entry: dict[str, Any]) -> dict[tuple[str, str], list[dict[str, Any]]]:
    """(server, protocol) -> measured points, in concurrency order."""
    out: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for server, result in entry.get("servers", {}).items():
        for point in result.get("points", []):
            if "items_per_s" in point:
                out.setdefault((server, point["protocol"]), []).append(point)
    for points in out.values():
        points.sort(key=lambda p: p["concurrency"])
    return out


def plot(doc: dict[str, Any], output: Path) -> None:
    models = list(doc["models"])
    has_gpu = any(
        p.get("gpu_util_mean") is not None
        for entry in doc["models"].values()
        for points in series(entry).values()
        for p in points
    )
    columns = 3 if has_gpu else 2
    fig, axes = plt.subplots(
        len(models), columns, figsize=(5.5 * columns, 4.2 * len(models)), squeeze=False
    )
    for row, model in enumerate(models):
        entry = doc["models"][model]
        raw = entry.get("raw", {})
        rate, latency = axes[row][0], axes[row][1]
        for (server, protocol), points in series(entry).items():
            c = [p["concurrency"] for p in points]
            color = PA_COLOR if protocol.startswith("pa_") else COLOR.get(server.split("-")[0])
            style = {"color": color, "linestyle": STYLE.get(protocol, "-")}
            label = f"{server} {protocol}"
            rate.plot(c, [p["items_per_s"] for p in points], marker="o", label=label, **style)
            latency.plot(
                c, [p["p50_ms"] for p in points], marker="o", label=f"{label} p50", **style
            )
            latency.plot(
                c,
                [p["p99_ms"] for p in points],
                marker="x",
                alpha=0.5,
                label=f"{label} p99",
                **style,
            )
            if has_gpu:
                util = [p.get("gpu_util_mean") for p in points]
                axes[row][2].plot(c, [u if u is not None else float("nan") for u in util], **style)
        if raw.get("ceiling_items_per_s"):
            rate.axhline(
                raw["ceiling_items_per_s"], color="gray", linestyle="--", label="raw ceiling"
            )
        if raw.get("b1_latency_ms"):
            latency.axhline(raw["b1_latency_ms"], color="gray", linestyle="--", label="raw batch 1")
        rate.set_title(f"{model}: throughput")
        rate.set_ylabel("items/s")
        latency.set_title(f"{model}: latency (p50 o, p99 x)")
        latency.set_ylabel("ms")
        latency.set_yscale("log")
        panels = [rate, latency]
        if has_gpu:
            axes[row][2].set_title(f"{model}: GPU utilisation (mean)")
            axes[row][2].set_ylabel("%")
            axes[row][2].set_ylim(0, 105)
            panels.append(axes[row][2])
        rate.set_yscale("log")  # servers span 100x: a linear axis flattens the slow ones
        concurrencies = sorted({p["concurrency"] for ps in series(entry).values() for p in ps})
        for ax in panels:
            ax.set_xscale("log", base=2)
            ax.set_xticks(concurrencies, [str(c) for c in concurrencies])
            ax.minorticks_off()
            ax.set_xlabel("concurrency (requests in flight)")
            ax.grid(True, which="both", alpha=0.3)
        rate.legend(fontsize=7)
    device = doc["gpu"].get("name") if doc["gpu"].get("available") else doc["config"]["device"]
    fig.suptitle(f"infermux GPU benchmark ({device}{', tiny' if doc['config']['tiny'] else ''})")
    fig.tight_layout()
    fig.savefig(output, dpi=110)
    print(f"wrote {output}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("json", type=Path, nargs="+")
    parser.add_argument("--output", type=Path, help="default: the first JSON's path with .png")
    args = parser.parse_args()
    docs = [json.loads(path.read_text()) for path in args.json]
    merged = docs[0]
    for doc in docs[1:]:
        merged["models"].update(doc["models"])
    plot(merged, args.output or args.json[0].with_suffix(".png"))


if __name__ == "__main__":
    main()
