"""How long after the GPU finishes a batch does the event loop hear of it?

At c=1 infermux's "compute infer" for a ResNet-50 batch of one is ~1.35 ms on the H200 where the
raw model, launched and synchronised on one thread, takes ~0.9 ms. This isolates one candidate
for the difference: the completion path. A kernel of a fixed GPU duration
(``torch.cuda._sleep``) is launched from a uvloop event loop on a stream, and the time from the
launch to the loop running its continuation is measured for each way of telling the loop:

- ``sync``: the loop's thread calls ``stream.synchronize()`` itself (CUDA's default schedule
  spins while it waits). The floor: no hand-off at all, and the loop blocked meanwhile.
- ``completions``: :data:`~infermux.runtime.completions.COMPLETIONS` with its loop polling off
  (``--gpu-completion-spin-us 0``): a host function ``sem_post`` on the stream, the completion
  thread's ``sem_wait``, ``call_soon_threadsafe``. Before the polling, every batch took this way.
- ``spin-thread``: a thread that waits for the batch's event with ``Event.synchronize()`` (the
  GIL released, spinning in the driver), then ``call_soon_threadsafe``.
- ``block-thread``: the same with an event made with ``cudaEventBlockingSync`` (the thread
  sleeps until the driver's interrupt instead of spinning).
- ``block-sync``: the loop's thread itself waits on such an event: the floor of a sleeping wait.
- ``loop-poll``: the loop itself polls ``Event.query()`` once per iteration until it completes
  (what ``COMPLETIONS`` now does for a batch launched on an idle GPU).

Each method runs ``--trials`` launches per kernel duration, interleaved round by round; the
medians and 90th percentiles are reported, and each method's excess over ``sync``.

    python3 benchmarks/gpu/completion_latency.py --out $OUT/completion_latency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

METHODS = ("sync", "completions", "spin-thread", "block-thread", "block-sync", "loop-poll")


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


class SpinThread:
    """One thread that waits for each handed event with ``Event.synchronize()``."""

    def __init__(self) -> None:
        self._work: list[tuple[Any, Callable[[], None]]] = []
        self._ready = threading.Condition()
        threading.Thread(target=self._run, daemon=True, name="spin-completions").start()

    def watch(self, event: Any, done: Callable[[], None]) -> None:
        with self._ready:
            self._work.append((event, done))
            self._ready.notify()

    def _run(self) -> None:
        while True:
            with self._ready:
                while not self._work:
                    self._ready.wait()
                event, done = self._work.pop(0)
            event.synchronize()
            done()


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from infermux.runtime.completions import COMPLETIONS

    COMPLETIONS.spin_seconds = 0  # "completions" times the completion thread's path alone
    loop = asyncio.get_running_loop()
    stream = torch.cuda.Stream()
    spinner = SpinThread()
    cycles_per_us = _cycles_per_us(stream)

    async def once(method: str, cycles: int) -> float:
        event = torch.cuda.Event(blocking=method.startswith("block"))
        start = time.perf_counter()
        with torch.cuda.stream(stream):
            torch.cuda._sleep(cycles)
            event.record(stream)
        if method in ("sync", "block-sync"):
            event.synchronize()
            return time.perf_counter() - start
        future: asyncio.Future[None] = loop.create_future()

        def done() -> None:
            loop.call_soon_threadsafe(_resolve, future)

        if method == "loop-poll":
            while not event.query():  # noqa: ASYNC110 - polling, once per loop iteration, is the point
                await asyncio.sleep(0)
            return time.perf_counter() - start
        if method == "completions":
            COMPLETIONS.watch(stream.cuda_stream, event, done)
        else:
            spinner.watch(event, done)
        await future
        return time.perf_counter() - start

    results: dict[str, Any] = {"cycles_per_us": cycles_per_us, "points": []}
    for gpu_us in args.gpu_us:
        cycles = int(gpu_us * cycles_per_us)
        samples: dict[str, list[float]] = {m: [] for m in METHODS}
        for _ in range(args.warmup):
            for method in METHODS:
                await once(method, cycles)
        for _ in range(args.trials):
            for method in METHODS:
                samples[method].append(await once(method, cycles) * 1e6)
                await asyncio.sleep(args.gap_us / 1e6)  # the loop idles between requests
        floor = statistics.median(samples["sync"])
        point = {"gpu_us": gpu_us}
        for method, values in samples.items():
            values.sort()
            p50 = statistics.median(values)
            point[method] = {
                "p50_us": round(p50, 1),
                "p90_us": round(values[int(len(values) * 0.9)], 1),
                "over_sync_us": round(p50 - floor, 1),
            }
        results["points"].append(point)
        print(json.dumps(point), flush=True)
    return results


def _cycles_per_us(stream: Any) -> float:
    """GPU clock cycles per µs of ``torch.cuda._sleep``, timed with CUDA events."""
    import torch

    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    with torch.cuda.stream(stream):
        torch.cuda._sleep(1_000_000)  # the first launch also loads the kernel: not timed
        start.record(stream)
        torch.cuda._sleep(1_000_000)
        end.record(stream)
    end.synchronize()
    return 1_000_000 / (start.elapsed_time(end) * 1000)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-us", type=float, nargs="+", default=[20.0, 900.0])
    parser.add_argument("--trials", type=int, default=1000)
    parser.add_argument("--warmup", type=int, default=50)
    parser.add_argument("--gap-us", type=float, default=200.0)
    parser.add_argument("--out", type=Path, default=Path("completion_latency.json"))
    args = parser.parse_args()
    import uvloop

    results = uvloop.run(measure(args))
    results["argv"] = sys.argv
    args.out.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
