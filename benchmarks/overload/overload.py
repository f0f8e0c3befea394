"""Overload: what admitted requests see, and how fast the excess is refused, at 3x capacity
(issue 11; targets: admitted p99 ≤ 2x the p99 at normal load, refusals in < 1 ms).

A model with a fixed service time (a Python model sleeping ``--service-ms`` per request, one
instance, batches of one) bounds its queue with Triton's ``default_queue_policy {
max_queue_size }``. The client (asyncio + aiohttp, one task per request, open loop at a
constant rate) measures: capacity (closed loop, 4 in flight), then a normal phase at half of
it, then an overload phase at 3x. Each phase reports the admitted requests' latency and the
refused ones' (HTTP 503), client-side, so a refusal's time includes the HTTP round trip.

    python benchmarks/overload/overload.py [--service-ms 5] [--queue 2] [--seconds 10]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import stop_group

ROOT = Path(__file__).resolve().parents[2]
READY = re.compile(r"ready: HTTP on http://([^:]+):(\d+)")
MODEL = """
import time


class Model:
    def execute(self, requests):
        time.sleep(SERVICE_S * len(requests))  # a fixed cost per request
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""
BODY = json.dumps(
    {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 4], "data": [1, 2, 3, 4]}]}
).encode()


def repository(service_ms: float, queue: int) -> Path:
    root = Path(tempfile.mkdtemp(prefix="overload-"))
    model = root / "fixed" / "1"
    model.mkdir(parents=True)
    (model / "model.py").write_text(MODEL.replace("SERVICE_S", str(service_ms / 1000)))
    (root / "fixed" / "config.pbtxt").write_text(
        'name: "fixed"\nbackend: "python"\nmax_batch_size: 1\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 0 "
        f"default_queue_policy {{ max_queue_size: {queue} }} }}\n"
        "instance_group [ { count: 1, kind: KIND_CPU } ]\n"
    )
    return root


async def one(session: aiohttp.ClientSession, url: str, out: list[tuple[int, float]]) -> None:
    started = time.perf_counter()
    try:
        async with session.post(url, data=BODY) as response:
            await response.read()
            status = response.status
    except aiohttp.ClientError:
        status = 0
    out.append((status, time.perf_counter() - started))


async def closed(url: str, seconds: float, inflight: int) -> float:
    done: list[tuple[int, float]] = []
    async with aiohttp.ClientSession() as session:
        end = time.perf_counter() + seconds

        async def slot() -> None:
            while time.perf_counter() < end:
                await one(session, url, done)

        await asyncio.gather(*(slot() for _ in range(inflight)))
    return sum(1 for s, _ in done if s == 200) / seconds


async def open_loop(url: str, rate: float, seconds: float) -> list[tuple[int, float]]:
    done: list[tuple[int, float]] = []
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = []
        start = time.perf_counter()
        for i in range(int(rate * seconds)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            tasks.append(asyncio.create_task(one(session, url, done)))
        await asyncio.gather(*tasks)
    return done


async def failures(stats_url: str) -> tuple[int, int]:
    """(count, total ns) of the model's failed requests, from the statistics extension: the
    server's own time for a refusal, from arrival to answer, without the client's round trip."""
    async with aiohttp.ClientSession() as session, session.get(stats_url) as response:
        doc = await response.json()
    fail = doc["model_stats"][0]["inference_stats"]["fail"]
    return int(fail["count"]), int(fail["ns"])


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {"count": 0}
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))] * 1000

    return {
        "count": len(values),
        "p50_ms": at(0.50),
        "p99_ms": at(0.99),
        "max_ms": ordered[-1] * 1000,
    }


def phase(results: list[tuple[int, float]]) -> dict[str, Any]:
    return {
        "admitted": percentiles([t for s, t in results if s == 200]),
        "refused": percentiles([t for s, t in results if s == 503]),
        "other": sorted({s for s, _ in results if s not in (200, 503)}),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--service-ms", type=float, default=5.0)
    p.add_argument("--queue", type=int, default=2)
    p.add_argument("--seconds", type=float, default=10.0)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results" / "overload")
    args = p.parse_args()
    command = [sys.executable, "-m", "infermux", "serve", "--http-port", "0", "--grpc-port", "0",
               "--metrics-port", "0", "--frontends", "1",
               "--model-repository", str(repository(args.service_ms, args.queue))]  # fmt: skip
    server = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, start_new_session=True)
    assert server.stderr is not None
    url = ""
    for line in server.stderr:
        match = READY.search(line)
        if match:
            url = f"http://{match.group(1)}:{match.group(2)}/v2/models/fixed/infer"
            break
    try:
        capacity = asyncio.run(closed(url, 3, 4))
        normal = phase(asyncio.run(open_loop(url, capacity / 2, args.seconds)))
        stats_url = url.replace("/infer", "/stats")
        before = asyncio.run(failures(stats_url))
        overload = phase(asyncio.run(open_loop(url, capacity * 3, args.seconds)))
        after = asyncio.run(failures(stats_url))
    finally:
        stop_group(server, 60)
    ratio = overload["admitted"]["p99_ms"] / normal["admitted"]["p99_ms"]
    refused = after[0] - before[0]
    server_refusal_us = (after[1] - before[1]) / refused / 1000 if refused else float("nan")
    overload["server_refusal_mean_us"] = server_refusal_us
    result = {"cpus": os.cpu_count(), "service_ms": args.service_ms, "queue": args.queue,
              "seconds": args.seconds, "capacity_per_s": capacity, "normal": normal,
              "overload": overload, "admitted_p99_ratio": ratio}  # fmt: skip
    args.out.mkdir(parents=True, exist_ok=True)
    stem = f"overload-queue{args.queue}-{os.cpu_count()}cores"
    (args.out / f"{stem}.json").write_text(json.dumps(result, indent=1) + "\n")
    a, r, n = overload["admitted"], overload["refused"], normal["admitted"]
    text = (
        f"# Overload at 3x capacity ({os.cpu_count()} cores; {args.service_ms:g} ms per request, "
        f"one instance, max_queue_size {args.queue}; {args.seconds:g} s per phase)\n\n"
        f"Capacity (closed loop, 4 in flight): {capacity:,.0f} req/s. Normal = open loop at half "
        f"of it ({capacity / 2:,.0f}/s), overload at 3x ({capacity * 3:,.0f}/s).\n\n"
        "| phase | admitted | admitted p50 ms | admitted p99 ms | refused (503) | refused p50 ms "
        "| refused p99 ms |\n|---|---:|---:|---:|---:|---:|---:|\n"
        f"| normal | {n['count']:,} | {n['p50_ms']:.2f} | {n['p99_ms']:.2f} | "
        f"{normal['refused']['count']:,} | - | - |\n"
        f"| 3x capacity | {a['count']:,} | {a['p50_ms']:.2f} | {a['p99_ms']:.2f} | "
        f"{r['count']:,} | {r.get('p50_ms', float('nan')):.2f} | "
        f"{r.get('p99_ms', float('nan')):.2f} |\n\n"
        f"Admitted p99 at 3x / at normal load: **{ratio:.2f}x** (target ≤ 2). Refusals take "
        f"**{server_refusal_us:.0f} µs** in the server on average (statistics extension, "
        f"{refused:,} failed requests; target < 1 ms); the refusal times in the table are "
        "client-side round trips (aiohttp on the same cores).\n"
    )
    (args.out / f"{stem}.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
