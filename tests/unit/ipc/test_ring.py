"""The header ring: frames come out whole and in order across every wrap-around, a full ring
refuses without writing, producers in other processes (one ring each) reach one consumer."""

from __future__ import annotations

import multiprocessing
import time
from collections import deque
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermux.ipc import Channel, ChannelSpec, Endpoint
from infermux.ipc.ring import META, ORDERED_STORES, Doorbell, FrameRing

pytestmark = pytest.mark.skipif(not ORDERED_STORES, reason="the ring runs on x86-64 only")


@pytest.fixture
def ring() -> Iterator[FrameRing]:
    ring = FrameRing.create(META + 256)
    yield ring
    ring.close()


def test_frames_come_out_in_order(ring: FrameRing) -> None:
    assert ring.take() == []
    assert ring.put(b"one")
    assert ring.put(b"")
    assert ring.put(b"three")
    assert ring.take() == [b"one", b"", b"three"]
    assert ring.take() == []


def test_the_producers_load_reaches_the_other_mapping_and_leaves_frames_alone(
    ring: FrameRing,
) -> None:
    other = FrameRing.attach(ring.name)  # the consumer's own mapping, as in the other process
    try:
        assert other.load() == 0  # nothing published yet
        assert ring.put(b"one")
        ring.publish_load(7)
        assert other.load() == 7
        assert ring.put(b"two")
        assert other.pending()
        assert other.take() == [b"one", b"two"]
        assert not other.pending()
        ring.publish_load(0)
        assert other.load() == 0
    finally:
        other.close()


def test_a_full_ring_refuses_and_recovers(ring: FrameRing) -> None:
    frame = bytes(60)  # 64 bytes with its length: four fill the 256-byte data area
    assert all(ring.put(frame) for _ in range(4))
    assert not ring.put(b"x")
    assert ring.take() == [frame] * 4
    assert ring.put(b"x")
    with pytest.raises(ValueError, match="exceeds the ring's 252"):
        ring.put(bytes(253))


def test_a_frame_that_would_cross_the_end_starts_over(ring: FrameRing) -> None:
    assert ring.put(bytes(200))  # ends at byte 204 of 256
    assert ring.take() == [bytes(200)]
    assert ring.put(b"a" * 60)  # 52 bytes left at the end: wrap marker, frame at 0
    assert ring.take() == [b"a" * 60]
    assert ring.put(b"b" * 180)
    assert ring.put(b"c" * 6)  # lands 2 bytes short of the end: skipped without a marker
    assert ring.put(b"d")
    assert ring.take() == [b"b" * 180, b"c" * 6, b"d"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(st.integers(0, 120), st.none()), max_size=200))
def test_random_traffic_matches_a_queue(steps: list[int | None]) -> None:
    ring = FrameRing.create(META + 256)
    try:
        expected: deque[bytes] = deque()
        for n, step in enumerate(steps):
            if step is None:
                got = ring.take()
                assert got == [expected.popleft() for _ in range(len(got))]
                assert not expected
            else:
                frame = bytes([n % 256]) * step
                if ring.put(frame):
                    expected.append(frame)
                else:  # refused only when it really does not fit behind what is queued
                    assert expected
        assert ring.take() == list(expected)
    finally:
        ring.close()


def test_the_doorbell_wakes_once_per_clear() -> None:
    import select

    bell = Doorbell()
    try:
        assert select.select([bell], [], [], 0)[0] == []
        bell.ring()
        bell.ring()
        assert select.select([bell], [], [], 1)[0] == [bell]
        bell.clear()
        assert select.select([bell], [], [], 0)[0] == []
        bell.clear()  # nothing to clear: no error
    finally:
        bell.close()


def _produce(name: str, producer: int, count: int) -> None:
    ring = FrameRing.attach(name)
    for i in range(count):
        frame = f"{producer}:{i}".encode() * (1 + i % 7)
        while not ring.put(frame):
            time.sleep(0)
    ring.close()


def test_producers_in_other_processes_each_with_a_ring() -> None:
    count = 2000
    rings = [FrameRing.create(META + 1024) for _ in range(2)]
    context = multiprocessing.get_context("spawn")
    processes = [
        context.Process(target=_produce, args=(ring.name, p, count)) for p, ring in enumerate(rings)
    ]
    try:
        for process in processes:
            process.start()
        received: list[list[bytes]] = [[], []]
        deadline = time.monotonic() + 60
        while sum(map(len, received)) < 2 * count and time.monotonic() < deadline:
            for p, ring in enumerate(rings):
                received[p].extend(ring.take())
        for p in range(2):
            assert received[p] == [f"{p}:{i}".encode() * (1 + i % 7) for i in range(count)]
    finally:
        for process in processes:
            process.join(30)
        for ring in rings:
            ring.close()
    assert [process.exitcode for process in processes] == [0, 0]


def _echo(spec: ChannelSpec) -> None:
    """Answer every frame starting with A (ringing); frames starting with B are only read."""
    import select

    end = Endpoint(spec, "executor")
    try:
        while True:
            select.select([end.wake.fileno()], [], [], 10)
            end.wake.clear()
            for frame in end.inbox.take():
                if frame == b"stop":
                    return
                if frame.startswith(b"A"):
                    assert end.outbox.put(frame)
                    end.bell.ring()
    finally:
        end.close()


def _put_rung(end: Endpoint, frame: bytes) -> None:
    """Write ``frame`` and ring. The unrung frames of the previous round may still fill the ring
    when the reader was slow to wake (a loaded machine): ringing lets it drain them, so wait for
    room as a front end does instead of failing on a full ring."""
    deadline = time.monotonic() + 5
    while not end.outbox.put(frame):
        assert time.monotonic() < deadline, "the reader never drained the ring"
        end.bell.ring()
        time.sleep(0.001)
    end.bell.ring()


def test_no_wakeup_is_lost_when_unrung_frames_follow_rung_ones(tmp_path: Path) -> None:
    """The pattern the front ends use (a request rung, then a release left for the next wake-up)
    while the reader drains concurrently: every rung frame must be seen. A counter written
    non-atomically (struct zero-fills before it writes) once made the reader see a tail of 0,
    miss the request and sleep on it, within a few thousand round trips."""
    channel = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=4096)
    context = multiprocessing.get_context("spawn")
    echo = context.Process(target=_echo, args=(channel.spec,))
    echo.start()
    end = Endpoint(channel.spec, "frontend")
    try:
        for i in range(5_000):
            _put_rung(end, b"A%d" % i)
            # Keep writing unrung frames until the answer comes, so that the reader's drain
            # overlaps a counter update as often as possible.
            answers: list[bytes] = []
            deadline = time.monotonic() + 5
            while not answers:
                assert time.monotonic() < deadline, f"round trip {i} stalled: a lost wake-up"
                end.outbox.put(b"B")  # may not fit: then the next try
                answers = end.inbox.take()
            assert answers == [b"A%d" % i]
        _put_rung(end, b"stop")
        echo.join(30)
        assert echo.exitcode == 0
    finally:
        if echo.is_alive():
            echo.kill()
        end.close()
        channel.close()
