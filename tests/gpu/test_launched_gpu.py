"""GPU batches launched from the event loop: graph replays started without a thread, their end
reported by the process's completion thread."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from infermux.backends import ModelRequest
from infermux.backends.base import ExecuteResult
from infermux.backends.pytorch import PyTorchInstance
from infermux.backends.stacking import compatible
from infermux.errors import UnavailableError
from infermux.ipc.arena import Arena
from infermux.model_config import DynamicBatchingConfig
from infermux.observability.statistics import ModelStatistics
from infermux.runtime import COMPLETIONS
from infermux.runtime.host_memory import HOST_MEMORY
from infermux.scheduling import DynamicBatcher
from infermux.types import DeviceArray, Tensor
from tests.gpu.torch_models import Wide, close, load, rows, run, write

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GRAPHS = "optimization { cuda { graphs: true } }\n"


def finish(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
    assert isinstance(result, dict)
    y = np.asarray(result["OUTPUT__0"])
    return [Tensor("OUTPUT__0", "FP32", y.shape, y)]


def assert_answers_as(eager: PyTorchInstance, inputs: list[Any], done: list[Any]) -> None:
    """Each completion's output is what the eager instance answers to its input."""
    for x, completion in zip(inputs, done, strict=True):
        np.testing.assert_allclose(
            np.asarray(completion.outputs[0].data, dtype=np.float32),
            run(eager, x),
            rtol=1e-4,
            atol=1e-5,
        )


def instance_threads() -> list[str]:
    return [t.name for t in threading.enumerate() if "-instance" in t.name]


async def test_launched_replays_answer_as_eager_with_no_instance_thread(tmp_path: Path) -> None:
    graphed = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 4)
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    batcher = DynamicBatcher(
        "m",
        graphed,
        finish=finish,
        batching=DynamicBatchingConfig(),
        max_batch_size=8,
    )
    wakeups = COMPLETIONS.wakeups
    try:
        inputs = [rows(1, seed) for seed in range(200)]
        done = await asyncio.gather(
            *(batcher.submit(ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))) for x in inputs)
        )
        assert_answers_as(eager, inputs, done)
        replays = sum(i.gpu.replays for i in graphed if i.gpu is not None)
        assert replays >= 200 // 8  # every batch replayed a graph
        assert COMPLETIONS.wakeups > wakeups
        assert COMPLETIONS.watching == 0
        assert instance_threads() == []  # launched from the loop: no thread per instance
    finally:
        await batcher.close()
        close([eager])


async def test_batches_on_an_idle_gpu_are_polled_by_the_loop(tmp_path: Path) -> None:
    """One request at a time: each batch is launched with no other in flight, so the loop polls
    it and reports it (once: the completion thread, woken by the same batch, finds nothing)."""
    graphed = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 2)
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    batcher = DynamicBatcher(
        "m", graphed, finish=finish, batching=DynamicBatchingConfig(), max_batch_size=8
    )
    polled = COMPLETIONS.polled
    try:
        inputs = [rows(1, seed) for seed in range(50)]
        done = [await batcher.submit(ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))) for x in inputs]
        assert_answers_as(eager, inputs, done)
        # Most: the completion thread may see a batch first now and then.
        assert COMPLETIONS.polled - polled >= len(inputs) // 2
        assert COMPLETIONS.watching == 0
    finally:
        await batcher.close()
        close([eager])


async def test_no_device_allocations_in_launched_batches(tmp_path: Path) -> None:
    instances = load(write(tmp_path, Wide(), GRAPHS), "cuda:0", 2)
    batcher = DynamicBatcher(
        "m", instances, finish=finish, batching=DynamicBatchingConfig(), max_batch_size=8
    )

    async def burst(seed: int) -> None:
        await asyncio.gather(
            *(
                batcher.submit(ModelRequest({"INPUT__0": rows(1, seed + i)}, ("OUTPUT__0",)))
                for i in range(64)
            )
        )

    try:
        await burst(0)  # warm-up
        before = torch.cuda.memory_stats(0)["allocation.all.allocated"]
        for seed in range(1, 4):
            await burst(seed * 100)
        assert torch.cuda.memory_stats(0)["allocation.all.allocated"] == before
    finally:
        await batcher.close()


class Slow(Wide):
    """Hundreds of milliseconds of matrix products per batch: an execution timeout's victim."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = torch.relu(self.up(x)).repeat(256, 1)  # 256 x rows of 4096: ~20 ms per row
        for _ in range(100):
            h = torch.tanh(self.square(h))
        out: torch.Tensor = self.down(h[: x.shape[0]])
        return out


async def test_a_launched_batch_past_its_timeout_fails_and_the_instance_is_replaced(
    tmp_path: Path,
) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model_dir = write(
            tmp_path,
            Slow(),
            "optimization { cuda { graphs: true graph_spec [ { batch_size: 1 } ] } }\n",
        )
    (first,) = load(model_dir, "cuda:0", 1)
    made: list[PyTorchInstance] = []

    def reload() -> PyTorchInstance:
        (fresh,) = load(model_dir, "cuda:0", 1)
        made.append(fresh)
        return fresh

    stats = ModelStatistics("m", 1, instances=["m_0"])
    batcher = DynamicBatcher(
        "m",
        [first],
        finish=finish,
        stats=stats,
        max_batch_size=8,
        execution_timeout_s=0.005,
        reloads=[reload],
    )
    try:
        with pytest.raises(UnavailableError, match="did not finish within its execution timeout"):
            await batcher.submit(ModelRequest({"INPUT__0": rows(1, 0)}, ("OUTPUT__0",)))
        assert stats.timeouts == [1]
        for _ in range(100):  # the replacement loads on its own thread
            if made:
                break
            await asyncio.sleep(0.1)
        assert made
        assert first.gpu is None  # the stuck instance was closed once its batch ended
    finally:
        await batcher.close()
        close(made)


async def test_pinned_host_and_device_inputs_are_copied_where_they_lie(tmp_path: Path) -> None:
    graphed = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 2)
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    arena = Arena.local(1 << 20)
    HOST_MEMORY.offer(arena.address, arena.size, "the test's arena")
    batcher = DynamicBatcher(
        "m",
        graphed,
        finish=finish,
        batching=DynamicBatchingConfig(),
        max_batch_size=8,
        compatible=compatible,  # host and device inputs are never stacked together
    )
    try:
        inputs = [rows(1, seed) for seed in range(48)]
        requests = []
        for i, x in enumerate(inputs):
            if i % 2:  # a client's CUDA shared memory: device to device
                gpu = torch.from_numpy(x).cuda()
                part = DeviceArray(gpu.data_ptr(), x.shape, np.dtype(np.float32), 0, gpu)
                requests.append(ModelRequest({}, ("OUTPUT__0",), device_inputs={"INPUT__0": part}))
                continue
            block = arena.allocate(x.nbytes)  # a front end's arena: pinned host to device
            assert block is not None
            view = np.frombuffer(arena.buffer(block.offset, block.size), np.float32)
            view[:] = x.reshape(-1)
            requests.append(ModelRequest({"INPUT__0": view.reshape(x.shape)}, ("OUTPUT__0",)))
        torch.cuda.synchronize()
        done = await asyncio.gather(*(batcher.submit(r) for r in requests))
        assert_answers_as(eager, inputs, done)
        assert HOST_MEMORY.pinned_bytes >= arena.size  # registered for the direct copies
    finally:
        await batcher.close()
        close([eager])
        HOST_MEMORY.withdraw(arena.address)
        with contextlib.suppress(BufferError):  # views of it may still be alive
            arena.close()


async def test_launched_batches_end_out_of_order_each_to_its_own_requests(tmp_path: Path) -> None:
    """A batch held up on its stream (a sleep kernel queued ahead of it) ends after a batch
    launched later on the other instance's stream: the later one is answered first, and each
    answer reaches its own request."""
    graphed = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 2)
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    held = graphed[0].gpu
    assert held is not None
    batcher = DynamicBatcher(
        "m", graphed, finish=finish, batching=DynamicBatchingConfig(), max_batch_size=8
    )
    try:
        # Idle workers take batches in the order they started waiting: instance 0's takes the
        # first request, behind ~0.1 s of GPU spin queued on its stream.
        with torch.cuda.stream(held.stream.stream):
            torch.cuda._sleep(200_000_000)  # type: ignore[no-untyped-call]
        x_slow, x_fast = rows(1, 1), rows(1, 2)
        slow = asyncio.ensure_future(
            batcher.submit(ModelRequest({"INPUT__0": x_slow}, ("OUTPUT__0",)))
        )
        for _ in range(1000):
            if held.replays:
                break
            await asyncio.sleep(0.001)
        assert held.replays == 1  # launched on the held stream
        fast = await batcher.submit(ModelRequest({"INPUT__0": x_fast}, ("OUTPUT__0",)))
        assert not slow.done()  # the later batch, on the other stream, ended first
        assert_answers_as(eager, [x_fast, x_slow], [fast, await slow])
        assert COMPLETIONS.watching == 0
    finally:
        await batcher.close()
        close([eager])


async def test_a_batch_whose_launch_fails_fails_only_its_requests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A launch that fails part way (here the copy of its outputs, with a driver error) fails
    its own request; the requests of other batches, launched around it on both streams, are
    answered, and the instance serves the next batch."""
    from infermux.backends import torch_gpu
    from infermux.errors import InfermuxError
    from infermux.runtime.driver import DriverError

    graphed = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 2)
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    real = torch_gpu._write_device_outputs

    def failing(graph: Any, requests: Any, stream: int, device_id: int) -> None:
        if any(float(r.inputs["INPUT__0"].reshape(-1)[0]) == 999.0 for r in requests):
            raise DriverError("cuMemcpyBatchAsync failed with CUDA error 1")
        real(graph, requests, stream, device_id)

    monkeypatch.setattr(torch_gpu, "_write_device_outputs", failing)
    batcher = DynamicBatcher(
        "m", graphed, finish=finish, batching=DynamicBatchingConfig(), max_batch_size=1
    )
    try:
        bad = rows(1, 99)
        bad[0, 0] = 999.0
        good = [rows(1, seed) for seed in range(16)]
        submitted = [bad, *good]
        done = await asyncio.gather(
            *(batcher.submit(ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))) for x in submitted),
            return_exceptions=True,
        )
        assert isinstance(done[0], InfermuxError)
        assert "CUDA error 1" in str(done[0])
        assert_answers_as(eager, good, list(done[1:]))
        after = rows(1, 123)
        again = await batcher.submit(ModelRequest({"INPUT__0": after}, ("OUTPUT__0",)))
        assert_answers_as(eager, [after], [again])
        assert COMPLETIONS.watching == 0
    finally:
        await batcher.close()
        close([eager])
