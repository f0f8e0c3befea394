"""Scale-out overhead: one infermux serving a model, against infermux serving the same model on
Ray Serve (``infermux serve --ray``, one replica) on the same machine, driven by the same client
(``infermux bench``, HTTP and gRPC, closed loop at each concurrency). Reported as ratios
(Ray / single) of throughput and of p50 / p99 latency, for a model that does nothing (``simple``:
the whole difference is the hop through Ray) and one that computes (a 2 ms Python model: the hop
against real work). Issue 12.

    python benchmarks/scale_out/ray_overhead.py [--concurrency 1,8] [--seconds 3]

It starts (and stops) a one-node Ray cluster itself, with ``ray start --head``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"ready: HTTP on http://([^:]+):(\d+), gRPC on ([0-9.]+):(\d+)")
WORK_MODEL = """
import time


class Model:
    def execute(self, requests):
        time.sleep(0.002)  # a fixed 2 ms of model time per batch
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""


def repository() -> Path:
    root = Path(tempfile.mkdtemp(prefix="scaleout-"))
    shutil.copytree(ROOT / "src/infermux/examples/model_repository/simple", root / "simple")
    (root / "work" / "1").mkdir(parents=True)
    (root / "work" / "1" / "model.py").write_text(WORK_MODEL)
    (root / "work" / "config.pbtxt").write_text(
        'name: "work"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 16 ] } ]\n'
        "dynamic_batching { }\n"
    )
    return root


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start(repo: Path, *extra: str) -> tuple[subprocess.Popen[str], str, str]:
    command = [sys.executable, "-m", "infermux", "serve", "--model-repository", str(repo)]
    command += ["--http-port", "0", "--grpc-port", "0", "--metrics-port", "-1", "--frontends", "1"]
    server = subprocess.Popen(
        [*command, *extra], stderr=subprocess.PIPE, text=True, start_new_session=True
    )
    assert server.stderr is not None
    for line in server.stderr:
        match = READY.search(line)
        if match:
            return (
                server,
                f"{match.group(1)}:{match.group(2)}",
                f"{match.group(3)}:{match.group(4)}",
            )
    raise SystemExit("the server did not start")


def stop(server: subprocess.Popen[str]) -> None:
    os.killpg(server.pid, signal.SIGTERM)
    server.wait(120)


def bench(url: str, protocol: str, model: str, concurrency: int, seconds: float) -> dict[str, Any]:
    out = Path(tempfile.mkdtemp()) / "r.json"
    subprocess.run(
        [sys.executable, "-m", "infermux", "bench", model, "-u", url, "-i", protocol,
         "--concurrency-range", str(concurrency), "-p", str(seconds), "--warmup", "1",
         "--max-trials", "6", "--json", str(out)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    level = json.loads(out.read_text())["levels"][0]
    return {
        "throughput": level["requests_per_s"],
        "p50_us": level["latency_us"]["p50"],
        "p99_us": level["latency_us"]["p99"],
        "failures": level["failures"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--concurrency", default="1,8")
    p.add_argument("--seconds", type=float, default=3.0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "scale_out")
    args = p.parse_args()
    levels = [int(c) for c in args.concurrency.split(",")]
    repo = repository()
    ray = str(Path(sys.executable).parent / "ray")
    port = free_port()
    env = dict(os.environ, RAY_USAGE_STATS_ENABLED="0")
    subprocess.run([ray, "start", "--head", f"--port={port}", "--include-dashboard=false",
                    "--disable-usage-stats"], check=True, capture_output=True, env=env)  # fmt: skip
    results: list[dict[str, Any]] = []
    try:
        for mode, extra in (("single", ()), ("ray", ("--ray", f"127.0.0.1:{port}"))):
            server, http_url, grpc_url = start(repo, *extra)
            try:
                for model in ("simple", "work"):
                    for protocol, url in (("http", http_url), ("grpc", grpc_url)):
                        for c in levels:
                            row = bench(url, protocol, model, c, args.seconds)
                            results.append({"mode": mode, "model": model, "protocol": protocol,
                                            "concurrency": c, **row})  # fmt: skip
                            print(results[-1], flush=True)
            finally:
                stop(server)
    finally:
        subprocess.run([ray, "stop", "--force"], capture_output=True, env=env, check=False)
    rows = ["| model | protocol | c | single req/s | Ray req/s | throughput Ray/single | "
            "p50 Ray/single | p99 Ray/single |", "|---|---|---:|---:|---:|---:|---:|---:|"]  # fmt: skip
    for r in (r for r in results if r["mode"] == "single"):
        twin = next(x for x in results if x["mode"] == "ray" and
                    (x["model"], x["protocol"], x["concurrency"]) ==
                    (r["model"], r["protocol"], r["concurrency"]))  # fmt: skip
        rows.append(
            f"| {r['model']} | {r['protocol']} | {r['concurrency']} | {r['throughput']:.0f} | "
            f"{twin['throughput']:.0f} | {twin['throughput'] / r['throughput']:.2f} | "
            f"{twin['p50_us'] / r['p50_us']:.2f} | {twin['p99_us'] / r['p99_us']:.2f} |"
        )
    summary = {"cores": len(os.sched_getaffinity(0)), "time": time.strftime("%Y-%m-%d %H:%M"),
               "results": results}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_overhead.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "ray_overhead.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
