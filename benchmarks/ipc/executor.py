"""What does the executor process spend per request and per batch, apart from the model?

The GPU benchmark (``benchmarks/gpu``) reads the executor's CPU per request under real clients,
but on a 2-core machine the front ends, the client and the executor share the cores and the
figures swing by ±30%. This harness keeps only the two ends of one channel: the executor (the
production :class:`~infermux.transport.channel_server.ChannelServer` over the data plane
``build_dataplane`` makes, on core 0) and one front end's
:class:`~infermux.transport.remote_plane.RemoteDataPlane` (core 1) with ``--concurrency``
batch-1 requests in flight, which it groups into micro-batches as a front end does. The model is
a TorchScript ``Linear(64, 16)`` on the CPU (two instances, ``max_batch_size`` 64, 500 µs queue
delay), so the executor's own work (frames, batching, stacking, instances, answers, doorbells)
dominates its CPU time.

Per point: requests/s, executor CPU µs per request and per model execution (``/proc`` CPU time
over the window, all its threads: the model's forward is in it too), the average batch, and the
front end's CPU µs per request. ``--src NAME=DIR`` (repeatable) runs each point for each source
tree (``DIR``: a checkout's ``src``), alternating trees and their order every round, so that
a change's A/B is one run; the medians over ``--rounds`` are reported. ``--cprofile FILE`` runs
one point with the executor under cProfile and tables its CPU per frame by stage.

    .venv/bin/python benchmarks/ipc/executor.py [--src base=/tmp/base/src --src head=src]
        [--concurrency 8,64,256] [--seconds 4] [--rounds 3] [--out benchmarks/results/ipc_executor.json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # benchmarks/: benchkit
from benchkit import proc_cpu_seconds

CONFIG = """name: "lin"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 64 ] } ]
output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 16 ] } ]
dynamic_batching { max_queue_delay_microseconds: 500 }
instance_group [ { count: 2, kind: KIND_CPU } ]
"""
WARMUP_S = 1.0
CPROFILE_ENV = "INFERMUX_BENCH_CPROFILE"
"""Set by ``--cprofile``: where the executor writes its cProfile statistics."""


def write_repository(root: Path) -> Path:
    import torch

    torch.manual_seed(0)
    jit: Any = torch.jit  # trace is unannotated
    model = jit.trace(torch.nn.Linear(64, 16).eval(), torch.zeros(1, 64))
    (root / "lin" / "1").mkdir(parents=True)
    (root / "lin" / "config.pbtxt").write_text(CONFIG)
    model.save(str(root / "lin" / "1" / "model.pt"))
    return root


# -- the executor (a child process) ---------------------------------------------------------------


def executor(repo: str, spec: Any, ready: Any, stop: Any) -> None:
    os.sched_setaffinity(0, {0})
    from infermux.processes.common import run

    profile_to = os.environ.get(CPROFILE_ENV)
    if not profile_to:
        run(_serve(Path(repo), spec, ready, stop))
        return
    import cProfile

    # Deterministic call counts per frame, at the price of ~2.4x the CPU per request (the
    # profiler's own): read the shares and the counts, not the absolute times.
    profile = cProfile.Profile()
    profile.enable()
    try:
        run(_serve(Path(repo), spec, ready, stop))
    finally:
        profile.disable()
        profile.dump_stats(profile_to)


async def _serve(repo: Path, spec: Any, ready: Any, stop: Any) -> None:
    from infermux.dataplane.assembly import build_dataplane, build_repository
    from infermux.settings import ServerSettings
    from infermux.transport.channel_server import ChannelServer

    settings = ServerSettings(model_repositories=(repo,))
    repository = build_repository(settings)
    await repository.start()
    plane = build_dataplane(settings, repository)
    server = ChannelServer(plane)
    server.attach(spec)
    try:  # as processes/executor.py does once ready (a tree from before it has no such module)
        from infermux.runtime import garbage
    except ImportError:
        pass
    else:
        garbage.settle()
    ready.send(True)
    loop = asyncio.get_running_loop()
    done = asyncio.Event()
    loop.add_reader(stop.fileno(), done.set)
    await done.wait()
    await server.close()
    plane.close()
    await repository.close()


# -- one point (the front end, in its own process per point) --------------------------------------


def point(repo: Path, concurrency: int, seconds: float, group: int) -> dict[str, float]:
    from infermux.ipc import Channel

    os.sched_setaffinity(0, {1})
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory() as fifo_dir:
        channel = Channel(Path(fifo_dir))
        ready_r, ready_w = ctx.Pipe(duplex=False)
        stop_r, stop_w = ctx.Pipe(duplex=False)
        child = ctx.Process(target=executor, args=(str(repo), channel.spec, ready_w, stop_r))
        child.start()
        try:
            if not ready_r.poll(120):
                raise RuntimeError("the executor did not start")
            assert child.pid is not None
            return asyncio.run(_drive(channel.spec, child.pid, concurrency, seconds, group))
        finally:
            stop_w.send(True)
            child.join(30)
            if child.is_alive():
                child.kill()
            channel.close()


async def _drive(
    spec: Any, pid: int, concurrency: int, seconds: float, group: int
) -> dict[str, float]:
    import numpy as np

    from infermux.transport.remote_plane import RemoteDataPlane
    from infermux.types import InferRequest, RequestedOutput, ServerMetadata, Tensor

    remote = RemoteDataPlane(ServerMetadata("infermux", "bench", ()), ready_timeout_s=30.0)
    remote.attach(spec)
    # A front end's micro-batches hold up to GROUP_LIMIT requests; under many front ends
    # each sees a few requests per loop turn, so the executor gets small frames: --group.
    remote._executors[0]._batches._group_limit = group
    for _ in range(600):
        if await remote.ready():
            break
        await asyncio.sleep(0.05)
    else:
        raise RuntimeError("the executor's channel did not get ready")
    rows = np.random.default_rng(0).random((1, 64), dtype=np.float32)
    request = InferRequest(
        "lin", "", [Tensor("INPUT__0", "FP32", (1, 64), rows)], [RequestedOutput("OUTPUT__0")]
    )
    answered = 0
    running = True

    async def client() -> None:
        nonlocal answered
        while running:
            response = await remote.infer(request)
            assert response.outputs[0].shape == (1, 16)
            answered += 1

    async def stats() -> tuple[int, int]:
        (model,) = await remote.model_statistics("lin")
        return model.inference_count, model.execution_count

    tasks = [asyncio.ensure_future(client()) for _ in range(concurrency)]
    await asyncio.sleep(WARMUP_S)
    start_answered, start_stats = answered, await stats()
    start, start_cpu, start_own = time.monotonic(), proc_cpu_seconds(pid), time.process_time()
    await asyncio.sleep(seconds)
    end_answered, end_cpu, end_own = answered, proc_cpu_seconds(pid), time.process_time()
    elapsed = time.monotonic() - start
    end_stats = await stats()
    running = False
    await asyncio.gather(*tasks)
    remote.detach("benchmark over")
    requests = max(end_answered - start_answered, 1)  # an idle point (c=0) reads cores only
    executions = end_stats[1] - start_stats[1]
    return {
        "requests_per_s": requests / elapsed,
        "executor_us_per_request": (end_cpu - start_cpu) * 1e6 / requests,
        "executor_us_per_execution": (end_cpu - start_cpu) * 1e6 / max(executions, 1),
        "executor_cores": (end_cpu - start_cpu) / elapsed,
        "average_batch": (end_stats[0] - start_stats[0]) / max(executions, 1),
        "frontend_us_per_request": (end_own - start_own) * 1e6 / requests,
    }


# -- the runs -------------------------------------------------------------------------------------


def run_point(
    src: str, repo: Path, concurrency: int, seconds: float, group: int
) -> dict[str, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([src, str(Path(__file__).parents[2])]))
    out = subprocess.run(
        [
            sys.executable,
            __file__,
            "--point",
            str(repo),
            str(concurrency),
            str(seconds),
            str(group),
        ],
        env=env,
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    reading: dict[str, float] = json.loads(out.strip().splitlines()[-1])
    return reading


KEYS = (
    "requests_per_s",
    "executor_us_per_request",
    "executor_us_per_execution",
    "executor_cores",
    "average_batch",
    "frontend_us_per_request",
)


# What the executor does per frame, by function: (file suffix, function name), as the profile
# names them. A frame is one Infer (a micro-batch of up to --group requests).
STAGES = {
    "frames taken off the ring, decoded, dispatched": ("channel_server.py", "_dispatch"),
    "  a task per frame, its deadline and done callback": ("channel_server.py", "_start_infer"),
    "  the frame's input tensors read from the arena": ("channel_server.py", "_request"),
    "the data plane: route, validate, queue, account": ("plane.py", "infer_many"),
    "  route": ("router.py", "route"),
    "  inputs checked against the config": ("inputs.py", "to_model_request"),
    "  queued with the batcher": ("batcher.py", "submit"),
    "  statistics": ("outcomes.py", "succeeded"),
    "the answer's tensors written into the arena": ("channel_server.py", "_place"),
    "frames written and doorbells rung": ("link.py", "send"),
    "the batcher: batches formed, run, completed": ("batcher.py", "_work"),
    "  outputs cut per request and checked": ("outputs.py", "to_output_tensors"),
}


def profile_point(src: str, concurrency: int, args: argparse.Namespace) -> None:
    import pstats

    os.environ[CPROFILE_ENV] = str(args.cprofile.resolve())
    with tempfile.TemporaryDirectory() as tmp:
        reading = run_point(src, write_repository(Path(tmp)), concurrency, args.seconds, args.group)
    stats: Any = pstats.Stats(str(args.cprofile))  # its stats table is untyped
    table = stats.stats
    total = sum(tottime for _, _, tottime, _, _ in table.values())

    def cumulative(suffix: str, name: str) -> tuple[int, float]:
        found = [
            (primitive, cumtime)
            for (path, _, function), (primitive, _, _, cumtime, _) in table.items()
            if function == name and path.endswith(suffix)
        ]
        return max(found, key=lambda item: item[1]) if found else (0, 0.0)

    frames, _ = cumulative("channel_server.py", "_start_infer")
    drains, _ = cumulative("channel_server.py", "_dispatch")
    lines = [
        f"# The executor under cProfile: c={concurrency}, --group {args.group}",
        "",
        f"{frames:,} frames ({frames / max(drains, 1):.1f} per drain of the ring), "
        f"{reading['average_batch']:.1f} requests per execution; under the "
        f"profiler {reading['executor_us_per_request']:.1f} µs of executor CPU per request "
        f"({total:.2f} s profiled). Cumulative time per frame (a coroutine's resumptions each "
        "count as a call).",
        "",
        "| stage | µs per frame | share of the profiled time |",
        "|---|---:|---:|",
    ]
    for label, (suffix, name) in STAGES.items():
        _, cumtime = cumulative(suffix, name)
        lines.append(f"| {label} | {cumtime / max(frames, 1) * 1e6:.1f} | {cumtime / total:.0%} |")
    loop_own = sum(
        tottime
        for (path, _, function), (_, _, tottime, _, _) in table.items()
        if function == "run" and path.endswith("runners.py")
    )
    lines.append(
        "| the event loop's own time (uvloop's C: callbacks, task steps, and its waits in "
        "epoll: cProfile times the wall clock) "
        f"| {loop_own / max(frames, 1) * 1e6:.1f} | {loop_own / total:.0%} |"
    )
    lines.append("")
    lines.append("Only the loop's thread is profiled (the model runs on its instance threads).")
    args.cprofile.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--src", action="append", default=[], metavar="NAME=DIR")
    parser.add_argument("--concurrency", default="8,64,256")
    parser.add_argument("--seconds", type=float, default=4.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/ipc_executor.json"))
    parser.add_argument(
        "--group", type=int, default=64, help="the front end's micro-batch limit (1: none)"
    )
    parser.add_argument(
        "--cprofile",
        type=Path,
        metavar="FILE",
        help="run one point (the first tree and concurrency) with the executor under cProfile; "
        "its statistics go to FILE, the hot path's calls per frame to FILE.md",
    )
    parser.add_argument("--point", nargs=4, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.point:
        repo, concurrency, seconds, group = args.point
        print(json.dumps(point(Path(repo), int(concurrency), float(seconds), int(group))))
        return
    sources = dict(s.split("=", 1) for s in args.src) or {"head": str(Path("src").resolve())}
    levels = [int(c) for c in args.concurrency.split(",")]
    if args.cprofile:
        profile_point(next(iter(sources.values())), levels[0], args)
        return
    samples: dict[str, dict[int, list[dict[str, float]]]] = {
        name: {c: [] for c in levels} for name in sources
    }
    with tempfile.TemporaryDirectory() as tmp:
        repo = write_repository(Path(tmp))
        order = list(sources)
        for round_ in range(args.rounds):
            for c in levels:
                for name in order:
                    reading = run_point(sources[name], repo, c, args.seconds, args.group)
                    samples[name][c].append(reading)
                    print(
                        f"round {round_} {name} c={c}: "
                        + ", ".join(f"{k} {reading[k]:.1f}" for k in KEYS),
                        flush=True,
                    )
            order.reverse()
    medians = {
        name: {
            c: {k: statistics.median(r[k] for r in runs) for k in KEYS} for c, runs in by_c.items()
        }
        for name, by_c in samples.items()
    }
    result = {
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "seconds": args.seconds,
        "rounds": args.rounds,
        "sources": sources,
        "medians": {name: {str(c): m for c, m in by_c.items()} for name, by_c in medians.items()},
        "samples": {name: {str(c): s for c, s in by_c.items()} for name, by_c in samples.items()},
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# Executor CPU per request (benchmarks/ipc/executor.py)",
        "",
        f"{args.rounds} rounds x {args.seconds:g} s per point, medians; "
        f"{os.cpu_count()} CPUs, executor on core 0, front end on core 1.",
        "",
        "| tree | c | req/s | executor µs/req | executor µs/execution | executor cores "
        "| avg batch | front end µs/req |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, by_c in medians.items():
        for c, m in by_c.items():
            lines.append(
                f"| {name} | {c} | {m['requests_per_s']:,.0f} | "
                f"{m['executor_us_per_request']:.1f} | {m['executor_us_per_execution']:.0f} | "
                f"{m['executor_cores']:.2f} | {m['average_batch']:.1f} | "
                f"{m['frontend_us_per_request']:.1f} |"
            )
    args.out.with_suffix(".md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
