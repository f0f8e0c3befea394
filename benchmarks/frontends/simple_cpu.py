"""`simple` (INT32 add/sub, 2x[16]) over gRPC and HTTP with 1 and 2 front-end processes, measured
by Triton's perf_analyzer on this machine (issue 7, item 5).

Each (front ends, concurrency) point runs ``benchmarks/perf_analyzer/run.sh`` (which starts the
server, waits until it is ready and drives it), alternating N = 1 and N = 2 over ``--rounds``
rounds so that drift on this noisy machine hits both alike; the median over rounds is reported,
with the ratio N=2 / N=1.

    python benchmarks/frontends/simple_cpu.py [--rounds 2] [--concurrency 1,8]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf_analyzer"))
from ab import ROOT, Config, alternate, medians  # a script beside its helper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--modes", default="grpc http")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "frontends")
    p.add_argument("--work", type=Path, default=Path("/tmp/infermux-simple-cpu"))
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    configs = [Config(f"n{n}", f"--frontends {n}") for n in (1, 2)]
    runs = alternate(configs, levels, args.modes, args.rounds, args.work)
    rows = []
    for mode in args.modes.split():
        for c in levels:
            cells: dict[int, Any] = {}
            for frontends in (1, 2):
                cell = medians(runs, f"{mode}|n{frontends}|{c}")
                if cell:
                    cells[frontends] = cell
            rows.append({"mode": mode, "concurrency": c, "frontends": cells})
    doc = {"model": "simple", "cpus": os.cpu_count(), "rounds": args.rounds, "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "simple_cpu.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# `simple` with 1 and 2 front-end processes ({os.cpu_count()} cores, perf_analyzer, "
        f"median of {args.rounds} alternating rounds)",
        "",
        "| protocol | c | N=1 infer/s | N=2 infer/s | N=2 / N=1 | N=1 p50 µs | N=2 p50 µs | "
        "N=1 p99 µs | N=2 p99 µs |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        one, two = row["frontends"].get(1), row["frontends"].get(2)
        if not one or not two:
            lines.append(f"| {row['mode']} | {row['concurrency']} | (failed) |||||||")
            continue
        ratio = two["throughput_infer_per_s"] / one["throughput_infer_per_s"]
        lines.append(
            f"| {row['mode']} | {row['concurrency']} | {one['throughput_infer_per_s']:,.0f} | "
            f"{two['throughput_infer_per_s']:,.0f} | {ratio:.2f} | {one['p50_us']:,.0f} | "
            f"{two['p50_us']:,.0f} | {one['p99_us']:,.0f} | {two['p99_us']:,.0f} |"
        )
    (args.out / "simple_cpu.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
