"""Does ``infermux bench`` measure what perf_analyzer measures? Both drive the same
``infermux serve`` (model `simple`), alternating, over HTTP and gRPC at several concurrency
levels, for ``--rounds`` rounds; medians and the ratio infermux bench / perf_analyzer of
throughput and p50/p99 latency go to ``benchmarks/results/bench_agreement/`` (target: within 10%).

    python benchmarks/bench_agreement/agreement.py [--rounds 3] [--concurrency 1,4,16]
        [--perf-analyzer /tmp/pa/perf_analyzer] [--server-args "--frontends 1"] [--model mlp]

``--model mlp`` serves the peers' small MLP (``benchmarks/peers/mlp.py``, TorchScript through the
PyTorch backend, dynamic batching with 500 µs delay) instead of `simple`.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"ready: HTTP on http://([^:]+):(\d+), gRPC on [^:]+:(\d+)")


def start(server_args: str, repository: Path) -> tuple[subprocess.Popen[str], str, str]:
    command = [sys.executable, "-m", "infermux", "serve", "--http-port", "0", "--grpc-port", "0"]
    command += ["--metrics-port", "0", *server_args.split(), "--model-repository", str(repository)]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert process.stderr is not None
    for line in process.stderr:
        match = READY.search(line)
        if match:
            return (
                process,
                f"{match.group(1)}:{match.group(2)}",
                f"{match.group(1)}:{match.group(3)}",
            )
    raise RuntimeError("server did not start")


def perf_analyzer(
    pa: str, model: str, url: str, protocol: str, concurrency: int, *, work: Path
) -> dict[str, float]:
    out = work / f"pa-{protocol}-{concurrency}.csv"
    done = subprocess.run(
        [pa, "-m", model, "-i", protocol, "-u", url, "--concurrency-range", str(concurrency),
         "-p", "2000", "--max-trials", "10", "-f", str(out)],
        check=False, capture_output=True, text=True, timeout=300,
    )  # fmt: skip
    if not out.exists():
        raise RuntimeError(f"perf_analyzer wrote no CSV (exit {done.returncode}): "
                           f"{(done.stdout + done.stderr)[-1500:]}")  # fmt: skip
    with out.open() as f:
        row = next(csv.DictReader(f))
    return {
        "throughput": float(row["Inferences/Second"]),
        "p50_us": float(row["p50 latency"]),
        "p99_us": float(row["p99 latency"]),
    }


def infermux_bench(
    model: str, url: str, protocol: str, concurrency: int, *, work: Path, processes: int
) -> dict[str, float]:
    out = work / f"ib-{protocol}-{concurrency}.json"
    subprocess.run(
        [sys.executable, "-m", "infermux", "bench", model, "-i", protocol, "-u", url,
         "--concurrency-range", str(concurrency), "-p", "2", "--max-trials", "10",
         "--processes", str(processes), "--json", str(out)],
        check=False, capture_output=True, timeout=300,
    )  # fmt: skip
    level = json.loads(out.read_text())["levels"][0]
    return {
        "throughput": level["inferences_per_s"],
        "p50_us": level["latency_us"]["p50"],
        "p99_us": level["latency_us"]["p99"],
        "client_cpu_cores": level["client_cpu_cores"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--concurrency", default="1,4,16")
    p.add_argument("--protocols", default="http,grpc")
    p.add_argument("--perf-analyzer", default="/tmp/pa/perf_analyzer")
    p.add_argument("--server-args", default="")
    p.add_argument(
        "--processes", type=int, default=0,
        help="infermux bench --processes (default: one per 4 in-flight requests, at most 4)",
    )  # fmt: skip
    p.add_argument("--model", choices=("simple", "mlp"), default="simple")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "bench_agreement")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="agreement-"))
    repository = ROOT / "src" / "infermux" / "examples" / "model_repository"
    if args.model == "mlp":
        sys.path.insert(0, str(ROOT / "benchmarks" / "peers"))
        import mlp

        repository = mlp.infermux_repository(work / "repository", repository / "simple")
    process, http, grpc = start(args.server_args, repository)
    runs: dict[str, list[dict[str, float]]] = {}
    try:
        time.sleep(1)
        for r in range(args.rounds):
            for protocol in args.protocols.split(","):
                url = grpc if protocol == "grpc" else http
                for c in (int(v) for v in args.concurrency.split(",")):
                    tools = ("pa", "ib") if r % 2 == 0 else ("ib", "pa")
                    for tool in tools:
                        if tool == "pa":
                            result = perf_analyzer(
                                args.perf_analyzer, args.model, url, protocol, c, work=work
                            )
                        else:
                            processes = args.processes or max(1, min(4, c // 4))
                            result = infermux_bench(
                                args.model, url, protocol, c, work=work, processes=processes
                            )
                        runs.setdefault(f"{tool}|{protocol}|{c}", []).append(result)
                        print(
                            f"round {r} {tool} {protocol} c={c}: {result['throughput']:,.0f}/s",
                            flush=True,
                        )
    finally:
        stop_group(process, 60)
    rows = []
    for protocol in args.protocols.split(","):
        for c in (int(v) for v in args.concurrency.split(",")):
            cell: dict[str, Any] = {"protocol": protocol, "concurrency": c}
            for tool in ("pa", "ib"):
                results = runs.get(f"{tool}|{protocol}|{c}", [])
                for key in ("throughput", "p50_us", "p99_us"):
                    cell[f"{tool}_{key}"] = (
                        statistics.median(x[key] for x in results) if results else float("nan")
                    )
                cell[f"{tool}_runs"] = [round(x["throughput"]) for x in results]
            cell["ib_client_cpu_cores"] = statistics.median(
                x["client_cpu_cores"]
                for x in runs.get(f"ib|{protocol}|{c}", [{"client_cpu_cores": float("nan")}])
            )
            for key in ("throughput", "p50_us", "p99_us"):
                cell[f"ratio_{key}"] = cell[f"ib_{key}"] / cell[f"pa_{key}"]
            rows.append(cell)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "server_args": args.server_args,
        "model": args.model,
        "rows": rows,
    }
    stem = f"agreement-{os.cpu_count()}cores" + ("" if args.model == "simple" else f"-{args.model}")
    (args.out / f"{stem}.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# infermux bench vs perf_analyzer on one `infermux serve` (`{args.model}`, {os.cpu_count()} cores, "
        f"median of {args.rounds} alternating rounds; server args: `{args.server_args or 'default'}`)",
        "",
        "| protocol | c | perf_analyzer infer/s | infermux bench infer/s | ratio | PA p50 µs | IB p50 µs | ratio | PA p99 µs | IB p99 µs | ratio | IB client CPU (cores) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['protocol']} | {row['concurrency']} | {row['pa_throughput']:,.0f} | {row['ib_throughput']:,.0f} | "
            f"{row['ratio_throughput']:.2f} | {row['pa_p50_us']:,.0f} | {row['ib_p50_us']:,.0f} | {row['ratio_p50_us']:.2f} | "
            f"{row['pa_p99_us']:,.0f} | {row['ib_p99_us']:,.0f} | {row['ratio_p99_us']:.2f} | {row['ib_client_cpu_cores']:.2f} |"
        )
    (args.out / f"{stem}.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
