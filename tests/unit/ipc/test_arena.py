"""The tensor arena: blocks never overlap, bytes stay put until released, space comes back in
allocation order whatever the release order, the ring wraps, another process reads in place."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Iterator

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermux.ipc import ALIGNMENT, Arena, Block

SIZE = 64 * ALIGNMENT


@pytest.fixture
def arena() -> Iterator[Arena]:
    arena = Arena(SIZE)
    yield arena
    arena.close()


def fill(arena: Arena, block: Block, value: int) -> None:
    arena.buffer(block.offset, block.size)[:] = bytes([value]) * block.size


def holds(arena: Arena, block: Block, value: int) -> bool:
    return bytes(arena.buffer(block.offset, block.size)) == bytes([value]) * block.size


def test_blocks_are_aligned_and_laid_one_after_another(arena: Arena) -> None:
    a, b = arena.allocate(10), arena.allocate(ALIGNMENT + 1)
    assert a is not None
    assert b is not None
    assert (a.offset, b.offset) == (0, ALIGNMENT)
    assert arena.used == 3 * ALIGNMENT
    assert arena.allocate(SIZE) is None  # no room now...
    arena.release(a)
    arena.release(b)
    whole = arena.allocate(SIZE)  # ...and all of it once everything came back
    assert whole is not None
    assert whole.offset == 0


def test_space_behind_a_live_block_waits_for_it(arena: Arena) -> None:
    first = arena.allocate(ALIGNMENT)
    blocks = [arena.allocate(ALIGNMENT) for _ in range(62)]
    assert first is not None
    assert all(b is not None for b in blocks)
    for block in blocks:
        assert block is not None
        arena.release(block)  # released out of order: nothing is reclaimed yet
    assert arena.used == 63 * ALIGNMENT
    arena.release(first)
    assert arena.used == 0


def test_the_ring_wraps_and_pads_the_end(arena: Arena) -> None:
    a = arena.allocate(40 * ALIGNMENT)
    b = arena.allocate(20 * ALIGNMENT)
    assert a is not None
    assert b is not None
    arena.release(a)
    # 4 lines left at the end, 40 free at the start: a 10-line block goes to the start.
    c = arena.allocate(10 * ALIGNMENT)
    assert c is not None
    assert c.offset == 0
    assert arena.used == (20 + 4 + 10) * ALIGNMENT  # the skipped end counts until reclaimed
    arena.release(b)
    assert arena.used == 10 * ALIGNMENT
    arena.release(c)
    assert arena.used == 0


def test_double_release_and_foreign_allocation_are_refused(arena: Arena) -> None:
    block = arena.allocate(8)
    assert block is not None
    arena.release(block)
    with pytest.raises(ValueError, match="already released"):
        arena.release(block)
    other = Arena.attach(arena.name)
    try:
        with pytest.raises(RuntimeError, match="one allocating mapping"):
            other.allocate(8)
        with pytest.raises(ValueError, match="outside the arena"):
            other.buffer(SIZE - 8, 16)
    finally:
        other.close()
    with pytest.raises(ValueError, match="at least"):
        Arena(8)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.booleans(), st.integers(0, 20 * ALIGNMENT), st.integers(0, 99))))
def test_random_allocations_and_releases_keep_every_block_intact(
    steps: list[tuple[bool, int, int]],
) -> None:
    arena = Arena(SIZE)
    try:
        live: list[tuple[Block, int]] = []
        for n, (allocate, size, pick) in enumerate(steps):
            if allocate or not live:
                block = arena.allocate(size)
                if block is None:
                    # Refused only when the ring really has no room for it.
                    assert arena.used + max(size, 1) > 0
                    continue
                assert block.offset % ALIGNMENT == 0
                assert block.offset + block.size <= SIZE
                for other, _ in live:
                    assert (
                        block.offset + block.size <= other.offset
                        or other.offset + other.size <= block.offset
                        or 0 in (block.size, other.size)
                    )
                fill(arena, block, n % 256)
                live.append((block, n % 256))
            else:
                block, value = live.pop(pick % len(live))
                assert holds(arena, block, value)
                arena.release(block)
        for block, value in live:
            assert holds(arena, block, value)
            arena.release(block)
        assert arena.used == 0
        assert arena.allocate(SIZE) is not None
    finally:
        arena.close()


def test_threads_allocating_at_once_get_disjoint_blocks(arena: Arena) -> None:
    errors: list[str] = []

    def work(value: int) -> None:
        for _ in range(300):
            block = arena.allocate(ALIGNMENT * (1 + value % 3))
            if block is None:
                continue
            fill(arena, block, value)
            if not holds(arena, block, value):
                errors.append(f"block at {block.offset} was overwritten")
            arena.release(block)

    threads = [threading.Thread(target=work, args=(v,)) for v in range(1, 5)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert arena.used == 0


def _read(name: str, offset: int, size: int, out: multiprocessing.Queue[bytes]) -> None:
    other = Arena.attach(name)
    out.put(bytes(other.buffer(offset, size)))
    other.close()


def test_another_process_reads_the_bytes_in_place(arena: Arena) -> None:
    block = arena.allocate(5)
    assert block is not None
    arena.buffer(block.offset, 5)[:] = b"hello"
    context = multiprocessing.get_context("spawn")
    out: multiprocessing.Queue[bytes] = context.Queue()
    process = context.Process(target=_read, args=(arena.name, block.offset, 5, out))
    process.start()
    assert out.get(timeout=30) == b"hello"
    process.join(30)
    assert process.exitcode == 0


def test_a_local_arena_allocates_in_this_process_memory_and_knows_its_address() -> None:
    import numpy as np

    local = Arena.local(SIZE + 5)  # rounded down to the alignment
    try:
        assert local.size == SIZE
        assert local.name == ""
        block = local.allocate(100)
        assert block is not None
        fill(local, block, 9)
        view = np.frombuffer(local.buffer(block.offset, block.size), np.uint8)
        assert view.__array_interface__["data"][0] == local.address + block.offset
        assert holds(local, block, 9)
        del view
        local.release(block)
    finally:
        local.close()
