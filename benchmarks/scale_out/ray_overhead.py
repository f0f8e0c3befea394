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
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

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
    stop_group(server, 120)


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


FLOOR = """
import asyncio, json, sys, time
import ray
from ray import serve

ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
serve.start(proxy_location="Disabled")


@serve.deployment(num_replicas=1, max_ongoing_requests=64, ray_actor_options={"num_cpus": 1})
class Echo:
    async def __call__(self, x):
        return x


serve.run(Echo.bind(), name="floor", route_prefix=None)
handle = serve.get_deployment_handle("Echo", "floor")


async def level(concurrency, seconds):
    latencies = []
    end = time.perf_counter() + seconds

    async def loop():
        while time.perf_counter() < end:
            start = time.perf_counter()
            await handle.remote(b"x" * 64)
            latencies.append(time.perf_counter() - start)

    await asyncio.gather(*(loop() for _ in range(concurrency)))
    latencies.sort()
    return {"concurrency": concurrency, "throughput": len(latencies) / seconds,
            "p50_us": latencies[len(latencies) // 2] * 1e6,
            "p99_us": latencies[int(len(latencies) * 0.99)] * 1e6}


async def main():
    await level(1, 1.0)
    print(json.dumps([await level(int(c), float(sys.argv[3])) for c in sys.argv[2].split(",")]))


asyncio.run(main())
serve.delete("floor")
"""


def ray_floor(address: str, levels: list[int], seconds: float) -> list[dict[str, Any]]:
    """Ray Serve's own handle round trip (an echo deployment, no infermux): the floor under the
    Ray rows, measured by a driver process like the ingress."""
    out = subprocess.run(
        [sys.executable, "-c", FLOOR, address, ",".join(map(str, levels)), str(seconds)],
        check=True, capture_output=True, text=True,
    )  # fmt: skip
    rows: list[dict[str, Any]] = json.loads(out.stdout.strip().splitlines()[-1])
    return rows


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
    # The cluster's own token (Ray turns token auth on when ~/.ray/auth_token exists, and then
    # every client must say so); the server inherits it.
    os.environ.update(
        RAY_USAGE_STATS_ENABLED="0", RAY_AUTH_MODE="token", RAY_AUTH_TOKEN=secrets.token_hex(32)
    )
    env = dict(os.environ)
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
        floor = ray_floor(f"127.0.0.1:{port}", levels, args.seconds)
        print("Ray Serve handle alone:", floor, flush=True)
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
    rows += ["", "Ray Serve's own handle round trip (echo deployment, same driver set-up):", "",
             "| c | req/s | p50 µs | p99 µs |", "|---:|---:|---:|---:|"]  # fmt: skip
    rows += [
        f"| {f['concurrency']} | {f['throughput']:.0f} | {f['p50_us']:.0f} | {f['p99_us']:.0f} |"
        for f in floor
    ]
    summary = {"cores": len(os.sched_getaffinity(0)), "time": time.strftime("%Y-%m-%d %H:%M"),
               "results": results, "ray_handle_floor": floor}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ray_overhead.json").write_text(json.dumps(summary, indent=2) + "\n")
    (args.out / "ray_overhead.md").write_text("\n".join(rows) + "\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
