"""The busy-GPU rule: once ``busy_gpu_batches`` of a model's batches run on one GPU, a batch
below half ``max_batch_size`` waits for one of them to end (or for its rows to arrive)."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import time
from collections.abc import Callable, Sequence

import pytest

from infermux.backends.base import Collect, ExecuteResult, ModelRequest
from infermux.errors import ModelLoadError
from infermux.model_config import DynamicBatchingConfig, ModelConfig
from infermux.repository import load_model_config
from infermux.repository.loader import DEFAULT_BUSY_GPU_BATCHES, busy_gpu_batches
from infermux.scheduling import DynamicBatcher
from infermux.settings import builtin_repository
from tests.unit.scheduling.test_instances import answer, finish, request
from tests.unit.scheduling.test_launched import FakeGpu


class Device:
    """What runs on one fake GPU: each launch's values and how many batches ran beside it."""

    def __init__(self) -> None:
        self.running = 0
        self.launches: list[tuple[list[int], int]] = []  # (values, batches running with it)


class SharedGpu(FakeGpu):
    """A FakeGpu instance that records its launches on the ``device`` it shares."""

    def __init__(self, device: Device, seconds: float) -> None:
        super().__init__(1, lambda _: seconds)
        self.device = device

    def launch(self, requests: Sequence[ModelRequest], done: Callable[[], None]) -> Collect | None:
        values = [int(r.inputs["x"][0]) for r in requests]
        self.device.launches.append((values, self.device.running))
        self.device.running += 1
        collect = super().launch(requests, done)
        assert collect is not None

        def collected() -> Sequence[ExecuteResult]:
            self.device.running -= 1
            return collect()

        return collected


def batcher_of(
    instances: Sequence[FakeGpu], devices: Sequence[str], busy: int, *, max_batch_size: int = 8
) -> DynamicBatcher:
    return DynamicBatcher(
        "busy",
        instances,
        finish=finish,
        batching=DynamicBatchingConfig(),  # no delay: a free instance takes what is queued
        max_batch_size=max_batch_size,
        devices=devices,
        busy_gpu_batches=busy,
    )


async def submit_one_by_one(batcher: DynamicBatcher, values: Sequence[int]) -> list[int]:
    tasks = []
    for value in values:
        tasks.append(asyncio.ensure_future(batcher.submit(request(value))))
        await asyncio.sleep(0.01)  # each arrives after the last was taken, or held
    return [answer(done) for done in await asyncio.gather(*tasks)]


async def test_a_small_batch_waits_while_the_gpu_is_busy_and_grows_meanwhile() -> None:
    device = Device()
    gpus = [SharedGpu(device, 0.3) for _ in range(4)]
    batcher = batcher_of(gpus, ["cuda:0"] * 4, busy=2)
    try:
        assert await submit_one_by_one(batcher, range(1, 7)) == list(range(1, 7))
    finally:
        await batcher.close()
    # 1 and 2 launch at once; 3 waits (2 batches run) until 4, 5 and 6 make half of 8.
    assert device.launches == [([1], 0), ([2], 1), ([3, 4, 5, 6], 2)]


async def test_without_the_rule_every_request_launches_beside_the_others() -> None:
    for devices, busy in ((["cuda:0"] * 4, 0), (["cpu"] * 4, 2)):
        device = Device()
        gpus = [SharedGpu(device, 0.3) for _ in range(4)]
        batcher = batcher_of(gpus, devices, busy=busy)
        try:
            assert await submit_one_by_one(batcher, range(1, 5)) == list(range(1, 5))
        finally:
            await batcher.close()
        assert device.launches == [([1], 0), ([2], 1), ([3], 2), ([4], 3)], (devices, busy)


async def test_a_waiting_batch_launches_when_a_batch_on_its_gpu_ends() -> None:
    device = Device()
    gpus = [SharedGpu(device, 0.2) for _ in range(3)]
    batcher = batcher_of(gpus, ["cuda:0"] * 3, busy=2)
    try:
        began = time.monotonic()
        values = await submit_one_by_one(batcher, (1, 2, 3))
        took = time.monotonic() - began
    finally:
        await batcher.close()
    assert values == [1, 2, 3]
    # 3 ran after 1 ended (0.2 s), beside 2 alone, on the instance that was free all along.
    assert device.launches == [([1], 0), ([2], 1), ([3], 1)]
    assert took >= 0.38


async def test_only_batches_on_the_same_gpu_make_it_busy() -> None:
    devices = [Device(), Device()]
    gpus = [SharedGpu(devices[0], 0.3), SharedGpu(devices[0], 0.3), SharedGpu(devices[1], 0.3)]
    batcher = batcher_of(gpus, ["cuda:0", "cuda:0", "cuda:1"], busy=1)
    try:
        assert await submit_one_by_one(batcher, (1, 2, 3, 4, 5, 6)) == [1, 2, 3, 4, 5, 6]
    finally:
        await batcher.close()
    # Each GPU takes one small batch; the rest waits until half of 8 has arrived.
    launched = sorted(v for d in devices for v, _ in d.launches)
    assert launched == [[1], [2], [3, 4, 5, 6]]
    assert all(running == 0 for d in devices for _, running in d.launches[:1])


async def test_a_full_batch_never_waits() -> None:
    device = Device()
    gpus = [SharedGpu(device, 0.3) for _ in range(3)]
    batcher = batcher_of(gpus, ["cuda:0"] * 3, busy=1, max_batch_size=2)
    try:
        first = asyncio.ensure_future(batcher.submit(request(1)))
        await asyncio.sleep(0.01)
        rest = [asyncio.ensure_future(batcher.submit(request(v))) for v in (2, 3)]
        await asyncio.gather(first, *rest)
    finally:
        await batcher.close()
    assert device.launches == [([1], 0), ([2, 3], 1)]


@functools.cache
def _simple() -> ModelConfig:
    return load_model_config(builtin_repository() / "simple")


def with_parameter(value: str | None) -> ModelConfig:
    parameters = {} if value is None else {"busy_gpu_batches": value}
    return dataclasses.replace(_simple(), parameters=parameters)


def test_the_parameter_sets_the_limit_and_a_bad_one_names_itself() -> None:
    assert busy_gpu_batches(with_parameter(None)) == DEFAULT_BUSY_GPU_BATCHES
    assert busy_gpu_batches(with_parameter("")) == DEFAULT_BUSY_GPU_BATCHES
    assert busy_gpu_batches(with_parameter("0")) == 0
    assert busy_gpu_batches(with_parameter("3")) == 3
    for bad in ("-1", "two", "1.5"):
        with pytest.raises(ModelLoadError, match=r"parameters\.busy_gpu_batches must be a whole"):
            busy_gpu_batches(with_parameter(bad))
