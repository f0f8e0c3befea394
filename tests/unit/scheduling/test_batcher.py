from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.errors import InternalError, InvalidArgumentError, UnavailableError
from infermux.scheduling import GreedyBatcher


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


async def test_single_request_runs_on_the_instance_thread() -> None:
    instance = Recorder()
    batcher = GreedyBatcher("m", [instance], max_batch_rows=4)
    result = await batcher.submit(request(3))
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["y"], [[6]])
    assert instance.threads == {"m-instance0_0"}
    await batcher.close()
    assert instance.closed


async def test_requests_collect_while_the_instance_is_busy() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = GreedyBatcher("m", [instance], max_batch_rows=4)
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
    batcher = GreedyBatcher("m", [instance], max_batch_rows=4)
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
    batcher = GreedyBatcher("m", [instance], max_batch_rows=8)
    results = [asyncio.ensure_future(batcher.submit(request(v))) for v in (1, -1, 2)]
    await asyncio.sleep(0.05)
    instance.gate.set()
    done = await asyncio.gather(*results)
    assert isinstance(done[1], InvalidArgumentError)
    assert isinstance(done[0], dict)
    assert isinstance(done[2], dict)
    await batcher.close()


async def test_an_instance_crash_fails_its_batch_only() -> None:
    instance = Recorder()
    batcher = GreedyBatcher("m", [instance], max_batch_rows=1)
    with pytest.raises(InternalError, match="model 'm' failed: boom"):
        await batcher.submit(request(99))
    assert isinstance(await batcher.submit(request(1)), dict)
    await batcher.close()


async def test_close_drains_admitted_requests_then_refuses() -> None:
    instance = Recorder()
    instance.gate.clear()
    batcher = GreedyBatcher("m", [instance], max_batch_rows=1)
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
    assert all(isinstance(p.result(), dict) for p in pending)
    assert instance.closed


async def test_several_instances_run_in_parallel() -> None:
    instances = [Recorder(), Recorder()]
    for instance in instances:
        instance.gate.clear()
    batcher = GreedyBatcher("m", instances, max_batch_rows=1)
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
    batcher = GreedyBatcher("m", [instance], max_batch_rows=1)
    first = asyncio.ensure_future(batcher.submit(request(0)))
    await asyncio.sleep(0.05)
    abandoned = asyncio.ensure_future(batcher.submit(request(1)))
    await asyncio.sleep(0.01)
    abandoned.cancel()
    instance.gate.set()
    await first
    assert isinstance(await batcher.submit(request(2)), dict)
    assert instance.batches == [[0], [2]]
    await batcher.close()


async def test_needs_an_instance() -> None:
    with pytest.raises(ValueError, match="at least one instance"):
        GreedyBatcher("m", [])
