"""A load-generating process: tritonclient's asyncio clients (HTTP or gRPC, optionally through
system shared memory), driven closed loop (N requests always in flight) or open loop (sends at
a rate, constant or Poisson, whatever the answers do), for as long as the coordinator says.

Samples go back in batches as (end time on the shared monotonic clock, latency, ok), so the
coordinator can cut windows across every process; each process reports its own CPU time.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from multiprocessing.queues import Queue
from typing import Any

import numpy as np

from .inputs import Array
from .options import BenchOptions
from .transport import GrpcSender, HttpSender, grpc_requests, http_bodies

MAX_OUTSTANDING = 4096  # open loop: sends beyond this many unanswered requests are dropped
FLUSH_S = 0.1

Sample = tuple[float, float, bool]


@dataclass(frozen=True)
class Job:
    """What one worker process needs: its share of each level and the request to send."""

    index: int
    options: BenchOptions
    inputs: dict[str, tuple[str, Array]]
    outputs: list[tuple[str, str, tuple[int, ...]]]
    """(name, datatype, shape of one request) of each output (for shared-memory regions)."""


def main(job: Job, commands: Queue[Any], results: Queue[Any]) -> None:
    """Process entry point."""
    try:
        import uvloop

        uvloop.run(_serve(job, commands, results))
    except ImportError:
        asyncio.run(_serve(job, commands, results))


async def _serve(job: Job, commands: Queue[Any], results: Queue[Any]) -> None:
    loop = asyncio.get_running_loop()
    try:
        client = await _Client.open(job)
    except Exception as exc:
        results.put(("error", job.index, f"{type(exc).__name__}: {exc}"))
        return
    results.put(("ready", job.index))
    try:
        while True:
            command = await loop.run_in_executor(None, commands.get)
            if command[0] != "level":
                break
            await _level(job, client, float(command[1]), commands, results)
    except Exception as exc:
        results.put(("error", job.index, f"{type(exc).__name__}: {exc}"))
    finally:
        await client.close()


async def _level(
    job: Job, client: _Client, share: float, commands: Queue[Any], results: Queue[Any]
) -> None:
    """Load at ``share`` (this process's concurrency or rate) until the coordinator says next."""
    loop = asyncio.get_running_loop()
    stop = asyncio.Event()
    samples: list[Sample] = []
    cpu = time.process_time()

    async def timed(slot: int) -> None:
        started = time.perf_counter()
        try:
            await client.infer(slot)
            ok = True
        except Exception:
            ok = False
        samples.append((time.monotonic(), time.perf_counter() - started, ok))

    async def flush() -> None:
        while not stop.is_set():
            await asyncio.sleep(FLUSH_S)
            if samples:
                # Swap the list out whole: slot threads append to it concurrently.
                batch = samples[:]
                del samples[: len(batch)]
                results.put(("samples", job.index, batch))

    async def closed(slots: int) -> None:
        blocking = client.blocking()
        if blocking is not None:  # gRPC: a thread per slot, blocking calls (see GrpcSender)
            halt = threading.Event()

            def slot_thread(slot: int) -> None:
                while not halt.is_set():
                    started = time.perf_counter()
                    try:
                        blocking(slot)
                        ok = True
                    except Exception:
                        ok = False
                    samples.append((time.monotonic(), time.perf_counter() - started, ok))

            threads = [threading.Thread(target=slot_thread, args=(i,)) for i in range(slots)]
            for thread in threads:
                thread.start()
            await stop.wait()
            halt.set()
            for thread in threads:
                await loop.run_in_executor(None, thread.join)
            return

        async def slot_loop(slot: int) -> None:
            while not stop.is_set():
                await timed(slot)

        await asyncio.gather(*(slot_loop(i) for i in range(slots)))

    async def open_loop(rate: float) -> None:
        rng = random.Random(job.index)
        poisson = job.options.distribution == "poisson"
        pending: set[asyncio.Task[None]] = set()
        due = time.monotonic()
        dropped = 0
        while not stop.is_set():
            due += rng.expovariate(rate) if poisson else 1 / rate
            delay = due - time.monotonic()
            if delay > 0:
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(stop.wait(), delay)
                if stop.is_set():
                    break
            if len(pending) >= MAX_OUTSTANDING:
                dropped += 1
                samples.append((time.monotonic(), 0.0, False))
                continue
            task = loop.create_task(timed(0))
            pending.add(task)
            task.add_done_callback(pending.discard)
        await asyncio.gather(*pending)

    if job.options.open_loop:
        load: Awaitable[None] = open_loop(share)
    else:
        load = closed(round(share))
    running = asyncio.gather(load, flush())
    await loop.run_in_executor(None, commands.get)  # "next": the coordinator has its windows
    stop.set()
    await running
    if samples:
        results.put(("samples", job.index, list(samples)))
    results.put(("done", job.index, time.process_time() - cpu))


class _Client:
    """The request of ``job``, prepared once, and the sender that repeats it."""

    def __init__(self, job: Job) -> None:
        self._job = job
        self._sender: HttpSender | GrpcSender | None = None
        self._regions: list[tuple[str, Any]] = []
        self._admin: Any = None  # tritonclient's client, for shared-memory registration

    @classmethod
    async def open(cls, job: Job) -> _Client:
        self = cls(job)
        options = job.options
        grpc = options.protocol == "grpc"
        input_regions: dict[str, tuple[str, int, int]] = {}
        output_regions: dict[int, list[tuple[str, str, int, int]]] = {}
        if options.shared_memory == "system":
            if grpc:
                from tritonclient.grpc.aio import InferenceServerClient as Admin
            else:
                from tritonclient.http.aio import InferenceServerClient as Admin
            self._admin = Admin(options.address)
            slots = max(1, round(max(options.levels)))
            input_regions, output_regions = await self._shared_memory(slots)
        if grpc:
            requests = grpc_requests(
                options.model, options.model_version, job.inputs, input_regions, output_regions
            )
            self._sender = GrpcSender(options.address, requests)
        else:
            import tritonclient.http as module

            inputs = []
            for name, (datatype, array) in job.inputs.items():
                tensor = module.InferInput(name, list(array.shape), datatype)
                if name in input_regions:
                    tensor.set_shared_memory(
                        input_regions[name][0], array.nbytes, input_regions[name][2]
                    )
                else:
                    tensor.set_data_from_numpy(array)
                inputs.append(tensor)
            outputs: dict[int, list[Any]] = {}
            for slot, placed in (output_regions or {0: []}).items():
                wanted = []
                for name, _, _ in job.outputs:
                    output = module.InferRequestedOutput(name, binary_data=True)
                    for placed_name, region, size, offset in placed:
                        if placed_name == name:
                            output.set_shared_memory(region, size, offset=offset)
                    wanted.append(output)
                outputs[slot] = wanted
            version = f"/versions/{options.model_version}" if options.model_version else ""
            path = f"/v2/models/{options.model}{version}/infer"
            self._sender = HttpSender(options.address, path, http_bodies(module, inputs, outputs))
        return self

    async def _shared_memory(
        self, slots: int
    ) -> tuple[dict[str, tuple[str, int, int]], dict[int, list[tuple[str, str, int, int]]]]:
        import tritonclient.utils.shared_memory as shm

        job = self._job
        arrays = [(name, array) for name, (_, array) in job.inputs.items()]
        size = sum(array.nbytes for _, array in arrays)
        tag = f"bench_{os.getpid()}"
        handle = shm.create_shared_memory_region(f"{tag}_in", f"/{tag}_in", size)
        shm.set_shared_memory_region(handle, [array for _, array in arrays])
        self._regions.append((f"{tag}_in", handle))
        await self._admin.register_system_shared_memory(f"{tag}_in", f"/{tag}_in", size)
        inputs, offset = {}, 0
        for name, array in arrays:
            inputs[name] = (f"{tag}_in", array.nbytes, offset)
            offset += array.nbytes
        sizes = [(name, _nbytes(datatype, shape)) for name, datatype, shape in job.outputs]
        total = sum(nbytes for _, nbytes in sizes)
        outputs: dict[int, list[tuple[str, str, int, int]]] = {}
        for slot in range(slots):  # answers land in a region per in-flight request
            region = f"{tag}_out{slot}"
            self._regions.append(
                (region, shm.create_shared_memory_region(region, f"/{region}", total))
            )
            await self._admin.register_system_shared_memory(region, f"/{region}", total)
            placed, offset = [], 0
            for name, nbytes in sizes:
                placed.append((name, region, nbytes, offset))
                offset += nbytes
            outputs[slot] = placed
        return inputs, outputs

    async def infer(self, slot: int) -> None:
        assert self._sender is not None
        await self._sender.send(slot)

    def blocking(self) -> Callable[[int], None] | None:
        """A blocking send, where the protocol has a faster one (gRPC)."""
        return self._sender.send_blocking if isinstance(self._sender, GrpcSender) else None

    async def close(self) -> None:
        import tritonclient.utils.shared_memory as shm

        if self._sender is not None:
            await self._sender.close()
        for name, handle in self._regions:
            with contextlib.suppress(Exception):
                await self._admin.unregister_system_shared_memory(name)
            with contextlib.suppress(Exception):
                shm.destroy_shared_memory_region(handle)
        if self._admin is not None:
            with contextlib.suppress(Exception):
                await self._admin.close()


def _nbytes(datatype: str, shape: tuple[int, ...]) -> int:
    from infermux.types import numpy_dtype

    if datatype == "BYTES" or any(d < 0 for d in shape):
        raise ValueError(
            "--shared-memory system needs outputs of fixed size (no BYTES, no variable dims)"
        )
    return int(np.prod(shape)) * numpy_dtype(datatype).itemsize
