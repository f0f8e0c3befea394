"""What the process hop costs one request: the data plane called in process, against the same
data plane behind a front-end channel in another process (``RemoteDataPlane`` -> shared-memory
ring and arena -> ``ChannelServer`` in an executor process -> back).

No network and no codec: both sides are measured at the data-plane seam, on a no-op model
(``simple_identity``, a python model that returns its input), one request at a time, so the
difference of the two latency distributions is the hop alone. Issue 7's target: <= 50 us p50.

    python benchmarks/frontends/hop.py [--requests 5000] [--out benchmarks/results/frontends]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from infermux.dataplane.assembly import build_dataplane, build_repository, server_metadata
from infermux.ipc import Channel, ChannelSpec
from infermux.processes.common import run
from infermux.settings import ServerSettings, builtin_repository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import InferRequest, Tensor

SETTINGS = ServerSettings(model_repositories=(builtin_repository(),))
MODEL = "simple_identity"


def request() -> InferRequest:
    data = np.array([[b"infermux"] * 16], dtype=np.object_)
    return InferRequest(MODEL, "", [Tensor("INPUT0", "BYTES", (1, 16), data)])


def executor(spec: ChannelSpec, ready: Any, stop: Any) -> None:
    async def main() -> None:
        repository = build_repository(SETTINGS)
        await repository.start()
        server = ChannelServer(build_dataplane(SETTINGS, repository))
        server.attach(spec)
        ready.set()
        await asyncio.to_thread(stop.wait)
        await server.close()
        await repository.close()

    run(main())


async def measure(call: Any, n: int) -> list[float]:
    for _ in range(200):  # warm-up
        await call(request())
    times = []
    for _ in range(n):
        r = request()
        t0 = time.perf_counter_ns()
        await call(r)
        times.append((time.perf_counter_ns() - t0) / 1000)
    return times


def summary(times: list[float]) -> dict[str, float]:
    q = statistics.quantiles(times, n=100)
    return {"p50_us": round(q[49], 1), "p90_us": round(q[89], 1), "p99_us": round(q[98], 1)}


async def bench(n: int, spec: ChannelSpec) -> dict[str, Any]:
    repository = build_repository(SETTINGS)
    await repository.start()
    local = build_dataplane(SETTINGS, repository)
    remote = RemoteDataPlane(server_metadata(SETTINGS))
    remote.attach(spec)
    rounds = []
    for _ in range(3):  # alternate, so drift hits both alike
        rounds.append((await measure(local.infer, n), await measure(remote.infer, n)))
    remote.detach("done")
    await repository.close()
    in_process = [t for a, _ in rounds for t in a]
    hopped = [t for _, b in rounds for t in b]
    a, b = summary(in_process), summary(hopped)
    return {
        "in_process": a,
        "through_executor_process": b,
        "hop_p50_us": round(b["p50_us"] - a["p50_us"], 1),
        "hop_p99_us": round(b["p99_us"] - a["p99_us"], 1),
        "requests_per_side": len(in_process),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--requests", type=int, default=5000)
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/frontends"))
    args = p.parse_args()
    context = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as directory:
        channel = Channel(Path(directory), ring_bytes=1 << 20, arena_bytes=16 << 20)
        ready, stop = context.Event(), context.Event()
        child = context.Process(target=executor, args=(channel.spec, ready, stop))
        child.start()
        ready.wait(120)
        result: dict[str, Any] = {}

        async def go() -> None:
            result.update(await bench(args.requests, channel.spec))

        run(go())
        stop.set()
        child.join(30)
        channel.close()
    result["host"] = {"cpus": os.cpu_count(), "machine": platform.machine()}
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"hop_{os.cpu_count()}core"
    (args.out / f"{name}.json").write_text(json.dumps(result, indent=2) + "\n")
    a, b = result["in_process"], result["through_executor_process"]
    table = (
        f"| path ({os.cpu_count()} cores) | p50 µs | p90 µs | p99 µs |\n|---|---:|---:|---:|\n"
        f"| data plane in process | {a['p50_us']} | {a['p90_us']} | {a['p99_us']} |\n"
        f"| through the executor process | {b['p50_us']} | {b['p90_us']} | {b['p99_us']} |\n"
        f"| **hop** (difference) | **{result['hop_p50_us']}** | | {result['hop_p99_us']} |\n"
    )
    (args.out / f"{name}.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
