"""Instances that launch batches from the event loop (``LaunchesOnLoop``), with a fake device: a
timer thread stands in for the GPU and the completion thread, calling ``done`` from elsewhere."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

import numpy as np
import pytest

from infermux.backends.base import BackendInstance, Collect, ExecuteResult, ModelRequest
from infermux.errors import InternalError, UnavailableError
from infermux.model_config import DynamicBatchingConfig
from infermux.observability.statistics import ModelStatistics
from infermux.scheduling import DynamicBatcher
from tests.unit.scheduling.test_instances import answer, finish, request


class FakeGpu:
    """Answers each request's ``x`` times ``factor``. A batch takes ``seconds(batch)`` on the
    "device"; a batch containing -1 fails to launch; ``hang`` keeps every batch from finishing.
    ``eager`` batches (containing 999) are refused by ``launch`` and run by ``execute``."""

    def __init__(self, factor: int, seconds: Callable[[list[int]], float] = lambda _: 0.01):
        self.factor = factor
        self.seconds = seconds
        self.hang = False
        self.launches: list[list[int]] = []
        self.executed: list[list[int]] = []
        self.in_flight = 0
        self.most_in_flight = 0
        self.closed = threading.Event()
        self.launch_threads: set[str] = set()

    def _values(self, requests: Sequence[ModelRequest]) -> list[int]:
        return [int(r.inputs["x"][0]) for r in requests]

    def _answer(self, values: list[int]) -> list[ExecuteResult]:
        return [{"y": np.array([v * self.factor])} for v in values]

    def launch(self, requests: Sequence[ModelRequest], done: Callable[[], None]) -> Collect | None:
        values = self._values(requests)
        self.launch_threads.add(threading.current_thread().name)
        if 999 in values:
            return None
        if -1 in values:
            raise InternalError("the launch failed")
        self.launches.append(values)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        if not self.hang:
            threading.Timer(self.seconds(values), done).start()

        def collect() -> Sequence[ExecuteResult]:
            self.in_flight -= 1
            return self._answer(values)

        return collect

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        values = self._values(requests)
        self.executed.append(values)
        return self._answer(values)

    def close(self) -> None:
        self.closed.set()


def instance_threads(name: str) -> list[str]:
    return [t.name for t in threading.enumerate() if t.name.startswith(f"{name}-instance")]


async def test_launched_batches_complete_out_of_order_each_to_its_own_requests() -> None:
    # Instance 0's batches take long, instance 1's are quick: completions arrive in another
    # order than launches, and every request still gets its own answer.
    slow = FakeGpu(10, lambda _: 0.15)
    quick = FakeGpu(100, lambda _: 0.01)
    batcher = DynamicBatcher("launched", [slow, quick], finish=finish, max_batch_size=1)
    try:
        done = await asyncio.gather(*(batcher.submit(request(v)) for v in range(1, 9)))
        values = [answer(d) for d in done]
        assert all(v in (x * 10, x * 100) for v, x in zip(values, range(1, 9), strict=True))
        assert slow.launches
        assert quick.launches
        assert len(quick.launches) > len(slow.launches)
        assert not slow.executed
        assert not quick.executed
        # Launched from the loop, with no thread of their own.
        assert slow.launch_threads == quick.launch_threads == {threading.current_thread().name}
        assert instance_threads("launched") == []
    finally:
        await batcher.close()
    assert slow.closed.is_set()
    assert quick.closed.is_set()


async def test_batches_still_form_while_a_launched_batch_runs() -> None:
    gpu = FakeGpu(1, lambda _: 0.1)
    batcher = DynamicBatcher(
        "forms",
        [gpu],
        finish=finish,
        batching=DynamicBatchingConfig(),
        max_batch_size=8,
    )
    try:
        first = asyncio.ensure_future(batcher.submit(request(1)))
        await asyncio.sleep(0.02)  # the first batch is on the "device"
        rest = [asyncio.ensure_future(batcher.submit(request(v))) for v in range(2, 8)]
        await asyncio.gather(first, *rest)
        assert gpu.launches == [[1], [2, 3, 4, 5, 6, 7]]
        assert gpu.most_in_flight == 1  # one batch at a time per instance
    finally:
        await batcher.close()


async def test_a_batch_that_fails_to_launch_fails_only_its_requests() -> None:
    gpu = FakeGpu(2)
    stats = ModelStatistics("m", 1, instances=["m_0"])
    batcher = DynamicBatcher("m", [gpu], finish=finish, stats=stats, max_batch_size=1)
    try:
        with pytest.raises(InternalError, match="the launch failed"):
            await batcher.submit(request(-1))
        assert answer(await batcher.submit(request(3))) == 6
    finally:
        await batcher.close()


async def test_a_batch_the_instance_cannot_launch_runs_on_its_thread() -> None:
    gpu = FakeGpu(3)
    batcher = DynamicBatcher("eager", [gpu], finish=finish, max_batch_size=1)
    try:
        assert answer(await batcher.submit(request(999))) == 2997
        assert gpu.executed == [[999]]
        assert instance_threads("eager") == ["eager-instance0"]  # made on first use
        assert answer(await batcher.submit(request(2))) == 6
        assert gpu.launches == [[2]]
    finally:
        await batcher.close()
    assert instance_threads("eager") == []  # joined at close


async def test_a_launched_batch_past_the_execution_timeout_fails_and_the_instance_is_replaced() -> (
    None
):
    stuck = FakeGpu(1)
    stuck.hang = True
    made: list[FakeGpu] = []

    def reload() -> BackendInstance:
        made.append(FakeGpu(5))
        return made[-1]

    stats = ModelStatistics("m", 1, instances=["m_0"])
    loaded: list[BackendInstance] = [stuck]
    batcher = DynamicBatcher(
        "m",
        loaded,
        finish=finish,
        stats=stats,
        execution_timeout_s=0.1,
        reloads=[reload],
        replaced=loaded.__setitem__,
    )
    try:
        with pytest.raises(UnavailableError, match=r"did not finish within its execution timeout"):
            await batcher.submit(request(1))
        assert answer(await batcher.submit(request(2))) == 10  # the replacement answers
        assert loaded == made
        assert stats.timeouts == [1]
        assert stuck.closed.wait(5)  # the abandoned instance is closed off the loop
    finally:
        await batcher.close()
