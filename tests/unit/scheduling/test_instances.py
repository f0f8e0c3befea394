"""The execution timeout: an overrunning instance fails its batch and is replaced or aborted."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np
import pytest

from infermux.backends.base import BackendInstance, ExecuteResult, ModelRequest
from infermux.errors import UnavailableError
from infermux.observability.statistics import ModelStatistics
from infermux.scheduling import DynamicBatcher, instances
from infermux.scheduling.instances import InstanceThread
from infermux.types import Tensor


class Hanging:
    """Hangs on a request of value 1 until ``release`` is set; answers its own id otherwise."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.closed = threading.Event()
        self.aborted = 0

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        if int(requests[0].inputs["x"][0]) == 1:
            self.release.wait(30)
        return [{"y": np.array([id(self)])} for _ in requests]

    def close(self) -> None:
        self.closed.set()


class Abortable(Hanging):
    def abort(self) -> None:
        self.aborted += 1
        self.release.set()


def finish(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
    assert isinstance(result, dict)
    y = np.asarray(result["y"])
    return [Tensor("y", "INT64", y.shape, y)]


def request(value: int) -> ModelRequest:
    return ModelRequest({"x": np.array([value])}, ("y",))


def answer(done: object) -> int:
    return int(done.outputs[0].data[0])  # type: ignore[attr-defined]


async def test_an_overrun_fails_the_batch_and_a_fresh_instance_takes_over() -> None:
    first = Hanging()
    made: list[Hanging] = []

    def reload() -> BackendInstance:
        made.append(Hanging())
        return made[-1]

    stats = ModelStatistics("m", 1, instances=["m_0"])
    loaded: list[BackendInstance] = [first]
    batcher = DynamicBatcher(
        "m",
        loaded,
        finish=finish,
        stats=stats,
        execution_timeout_s=0.2,
        reloads=[reload],
        replaced=loaded.__setitem__,
    )
    with pytest.raises(UnavailableError, match=r"model 'm' version 1 instance 'm_0' did not fin"):
        await batcher.submit(request(1))
    assert answer(await batcher.submit(request(0))) == id(made[0])
    assert loaded == made  # the statistics' memory reading sees the replacement
    assert stats.timeouts == [1]
    assert not first.closed.is_set()  # still stuck: never closed under its own feet
    first.release.set()
    await asyncio.to_thread(first.closed.wait, 10)  # closed once its call ended
    assert first.closed.is_set()
    await batcher.close()
    assert made[0].closed.is_set()


async def test_an_abortable_instance_is_aborted_and_kept() -> None:
    instance = Abortable()
    batcher = DynamicBatcher("m", [instance], finish=finish, execution_timeout_s=0.2)
    with pytest.raises(UnavailableError, match="execution timeout"):
        await batcher.submit(request(1))
    assert instance.aborted == 1
    assert answer(await batcher.submit(request(0))) == id(instance)
    await batcher.close()


async def test_a_failing_replacement_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(instances, "RELOAD_BACKOFF_S", (0.01,))
    attempts: list[int] = []
    fresh = Hanging()

    def reload() -> BackendInstance:
        attempts.append(1)
        if len(attempts) < 3:
            raise RuntimeError("GPU busy")
        return fresh

    stuck = Hanging()
    batcher = DynamicBatcher("m", [stuck], finish=finish, execution_timeout_s=0.1, reloads=[reload])
    with pytest.raises(UnavailableError):
        await batcher.submit(request(1))
    # Queued meanwhile: waits for the replacement rather than being lost.
    assert answer(await batcher.submit(request(0))) == id(fresh)
    assert len(attempts) == 3
    stuck.release.set()
    await batcher.close()


async def test_no_timeout_means_a_slow_batch_is_waited_for() -> None:
    slow = Hanging()
    batcher = DynamicBatcher("m", [slow], finish=finish)
    pending = asyncio.ensure_future(batcher.submit(request(1)))
    await asyncio.sleep(0.3)
    assert not pending.done()
    slow.release.set()
    assert answer(await pending) == id(slow)
    await batcher.close()


def test_instance_threads_are_daemons_that_run_jobs_in_order() -> None:
    thread = InstanceThread("t")
    order: list[int] = []
    futures = [thread.submit(order.append, i) for i in range(5)]
    failing = thread.submit(int, "x")
    assert [f.result(5) for f in futures] == [None] * 5
    assert order == [0, 1, 2, 3, 4]
    with pytest.raises(ValueError, match="invalid literal"):
        failing.result(5)
    assert thread._thread.daemon
    thread.shutdown()
    assert not thread._thread.is_alive()
