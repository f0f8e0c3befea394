"""What metrics and tracing cost: `simple` over gRPC at concurrency 4 (issue 8's acceptance),
with metrics off, on (the default) and on with tracing (the default rate, 1 request in 1000),
measured by Triton's perf_analyzer on this machine.

With metrics on, perf_analyzer also scrapes ``/metrics`` every second (``--collect-metrics``),
as a Prometheus server would, only more often ("metrics, not scraped" separates the request
path's share from the scrapes', which include perf_analyzer parsing them on this machine); with tracing on, spans go over OTLP/HTTP to a
small receiver in this script that counts them. Configurations alternate over ``--rounds``
(``benchmarks/perf_analyzer/ab.py``); the medians and their ratio to "off" are written to
``benchmarks/results/observability/overhead.{json,md}``.

    python benchmarks/observability/overhead.py [--rounds 5] [--concurrency 4]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "perf_analyzer"))
from ab import ROOT, Config, alternate, medians  # a script beside its helper

from infermux.settings import builtin_repository

EXPORTS = {"requests": 0, "bytes": 0}


class Sink(BaseHTTPRequestHandler):
    """An OTLP/HTTP endpoint that accepts and counts what it is sent."""

    def do_POST(self) -> None:
        size = int(self.headers.get("content-length", 0))
        self.rfile.read(size)
        EXPORTS["requests"] += 1
        EXPORTS["bytes"] += size
        self.send_response(200)
        self.send_header("content-length", "0")
        self.end_headers()

    def log_message(self, format: str, *args: object) -> None:
        pass


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--concurrency", default="4")
    p.add_argument("--modes", default="grpc")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "observability")
    p.add_argument("--work", type=Path, default=Path("/tmp/infermux-overhead"))
    args = p.parse_args()
    sink = ThreadingHTTPServer(("127.0.0.1", 0), Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{sink.server_address[1]}/v1/traces"
    base = f"--frontends 1 --model-repository {builtin_repository()}"
    scrape = {"PA_METRICS": "1"}
    configs = [
        Config("off", f"{base} --allow-metrics false"),
        Config("metrics, not scraped", base),
        Config("metrics", base, scrape),
        Config(
            "metrics+tracing",
            f"{base} --trace-config mode=opentelemetry --trace-config opentelemetry,url={url}",
            scrape,
        ),
    ]
    levels = [int(c) for c in args.concurrency.split(",")]
    runs = alternate(configs, levels, args.modes, args.rounds, args.work)
    sink.shutdown()
    rows = []
    for mode in args.modes.split():
        for c in levels:
            cells = {cfg.label: medians(runs, f"{mode}|{cfg.label}|{c}") for cfg in configs}
            rows.append({"mode": mode, "concurrency": c, "configs": cells})
    doc = {
        "model": "simple",
        "cpus": os.cpu_count(),
        "rounds": args.rounds,
        "configs": {cfg.label: cfg.server_args for cfg in configs},
        "trace_exports": EXPORTS,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "overhead.json").write_text(json.dumps(doc, indent=2) + "\n")
    lines = [
        f"# Metrics and tracing overhead: `simple`, perf_analyzer ({os.cpu_count()} cores, "
        f"median of {args.rounds} alternating rounds)",
        "",
        "| protocol | c | configuration | infer/s | vs off | p50 µs | p99 µs | runs (infer/s) |",
        "|---|---:|---|---:|---:|---:|---:|---|",
    ]
    for row in rows:
        off = row["configs"].get("off")
        for label, cell in row["configs"].items():
            if not cell:
                lines.append(f"| {row['mode']} | {row['concurrency']} | {label} | (failed) ||||")
                continue
            ratio = cell["throughput_infer_per_s"] / off["throughput_infer_per_s"] if off else 0
            each = ", ".join(f"{x:,.0f}" for x in cell["runs"])
            lines.append(
                f"| {row['mode']} | {row['concurrency']} | {label} | "
                f"{cell['throughput_infer_per_s']:,.0f} | {ratio:.3f} | {cell['p50_us']:,.0f} | "
                f"{cell['p99_us']:,.0f} | {each} |"
            )
    lines += ["", f"Trace exports received: {EXPORTS['requests']} ({EXPORTS['bytes']:,} bytes)."]
    (args.out / "overhead.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
