"""The loop's precise deadline: never early, never spinning, re-armed and cancelled at will."""

from __future__ import annotations

import asyncio
import os
import time

import pytest
import uvloop

from infermux.scheduling import deadline as deadline_module
from infermux.scheduling.deadline import Deadline


class Calls:
    """A deadline's callback: when it was called, and an event set each time."""

    def __init__(self) -> None:
        self.times: list[int] = []
        self.fired = asyncio.Event()

    def __call__(self) -> None:
        self.times.append(time.perf_counter_ns())
        self.fired.set()


async def _fired_after(when_ns: int, timer: Deadline, fired: asyncio.Event) -> int:
    timer.at(when_ns)
    await asyncio.wait_for(fired.wait(), 5)
    return time.perf_counter_ns()


def test_fires_at_a_sub_millisecond_deadline_not_before_it() -> None:
    # uvloop rounds a 300 µs call_later to "now": the timerfd keeps the time.
    async def main() -> None:
        fired = asyncio.Event()
        timer = Deadline(asyncio.get_running_loop(), fired.set)
        assert timer.precise
        for delay_us in (50, 300, 700, 1500):
            fired.clear()
            start = time.perf_counter_ns()
            at = await _fired_after(start + delay_us * 1000, timer, fired)
            assert at - start >= delay_us * 1000, delay_us
        timer.close()

    uvloop.run(main())


def test_rearming_replaces_the_deadline_and_cancel_stops_it() -> None:
    async def main() -> None:
        calls = Calls()
        timer = Deadline(asyncio.get_running_loop(), calls)
        now = time.perf_counter_ns()
        timer.at(now + 1_000_000)
        timer.at(now + 30_000_000)  # replaces the 1 ms one
        await asyncio.wait_for(calls.fired.wait(), 5)
        assert calls.times[0] - now >= 30_000_000
        await asyncio.sleep(0.02)
        assert len(calls.times) == 1
        timer.at(time.perf_counter_ns() + 2_000_000)
        timer.cancel()
        await asyncio.sleep(0.02)
        assert len(calls.times) == 1
        timer.close()

    uvloop.run(main())


async def test_a_past_deadline_fires_on_the_next_iterations() -> None:
    fired = asyncio.Event()
    timer = Deadline(asyncio.get_running_loop(), fired.set)
    timer.at(time.perf_counter_ns() - 1_000_000)
    await asyncio.wait_for(fired.wait(), 5)
    timer.close()


async def test_close_gives_the_descriptor_back() -> None:
    timer = Deadline(asyncio.get_running_loop(), lambda: None)
    fd = timer._fd
    assert fd >= 0
    timer.close()
    timer.close()  # twice is harmless
    try:
        os.fstat(fd)
    except OSError:
        pass
    else:  # the number may have been reused by now; it must not be a timerfd of ours
        assert os.readlink(f"/proc/self/fd/{fd}") != "anon_inode:[timerfd]"


async def test_without_a_timerfd_it_waits_whole_milliseconds_never_less(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(deadline_module, "_TIMERFD", None)
    fired = asyncio.Event()
    timer = Deadline(asyncio.get_running_loop(), fired.set)
    assert not timer.precise
    start = time.perf_counter_ns()
    at = await _fired_after(start + 300_000, timer, fired)
    assert at - start >= 300_000
    timer.close()


async def test_the_same_time_twice_fires_once_and_can_be_set_again_once_it_fired() -> None:
    calls = Calls()
    timer = Deadline(asyncio.get_running_loop(), calls)
    when = time.perf_counter_ns() + 2_000_000
    timer.at(when)
    timer.at(when)  # every idle worker of a batcher asks for the oldest request's time
    await asyncio.wait_for(calls.fired.wait(), 5)
    await asyncio.sleep(0.01)
    assert len(calls.times) == 1
    calls.fired.clear()
    timer.at(when)  # passed, and no longer set: it fires again
    await asyncio.wait_for(calls.fired.wait(), 5)
    assert len(calls.times) == 2
    timer.close()
