"""A Link whose ring to the peer is full keeps its frames in order and sends them once there is
room: when the peer wakes it, or on a retry timer that does not spin the loop."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import pytest
import uvloop

from infermux.ipc import Channel, Endpoint
from infermux.ipc.ring import META, ORDERED_STORES, FrameRing
from infermux.transport import link as link_module
from infermux.transport.link import Link

pytestmark = pytest.mark.skipif(not ORDERED_STORES, reason="the ring runs on x86-64 only")

FITS = 4
"""Frames of 1,000 bytes (1,004 with their length) that the 4 KiB rings below hold."""


@pytest.fixture
def ends(tmp_path: Path) -> Iterator[tuple[Endpoint, Endpoint]]:
    """The front end's and the executor's side of one channel. The Link under test takes the
    front end's; the test plays the executor by hand."""
    channel = Channel(tmp_path, ring_bytes=META + 4096, arena_bytes=64 * 1024)
    front, executor = Endpoint(channel.spec, "frontend"), Endpoint(channel.spec, "executor")
    yield front, executor
    executor.close()
    channel.close()


def frames(count: int) -> list[bytes]:
    return [i.to_bytes(2, "big") + bytes(998) for i in range(count)]


async def received(ring: FrameRing, got: list[bytes], count: int) -> list[bytes]:
    """Take from ``ring`` into ``got`` until it holds ``count`` frames (5 s at most)."""
    deadline = time.monotonic() + 5
    while len(got) < count:
        assert time.monotonic() < deadline, f"{len(got)} of {count} frames arrived"
        got.extend(ring.take())
        await asyncio.sleep(0.001)
    return got


def on_uvloop(main: Callable[[], Coroutine[Any, Any, None]]) -> None:
    uvloop.run(main())


def test_a_full_ring_is_retried_without_spinning_the_loop(
    ends: tuple[Endpoint, Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    # The retry was call_later(0.0002): uvloop rounds it to "now", so a front end whose ring was
    # full retried every loop iteration until the peer drained it (thousands of tries in 50 ms).
    front, executor = ends
    tries = 0
    put = FrameRing.put

    def counted(ring: FrameRing, frame: bytes) -> bool:
        nonlocal tries
        tries += 1
        return put(ring, frame)

    monkeypatch.setattr(FrameRing, "put", counted)

    async def main() -> None:
        link = Link(front, lambda _: None)
        for frame in frames(FITS + 2):
            link.send(frame)
        tries_when_full = tries
        await asyncio.sleep(0.05)  # the executor is stalled for 50 ms
        assert tries - tries_when_full <= 100, tries - tries_when_full
        # It takes frames without waking the front end: the timer still sends the rest.
        assert await received(executor.inbox, [], FITS + 2) == frames(FITS + 2)
        link.close()

    on_uvloop(main)


def test_the_peer_waking_this_side_flushes_the_backlog(
    ends: tuple[Endpoint, Endpoint], monkeypatch: pytest.MonkeyPatch
) -> None:
    front, executor = ends
    monkeypatch.setattr(link_module, "_RETRY_SECONDS", 3600.0)  # only the wake-up can send them

    async def main() -> None:
        answers: list[bytes] = []
        link = Link(front, answers.extend)
        for frame in frames(FITS + 3):
            link.send(frame)
        got = executor.inbox.take()
        assert got == frames(FITS)
        assert executor.outbox.put(b"answer")
        executor.bell.ring()  # the executor answers: the front end drains, then retries
        assert await received(executor.inbox, got, FITS + 3) == frames(FITS + 3)
        assert answers == [b"answer"]
        link.close()

    on_uvloop(main)


def test_a_muted_link_drops_its_backlog_and_stops_retrying(
    ends: tuple[Endpoint, Endpoint],
) -> None:
    front, executor = ends

    async def main() -> None:
        link = Link(front, lambda _: None)
        for frame in frames(FITS + 2):
            link.send(frame)
        link.mute()
        assert executor.inbox.take() == frames(FITS)
        await asyncio.sleep(0.02)
        assert executor.inbox.take() == []
        link.close()

    on_uvloop(main)


async def polling(front: Endpoint, seconds: float) -> tuple[Link, list[bytes]]:
    """A front end's link, started, polling its inbox for ``seconds``; and what it received."""
    got: list[bytes] = []
    link = Link(front, got.extend)
    await asyncio.sleep(0.01)
    link.poll_inbox(seconds)
    return link, got


def test_a_polled_inbox_delivers_a_frame_whose_doorbell_never_rang(
    ends: tuple[Endpoint, Endpoint],
) -> None:
    # The executor's answer written without ringing: only the poll can find it.
    front, executor = ends

    async def main() -> None:
        link, got = await polling(front, 0.5)
        await asyncio.sleep(0.005)
        assert executor.outbox.put(b"answer")
        deadline = time.monotonic() + 1
        while not got:
            assert time.monotonic() < deadline, "the poll did not find the frame"
            await asyncio.sleep(0)
        assert got == [b"answer"]
        link.close()

    on_uvloop(main)


def test_the_inbox_poll_gives_up_after_its_budget(ends: tuple[Endpoint, Endpoint]) -> None:
    front, executor = ends

    async def main() -> None:
        link, got = await polling(front, 0.002)
        await asyncio.sleep(0.02)
        assert executor.outbox.put(b"late")  # no doorbell, and the poll is over
        await asyncio.sleep(0.02)
        assert got == []
        executor.bell.ring()
        await asyncio.sleep(0.02)
        assert got == [b"late"]
        link.close()

    on_uvloop(main)
