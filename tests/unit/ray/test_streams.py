"""The credit window between the ingress and a replica streaming to it, without a cluster: the
credits actor's class called directly, and a stand-in for its Ray handle."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from infermux.ray.streams import StreamCredits, Taken, Window


class Method:
    """``actor.method`` as a Ray handle offers it: ``.remote(...)`` returns an awaitable."""

    def __init__(self, call: Callable[..., Awaitable[Any]], calls: list[tuple[Any, ...]]) -> None:
        self._call, self._calls = call, calls

    def remote(self, *args: Any) -> asyncio.Task[Any]:
        self._calls.append(args)
        return asyncio.ensure_future(self._call(*args))


class Handle:
    def __init__(self, actor: StreamCredits) -> None:
        self.calls: list[tuple[Any, ...]] = []
        self.took = Method(actor.took, self.calls)
        self.wait = Method(actor.wait, self.calls)
        self.close = Method(actor.close, self.calls)


async def test_a_replica_sends_a_window_then_waits_for_the_reader() -> None:
    handle = Handle(StreamCredits())
    window, taken = Window(handle, "s", window=4), Taken(handle, "s", window=4)
    for _ in range(4):
        assert await window.spend()  # the window: no call to the actor
    assert handle.calls == []
    blocked = asyncio.ensure_future(window.spend())
    await asyncio.sleep(0.01)
    assert not blocked.done()  # the reader took nothing yet
    taken.took()
    await asyncio.sleep(0.01)
    assert not blocked.done()  # credit goes back in halves of the window
    taken.took()
    assert await asyncio.wait_for(blocked, 5)  # 2 taken: 6 may be sent in all, 5 are
    assert await window.spend()
    more = asyncio.ensure_future(window.spend())
    await asyncio.sleep(0.01)
    assert not more.done()
    more.cancel()


async def test_a_closed_stream_ends_the_replicas_wait() -> None:
    handle = Handle(StreamCredits())
    window = Window(handle, "s", window=1)
    assert await window.spend()
    blocked = asyncio.ensure_future(window.spend())
    await asyncio.sleep(0.01)
    Taken(handle, "s").close()  # the reader left
    assert await asyncio.wait_for(blocked, 5) is False
    assert await Window(handle, "s", window=1).spend()  # the window itself needs no credit
    late = Window(handle, "s", window=1)
    await late.spend()
    assert await late.spend() is False  # a wait after the close answers at once


async def test_credit_calls_may_overtake_each_other() -> None:
    credits = StreamCredits()
    await credits.took("s", 8)
    await credits.took("s", 4)  # an older count arriving late changes nothing
    assert await credits.wait("s", 8) == 8


def test_without_credits_a_replica_is_not_held() -> None:
    async def run() -> None:
        window = Window(None, "s", window=1)
        assert all([await window.spend() for _ in range(100)])

    asyncio.run(run())
