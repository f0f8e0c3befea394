"""Two or more source trees of infermux, each serving ``simple`` in turn, measured by Triton's
perf_analyzer on this machine: a change's effect on the CPU path, in one run.

Each ``--src NAME=DIR`` (a checkout's ``src``, e.g. ``git archive OLD src | tar -x -C /tmp/old``)
is put first on the server's ``PYTHONPATH``; the rounds alternate the trees and reverse their
order every other round (``ab.py``), and the median over rounds is reported with each tree's
ratio to the first. Issue 24's CPU guard is ``--modes grpc --concurrency 4``: `simple` over gRPC
at c=4 within 5% of the tree before a change.

    python benchmarks/perf_analyzer/ab_trees.py --src base=/tmp/old/src --src head=src
        [--modes grpc] [--concurrency 4] [--server-args ""] [--rounds 4] [--name simple_grpc_c4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from ab import ROOT, Config, alternate, medians  # a script beside its helper


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--src", action="append", required=True, metavar="NAME=DIR")
    p.add_argument("--modes", default="grpc")
    p.add_argument("--concurrency", default="4")
    p.add_argument("--server-args", default="")
    p.add_argument("--rounds", type=int, default=4)
    p.add_argument("--name", default="simple_grpc_c4")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "frontends")
    p.add_argument("--work", type=Path, default=Path("/tmp/infermux-ab-trees"))
    args = p.parse_args()
    trees = [entry.split("=", 1) for entry in args.src]
    configs = [
        Config(name, args.server_args, env={"PYTHONPATH": str(Path(d).resolve())})
        for name, d in trees
    ]
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = alternate(configs, levels, args.modes, args.rounds, args.work)
    rows: list[dict[str, Any]] = []
    for mode in args.modes.split():
        for c in levels:
            cells = {name: medians(runs, f"{mode}|{name}|{c}") for name, _ in trees}
            rows.append({"mode": mode, "concurrency": c, "trees": cells})
    doc = {
        "model": "simple",
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "server_args": args.server_args,
        "trees": dict(trees),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.name}.json").write_text(json.dumps(doc, indent=2) + "\n")
    first = trees[0][0]
    lines = [
        f"# `simple` per source tree ({os.cpu_count()} cores, perf_analyzer, median of "
        f"{args.rounds} alternating rounds{', ' + args.server_args if args.server_args else ''})",
        "",
        "| protocol | c | tree | infer/s | ÷ " + first + " | p50 µs | p99 µs | runs (infer/s) |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        base = row["trees"].get(first)
        for name, cell in row["trees"].items():
            if cell is None:
                lines.append(f"| {row['mode']} | {row['concurrency']} | {name} | (failed) ||||")
                continue
            ratio = (
                f"{cell['throughput_infer_per_s'] / base['throughput_infer_per_s']:.3f}"
                if base
                else "—"
            )
            spread = ", ".join(f"{r:,.0f}" for r in cell["runs"])
            lines.append(
                f"| {row['mode']} | {row['concurrency']} | {name} | "
                f"{cell['throughput_infer_per_s']:,.0f} | {ratio} | {cell['p50_us']:,.0f} | "
                f"{cell['p99_us']:,.0f} | {spread} |"
            )
    (args.out / f"{args.name}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
