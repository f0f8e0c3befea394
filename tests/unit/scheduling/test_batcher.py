from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np
import pytest

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.errors import InfermuxError, InternalError, InvalidArgumentError, UnavailableError
from infermux.model_config import DynamicBatchingConfig
from infermux.observability.statistics import ModelStatistics
from infermux.scheduling import Completion, DynamicBatcher
from infermux.types import Tensor


class Recorder:
    """An instance that records the batches it gets; ``gate`` holds execution until set."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()
        self.closed = False
        self.threads: set[str] = set()

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        self.gate.wait(10)
        self.threads.add(threading.current_thread().name)
        self.batches.append([int(r.inputs["x"][0, 0]) for r in requests])
        out: list[ExecuteResult] = []
        for r in requests:
            value = int(r.inputs["x"][0, 0])
            if value < 0:
                out.append(InvalidArgumentError(f"negative {value}"))
            elif value == 99:
                raise RuntimeError("boom")
            else:
                out.append({"y": r.inputs["x"] * 2})
        return out

    def close(self) -> None:
        self.closed = True


def request(value: int, rows: int = 1) -> ModelRequest:
    return ModelRequest({"x": np.full((rows, 1), value)}, ("y",))


def finish(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
    if isinstance(result, InfermuxError):
        raise result
    assert not isinstance(result, Exception)
    y = np.asarray(result["y"])
    return [Tensor("y", "INT64", y.shape, y)]


def batcher_of(
    instances: list[Recorder],
    rows: int,
    stats: ModelStatistics | None = None,
    batching: DynamicBatchingConfig | None = None,
) -> DynamicBatcher:
    if batching is None and rows > 1:
        batching = DynamicBatchingConfig()
    return DynamicBatcher(
        "m", instances, finish=finish, batching=batching, max_batch_size=rows, stats=stats
    )


def value_of(done: Completion) -> int:
    return int(done.outputs[0].data[0, 0])


async def test_single_request_runs_on_the_instance_thread() -> None:
    instance = Recorder()
    batcher = batcher_of([instance], 4)
    assert value_of(await batcher.submit(request(3))) == 6
    assert instance.threads == {"m-instance0"}
    await batcher.close()
    assert instance.closed


async def test_requests_collect_while_the_instance_is_busy() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = batcher_of([instance], 4)
    first = asyncio.ensure_future(batcher.submit(request(0)))
    await asyncio.sleep(0.05)  # the first request is executing, blocked on the gate
    rest = [asyncio.ensure_future(batcher.submit(request(i))) for i in range(1, 7)]
    await asyncio.sleep(0.05)
    instance.gate.set()
    await asyncio.gather(first, *rest)
    # While batch [0] ran, six requests queued: they go as batches of at most 4 rows.
    assert instance.batches == [[0], [1, 2, 3, 4], [5, 6]]
    await batcher.close()


async def test_rows_count_toward_the_batch_limit() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = batcher_of([instance], 4)
    first = asyncio.ensure_future(batcher.submit(request(0)))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(batcher.submit(request(i, rows=3))) for i in (1, 2)]
    await asyncio.sleep(0.05)
    instance.gate.set()
    await asyncio.gather(first, *rest)
    assert instance.batches == [[0], [1], [2]]  # 3 + 3 rows would exceed 4
    await batcher.close()


async def test_one_failing_request_fails_alone() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = batcher_of([instance], 8)
    results = [asyncio.ensure_future(batcher.submit(request(v))) for v in (1, -1, 2)]
    await asyncio.sleep(0.05)
    instance.gate.set()
    done = await asyncio.gather(*results, return_exceptions=True)
    assert isinstance(done[1], InvalidArgumentError)
    assert [value_of(done[0]), value_of(done[2])] == [2, 4]  # type: ignore[arg-type]
    await batcher.close()


async def test_an_instance_crash_fails_its_batch_only() -> None:
    instance = Recorder()
    batcher = batcher_of([instance], 1)
    with pytest.raises(InternalError, match="model 'm' failed: boom"):
        await batcher.submit(request(99))
    assert value_of(await batcher.submit(request(1))) == 2
    await batcher.close()


async def test_close_drains_admitted_requests_then_refuses() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = batcher_of([instance], 1)
    pending = [asyncio.ensure_future(batcher.submit(request(i))) for i in range(3)]
    await asyncio.sleep(0.05)
    assert batcher.pending == 3
    closing = asyncio.ensure_future(batcher.close())
    await asyncio.sleep(0.05)
    assert not closing.done()
    with pytest.raises(UnavailableError, match="unloading"):
        await batcher.submit(request(5))
    instance.gate.set()
    await closing
    assert [value_of(p.result()) for p in pending] == [0, 2, 4]
    assert instance.closed


async def test_several_instances_run_in_parallel() -> None:
    instances = [Recorder(), Recorder()]
    for instance in instances:
        instance.gate.clear()
    batcher = batcher_of(instances, 1)
    pending = [asyncio.ensure_future(batcher.submit(request(i))) for i in range(2)]
    await asyncio.sleep(0.05)
    for instance in instances:
        instance.gate.set()
    await asyncio.gather(*pending)
    assert [len(i.batches) for i in instances] == [1, 1]
    await batcher.close()


async def test_cancelled_request_is_skipped() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = batcher_of([instance], 1)
    first = asyncio.ensure_future(batcher.submit(request(0)))
    await asyncio.sleep(0.05)
    abandoned = asyncio.ensure_future(batcher.submit(request(1)))
    await asyncio.sleep(0.01)
    abandoned.cancel()
    instance.gate.set()
    await first
    assert value_of(await batcher.submit(request(2))) == 4
    assert instance.batches == [[0], [2]]
    await batcher.close()


async def test_a_request_cancelled_in_a_running_batch_is_done_when_the_batch_is() -> None:
    """Its inputs may be read until the batch ends (across processes they are views of the
    front end's arena, reused once the request is over), so its cancellation waits for that."""
    instance = Recorder()
    instance.gate.clear()
    batcher = batcher_of([instance], 1)
    running = asyncio.ensure_future(batcher.submit(request(1)))
    await asyncio.sleep(0.05)  # in the instance, held at the gate
    running.cancel()
    await asyncio.sleep(0.05)
    assert not running.done()  # still cancelling: the batch holds its inputs
    assert batcher.pending == 1
    instance.gate.set()
    with pytest.raises(asyncio.CancelledError):
        await running
    assert instance.batches == [[1]]  # it ran (it was running), its result dropped
    assert batcher.pending == 0
    await batcher.close()


async def test_needs_an_instance() -> None:
    with pytest.raises(ValueError, match="at least one instance"):
        batcher_of([], 1)


async def test_statistics_and_timings() -> None:
    instance = Recorder()
    instance.gate.clear()
    stats = ModelStatistics("m", 1)
    batcher = batcher_of([instance], 8, stats)
    first = asyncio.ensure_future(batcher.submit(request(0)))
    await asyncio.sleep(0.05)
    rest = [asyncio.ensure_future(batcher.submit(request(i, rows=2))) for i in (1, 2)]
    await asyncio.sleep(0.05)
    instance.gate.set()
    done = await asyncio.gather(first, *rest)
    assert done[1].queue_ns >= 40_000_000  # waited behind the first batch
    assert done[1].compute_infer_ns == done[2].compute_infer_ns  # same batch
    snapshot = stats.snapshot()
    assert snapshot.execution_count == 2
    assert [(b.batch_size, b.compute_infer.count) for b in snapshot.batch_stats] == [(1, 1), (4, 1)]


async def test_wrong_result_count_fails_the_batch() -> None:
    class Short(Recorder):
        def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
            return []

    batcher = batcher_of([Short()], 1)
    with pytest.raises(InternalError, match="returned 0 results for 1 requests"):
        await batcher.submit(request(1))
    await batcher.close()


async def test_a_bad_result_fails_its_request() -> None:
    def broken(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
        raise KeyError("y")

    batcher = DynamicBatcher("m", [Recorder()], finish=broken)
    with pytest.raises(InternalError, match="bad result"):
        await batcher.submit(request(1))
    await batcher.close()


async def test_an_idle_worker_keeps_nothing_of_its_last_batch() -> None:
    """Once a batch is answered, nothing of it stays referenced by the worker waiting for the
    next one: its inputs may be views of shared memory or hold a CUDA region's mapping, which
    an unregistration can close only when the last reference goes (on a GPU, re-registering a
    fresh allocation failed with cudaErrorAlreadyMapped while the old mapping lived on)."""
    import weakref

    class Held(np.ndarray):  # a plain numpy array takes no weak references
        pass

    instance = Recorder()
    batcher = batcher_of([instance], 4)
    x = np.full((1, 1), 5).view(Held)
    alive = weakref.ref(x)
    done = await batcher.submit(ModelRequest({"x": x}, ("y",)))
    assert value_of(done) == 10
    del x, done
    await asyncio.sleep(0.05)  # the worker is back waiting for work
    assert alive() is None, "the idle worker still holds the last batch's input"
    await batcher.close()


class Repeater:
    """A decoupled instance: each request gets ``x`` responses (its value, then +1, ...), one
    request with -1 a mid-stream error response; sent from a thread of its own after
    ``execute`` returned, as Triton lets a decoupled model do."""

    def __init__(self) -> None:
        self.batches: list[list[int]] = []
        self.gate = threading.Event()
        self.gate.set()

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        self.gate.wait(10)
        self.batches.append([int(r.inputs["x"][0, 0]) for r in requests])
        for r in requests:
            threading.Thread(target=self._answer, args=(r,)).start()
        return [{} for _ in requests]

    @staticmethod
    def _answer(r: ModelRequest) -> None:
        value = int(r.inputs["x"][0, 0])
        assert r.responses is not None
        if value < 0:
            r.responses.send({"y": np.full((1, 1), 0)})
            r.responses.send(InvalidArgumentError("bad turn"))
            r.responses.send({"y": np.full((1, 1), 1)}, final=True)
            return
        for i in range(value):
            r.responses.send({"y": np.full((1, 1), value + i)})
        r.responses.send(None, final=True)

    def close(self) -> None:
        pass


async def streamed(batcher: DynamicBatcher, value: int) -> list[tuple[object, bool]]:
    got: list[tuple[object, bool]] = []
    async for part in batcher.submit_stream(request(value)):
        got.append((part.error or [int(t.data[0, 0]) for t in part.outputs], part.final))
        if part.final:
            assert part.completion is not None or part.error is not None
    return got


async def test_a_decoupled_batch_streams_each_requests_own_answers() -> None:
    instance = Repeater()
    instance.gate.clear()
    batcher = DynamicBatcher(
        "m", [instance], finish=finish, batching=DynamicBatchingConfig(), max_batch_size=8
    )
    first = asyncio.ensure_future(streamed(batcher, 1))
    await asyncio.sleep(0.05)  # running alone, held at the gate
    rest = [asyncio.ensure_future(streamed(batcher, v)) for v in (2, 3, 0)]
    await asyncio.sleep(0.05)
    instance.gate.set()
    answers = await asyncio.gather(first, *rest)
    assert instance.batches == [[1], [2, 3, 0]]  # batching still applies
    assert answers == [
        [([1], False), ([], True)],
        [([2], False), ([3], False), ([], True)],
        [([3], False), ([4], False), ([5], False), ([], True)],
        [([], True)],  # zero responses, then the final flag
    ]
    await batcher.close()


async def test_a_decoupled_error_response_does_not_end_the_stream() -> None:
    batcher = DynamicBatcher("m", [Repeater()], finish=finish)
    got = await streamed(batcher, -1)
    assert got[0] == ([0], False)
    error, final = got[1]
    assert isinstance(error, InvalidArgumentError)
    assert not final
    assert got[2] == ([1], True)
    await batcher.close()


async def test_a_decoupled_request_failing_its_batch_ends_with_that_error() -> None:
    class Crashing(Repeater):
        def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
            raise RuntimeError("boom")

    batcher = DynamicBatcher("m", [Crashing()], finish=finish)
    [(error, final)] = await streamed(batcher, 2)
    assert isinstance(error, InternalError)
    assert "boom" in str(error)
    assert final
    await batcher.close()


async def test_closing_a_stream_early_drops_the_models_later_responses() -> None:
    batcher = DynamicBatcher("m", [Repeater()], finish=finish)
    stream = batcher.submit_stream(request(50))
    first = await anext(stream)
    assert [int(t.data[0, 0]) for t in first.outputs] == [50]
    await stream.aclose()  # the reader is gone; the model's sender is released, not blocked
    assert batcher.pending == 0
    await batcher.close()


def test_waiting_out_a_sub_millisecond_queue_delay_does_not_spin_the_loop() -> None:
    # uvloop rounds timers to whole milliseconds, a 400 µs one down to "now": the worker that
    # waited for the rest of the delay with wait_for looped ~40 times per request, burning the
    # executor's CPU for the whole delay (500 µs of CPU per request at c=1 on the H200).
    import uvloop

    from infermux.scheduling.queue import RequestQueue

    looks = 0
    oldest_ns = RequestQueue.oldest_ns

    def counted(queue: RequestQueue) -> int:
        nonlocal looks
        looks += 1
        return oldest_ns(queue)

    async def main() -> None:
        batching = DynamicBatchingConfig(max_queue_delay_microseconds=400)
        batcher = batcher_of([Recorder()], 8, batching=batching)
        for i in range(5):
            started = time.perf_counter_ns()
            assert value_of(await batcher.submit(request(i))) == 2 * i
            assert time.perf_counter_ns() - started >= 400_000  # it did wait the delay
        await batcher.close()

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(RequestQueue, "oldest_ns", counted)
        uvloop.run(main())
    # Per request: one look (not due: arm the timer), one when it fires (due). A spare each.
    assert looks <= 5 * 3, looks
