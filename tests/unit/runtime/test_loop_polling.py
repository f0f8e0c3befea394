"""The bounded per-iteration poll both low-load paths use (GPU completions, the channel)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable

from infermux.runtime.loop_polling import poll_each_iteration


async def poll(seconds: float, ready: Callable[[], bool]) -> list[str]:
    """Run one poll to its end; what happened, in order."""
    happened: list[str] = []
    loop = asyncio.get_running_loop()
    finished = loop.create_future()

    def ended() -> None:
        happened.append("ended")
        finished.set_result(None)

    poll_each_iteration(loop, seconds, ready, lambda: happened.append("ready"), ended)
    await asyncio.wait_for(finished, 5)  # on_ready runs in the same callback, right after
    return happened


async def test_it_checks_once_per_iteration_and_ends_before_the_action() -> None:
    checks: list[int] = []

    def ready() -> bool:
        checks.append(1)
        return len(checks) == 3

    assert await poll(5.0, ready) == ["ended", "ready"]
    assert len(checks) == 3


async def test_it_gives_up_after_its_budget() -> None:
    checks: list[int] = []

    def never() -> bool:
        checks.append(1)
        return False

    assert await poll(0.005, never) == ["ended"]
    assert len(checks) > 1


async def test_a_check_that_raises_ends_it_without_the_action() -> None:
    def broken() -> bool:
        raise RuntimeError("the driver said no")

    assert await poll(5.0, broken) == ["ended"]


async def test_the_loop_keeps_serving_while_it_polls() -> None:
    served = asyncio.Event()
    asyncio.get_running_loop().call_later(0.002, served.set)
    assert await poll(5.0, served.is_set) == ["ended", "ready"]
