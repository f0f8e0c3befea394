"""The execution timeout of a decoupled model bounds each gap between responses, not the stream."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from infermux.backends.base import BackendInstance, ExecuteResult, ModelRequest
from infermux.model_config import DynamicBatchingConfig
from infermux.observability.statistics import ModelStatistics
from infermux.scheduling import DynamicBatcher
from infermux.scheduling.base import Response
from infermux.scheduling.instances import ExecutionTimeout
from tests.unit.scheduling.test_batcher import finish, request

TIMEOUT_S = 0.5
GAP_S = 0.05  # well inside the timeout, even on a loaded machine


class Ticker:
    """A decoupled instance answering in ``execute`` (as a generator model is driven): ``x``
    responses ``GAP_S`` apart; ``stall_after`` responses in, it waits for ``release``."""

    def __init__(self, stall_after: int | None = None) -> None:
        self.stall_after = stall_after
        self.release = threading.Event()
        self.closed = False

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        for r in requests:
            assert r.responses is not None
            for i in range(int(r.inputs["x"][0, 0])):
                if i == self.stall_after:
                    self.release.wait(30)
                time.sleep(GAP_S)
                r.responses.send({"y": np.full((1, 1), i)})
            r.responses.send(None, final=True)
        return [{} for _ in requests]

    def close(self) -> None:
        self.closed = True


class Threaded(Ticker):
    """The same, answering from a thread of its own after ``execute`` returned (Triton's
    response sender); ``seen_cancel`` is set once its request says it is cancelled."""

    def __init__(self, stall_after: int | None = None) -> None:
        super().__init__(stall_after)
        self.seen_cancel = threading.Event()

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        for r in requests:
            threading.Thread(target=self._answer, args=(r,), daemon=True).start()
        return [{} for _ in requests]

    def _answer(self, r: ModelRequest) -> None:
        super().execute([r])
        if r.cancelled:
            self.seen_cancel.set()


def batcher_of(
    instance: BackendInstance,
    stats: ModelStatistics | None = None,
    replaced: list[BackendInstance] | None = None,
) -> DynamicBatcher:
    return DynamicBatcher(
        "m",
        [instance],
        finish=finish,
        batching=DynamicBatchingConfig(),
        max_batch_size=4,
        stats=stats,
        execution_timeout_s=TIMEOUT_S,
        reloads=[Ticker],
        replaced=None if replaced is None else lambda _, fresh: replaced.append(fresh),
    )


async def collect(batcher: DynamicBatcher, value: int) -> list[Response]:
    return [part async for part in batcher.submit_stream(request(value))]


def values(parts: list[Response]) -> list[int]:
    return [int(p.outputs[0].data[0, 0]) for p in parts if p.outputs]


async def test_a_model_answering_within_the_limit_streams_longer_than_the_limit() -> None:
    for instance in (Ticker(), Threaded()):
        batcher = batcher_of(instance)
        count = int(3 * TIMEOUT_S / GAP_S)  # the whole stream takes three timeouts or more
        parts = await collect(batcher, count)
        assert values(parts) == list(range(count))
        assert parts[-1].final
        assert parts[-1].error is None
        await batcher.close()


async def test_a_stall_inside_execute_fails_the_request_and_replaces_the_instance() -> None:
    stuck = Ticker(stall_after=2)
    stats = ModelStatistics("m", 1, instances=["m_0"])
    replaced: list[BackendInstance] = []
    batcher = batcher_of(stuck, stats, replaced)
    try:
        parts = await collect(batcher, 5)
        assert values(parts) == [0, 1]  # what came before the stall is delivered
        last = parts[-1]
        assert last.final
        assert isinstance(last.error, ExecutionTimeout)
        assert "execution timeout (500 ms" in last.error.message
        assert "each gap between the responses" in last.error.message
        assert "replaced" in last.error.message
        assert stats.timeouts == [1]
        # The fresh instance answers the next request; the stuck one is closed once released.
        again = await collect(batcher, 2)
        assert values(again) == [0, 1]
        assert len(replaced) == 1
    finally:
        stuck.release.set()
    for _ in range(100):
        if stuck.closed:
            break
        await asyncio.sleep(0.05)
    assert stuck.closed
    await batcher.close()


async def test_a_stall_after_execute_returned_ends_that_request_alone() -> None:
    model = Threaded(stall_after=1)
    replaced: list[BackendInstance] = []
    batcher = batcher_of(model, replaced=replaced)
    try:
        parts = await collect(batcher, 4)
        assert values(parts) == [0]
        last = parts[-1]
        assert last.final
        assert isinstance(last.error, ExecutionTimeout)
        assert "request '' got no response within the execution timeout" in last.error.message
        assert last.error.reason.value == "BACKEND"
        assert replaced == []  # the instance returned from execute: it is kept
    finally:
        model.release.set()
    assert await asyncio.to_thread(model.seen_cancel.wait, 10)  # the model was told
    model.stall_after = None
    assert values(await collect(batcher, 2)) == [0, 1]  # the same instance goes on serving
    await batcher.close()


async def test_a_slow_reader_does_not_count_against_the_model() -> None:
    for instance in (Ticker(), Threaded()):
        batcher = batcher_of(instance)
        stream = batcher.submit_stream(request(40))  # more than the stream buffers (16)
        got: list[Response] = [await anext(stream)]
        await asyncio.sleep(3 * TIMEOUT_S)  # the model's sends wait for the reader meanwhile
        got += [part async for part in stream]
        assert values(got) == list(range(40))
        assert got[-1].error is None
        await batcher.close()


async def test_a_final_flag_then_a_hang_in_execute_is_still_cut() -> None:
    class Lingering(Ticker):
        def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
            results = super().execute(requests)
            self.release.wait(30)  # every request answered, but execute never returns
            return results

    model = Lingering()
    replaced: list[BackendInstance] = []
    batcher = batcher_of(model, replaced=replaced)
    try:
        assert values(await collect(batcher, 1)) == [0]  # the request itself is complete
        for _ in range(100):
            if replaced:
                break
            await asyncio.sleep(0.05)
        assert len(replaced) == 1
    finally:
        model.release.set()
    await batcher.close()


async def test_without_a_timeout_nothing_is_watched() -> None:
    model = Threaded(stall_after=1)
    batcher = DynamicBatcher("m", [model], finish=finish)
    stream = batcher.submit_stream(request(3))
    assert values([await anext(stream)]) == [0]
    waiting = asyncio.ensure_future(anext(stream))
    await asyncio.sleep(2 * TIMEOUT_S)
    assert not waiting.done()  # no timeout: the model may take as long as it likes
    model.release.set()
    part = await waiting
    assert values([part]) == [1]
    assert values([p async for p in stream]) == [2]
    await batcher.close()


def test_the_watcher_sleeps_to_a_sub_millisecond_deadline_without_spinning() -> None:
    # With asyncio.sleep, uvloop ran a wait under 0.5 ms at once: the watcher looped up to the
    # deadline (the last half millisecond before every gap deadline).
    import uvloop

    from infermux.backends.responses import ResponseStream
    from infermux.scheduling.response_gaps import ResponseGaps, WatchedBatch

    looks = 0
    check = WatchedBatch.check

    def counted(batch: WatchedBatch, now: int, held: int, timeout: int) -> int | None:
        nonlocal looks
        looks += 1
        return check(batch, now, held, timeout)

    async def main() -> None:
        gaps = ResponseGaps(0.0004)
        stalled = request(1)
        stalled.responses = ResponseStream()
        stalled.responses.begin()
        watched = gaps.watch([stalled], lambda _: None)
        await asyncio.wait_for(watched.stalled, 5)  # execute never returned: the batch stalls
        await gaps.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(WatchedBatch, "check", counted)
        uvloop.run(main())
    assert looks <= 3, looks
