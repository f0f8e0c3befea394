"""The completion path's low-load polling: a batch launched on an idle GPU is polled by the loop
and reported once, by whichever of the loop and the completion thread sees it first. The
driver is faked (no CUDA here); the completion thread's pass is run by hand."""

from __future__ import annotations

import asyncio

import pytest

from infermux.runtime import completions
from infermux.runtime.completions import Completions


class FakeEvent:
    """Completes at the ``after``-th query (never when None), or when :meth:`finish` is called."""

    def __init__(self, after: int | None = 3) -> None:
        self.after = after
        self.queries = 0
        self.finished = False

    def query(self) -> bool:
        self.queries += 1
        if self.after is not None and self.queries >= self.after:
            self.finished = True
        return self.finished

    def finish(self) -> None:
        self.finished = True


class FakeDriver:
    def __init__(self) -> None:
        self.host_funcs = 0
        self.sem_post = 1

    def launch_host_func(self, stream: int, function: int, data: int) -> None:
        self.host_funcs += 1


@pytest.fixture
def watcher(monkeypatch: pytest.MonkeyPatch) -> Completions:
    monkeypatch.setattr(completions, "DRIVER", FakeDriver())
    watcher = Completions()
    monkeypatch.setattr(watcher, "_start", lambda: None)  # no thread: its pass is run by hand
    return watcher


async def turns(n: int = 20) -> None:
    for _ in range(n):
        await asyncio.sleep(0)


async def test_a_batch_on_an_idle_gpu_is_polled_and_reported_once(watcher: Completions) -> None:
    reports: list[str] = []
    event = FakeEvent(after=3)
    watcher.watch(0, event, lambda: reports.append("done"))
    await turns()
    assert reports == ["done"]
    assert (watcher.polled, event.queries) == (1, 3)
    assert watcher.watching == 0
    watcher._report_finished()  # the host function's sem_post wakes the thread: nothing left
    assert reports == ["done"]


async def test_the_thread_reporting_first_leaves_the_poll_nothing(watcher: Completions) -> None:
    reports: list[str] = []
    event = FakeEvent(after=None)
    watcher.watch(0, event, lambda: reports.append("done"))
    await turns(3)
    event.finish()
    watcher._report_finished()
    await turns()
    assert reports == ["done"]
    assert watcher.polled == 0


async def test_a_batch_launched_behind_another_is_not_polled(watcher: Completions) -> None:
    first, second = FakeEvent(after=None), FakeEvent(after=None)
    reports: list[str] = []
    watcher.watch(0, first, lambda: reports.append("first"))
    watcher.watch(1, second, lambda: reports.append("second"))
    await turns()
    assert second.queries == 0  # load: only the first (launched on an idle GPU) is polled
    second.finish()
    watcher._report_finished()
    first.finish()
    await turns()
    assert reports == ["second", "first"]
    assert watcher.polled == 1


async def test_polling_gives_up_after_its_budget(watcher: Completions) -> None:
    watcher.spin_seconds = 0.002
    event = FakeEvent(after=None)
    reports: list[str] = []
    watcher.watch(0, event, lambda: reports.append("done"))
    await asyncio.sleep(0.02)
    polls = event.queries
    assert polls > 0
    await turns()
    assert event.queries == polls  # stopped polling
    assert reports == []
    event.finish()
    watcher._report_finished()
    assert reports == ["done"]
    # The next batch on an idle GPU is polled again.
    watcher.watch(0, FakeEvent(after=2), lambda: reports.append("next"))
    await turns()
    assert reports == ["done", "next"]
    assert watcher.polled == 1


async def test_no_polling_when_turned_off(watcher: Completions) -> None:
    watcher.spin_seconds = 0
    event = FakeEvent(after=1)
    watcher.watch(0, event, lambda: None)
    await turns()
    assert (event.queries, watcher.polled, watcher.watching) == (0, 0, 1)


def test_no_polling_outside_a_loop(watcher: Completions) -> None:
    event = FakeEvent(after=1)
    reports: list[str] = []
    watcher.watch(0, event, lambda: reports.append("done"))
    assert event.queries == 0
    watcher._report_finished()
    assert reports == ["done"]


async def test_a_failing_query_ends_the_poll_and_leaves_the_batch_to_the_thread(
    watcher: Completions,
) -> None:
    class Broken(FakeEvent):
        def query(self) -> bool:
            self.queries += 1
            if self.queries == 1:
                raise RuntimeError("an illegal address was encountered")
            return True

    event = Broken()
    reports: list[str] = []
    watcher.watch(0, event, lambda: reports.append("done"))
    await turns()
    assert (event.queries, reports, watcher.polled) == (1, [], 0)
    watcher._report_finished()
    assert reports == ["done"]
