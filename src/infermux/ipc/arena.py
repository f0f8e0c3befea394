"""A shared-memory arena for tensors that cross a process boundary, written once and read in place.

A front-end process writes a request's tensor bytes into its arena; the executor maps the arena
once at start-up and reads them where they lie, straight into its pinned staging buffers. Only
the process that created an arena allocates from it, so the allocator's bookkeeping lives in that
process alone; the other side sees offsets.

Allocation is a ring: blocks are handed out one after another, wrapping to the start of the arena,
and may be released in any order, but space is reclaimed in allocation order. Requests mostly
finish in the order they arrived, so this wastes little, costs O(1) per call and never fragments;
a request held for long only delays reuse of the space behind it, and :meth:`Arena.allocate`
answers ``None`` when nothing fits, so the caller can wait or refuse the request.
"""

from __future__ import annotations

import collections
import threading
from dataclasses import dataclass, field

from infermux.ipc.segment import Segment

ALIGNMENT = 64
"""Every block starts on a cache line (and suits any dtype's alignment)."""


@dataclass(slots=True)
class Block:
    """``size`` bytes at ``offset`` of the arena (``size`` as asked; the ring rounds it up)."""

    offset: int
    size: int
    _span: int = field(default=0, repr=False)  # bytes the ring gave it, padding included
    _released: bool = field(default=False, repr=False)


class Arena:
    """An arena of ``size`` bytes in POSIX shared memory.

    Create it with ``Arena(size)`` in the allocating process and :meth:`attach` it by
    :attr:`name` elsewhere (or create it in a third process and attach the allocator).
    Thread-safe: several threads (or an event loop and its executor
    threads) may allocate and release.
    """

    def __init__(self, size: int, *, name: str | None = None) -> None:
        if size < ALIGNMENT:
            raise ValueError(f"an arena needs at least {ALIGNMENT} bytes, got {size}")
        self.size = size - size % ALIGNMENT
        self._segment = Segment(self.size, name=name)
        self._owner = True
        self._lock = threading.Lock()
        self._live: collections.deque[Block] = collections.deque()
        self._head = 0  # where the next block starts
        self._used = 0  # bytes from the oldest live block to _head, wrap padding included

    @classmethod
    def attach(cls, name: str, *, allocator: bool = False) -> Arena:
        """Map an arena another process created. ``allocator=True`` makes this mapping the one
        that allocates (the creator then must not): a supervisor creates arenas so that they
        outlive the processes using them, and hands each to the process that writes it."""
        return cls._over(Segment.attach(name), allocator)

    @classmethod
    def local(cls, size: int) -> Arena:
        """An arena in this process's own memory, with the same allocator: blocks for data
        that stays in this process (e.g. shared-memory inputs read for the GPU)."""
        return cls._over(Segment.anonymous(size - size % ALIGNMENT), True)

    @classmethod
    def _over(cls, segment: Segment, owner: bool) -> Arena:
        arena = cls.__new__(cls)
        arena._segment = segment
        arena.size = segment.size
        arena._owner = owner
        arena._lock = threading.Lock()
        arena._live = collections.deque()
        arena._head = arena._used = 0
        return arena

    @property
    def name(self) -> str:
        return self._segment.name

    @property
    def address(self) -> int:
        """Where the arena starts in this process's address space (for registering it with a
        device driver)."""
        return self._segment.address

    @property
    def used(self) -> int:
        """Bytes not yet reclaimed (live blocks, released ones behind a live one, padding)."""
        return self._used

    def buffer(self, offset: int, size: int) -> memoryview:
        """The bytes ``[offset, offset + size)`` of the arena, checked against its bounds."""
        if offset < 0 or size < 0 or offset + size > self.size:
            raise ValueError(
                f"bytes [{offset}, {offset + size}) are outside the arena's {self.size} bytes"
            )
        return self._segment.buf[offset : offset + size]

    def allocate(self, size: int) -> Block | None:
        """A block of ``size`` bytes, or None when the arena has no room for it now."""
        if size < 0:
            raise ValueError(f"cannot allocate {size} bytes")
        if not self._owner:
            raise RuntimeError("only the arena's one allocating mapping allocates from it")
        span = max(-(-size // ALIGNMENT) * ALIGNMENT, ALIGNMENT)
        with self._lock:
            tail = (self._head - self._used) % self.size
            if self._used == 0:  # empty: start over at 0, so large blocks fit whole
                self._head = tail = 0
            if self._head >= tail and self._used < self.size:
                # Free space is [head, size) then [0, tail).
                if span <= self.size - self._head:
                    return self._take(span, size)
                if span <= tail:  # skip the end of the arena: padding until it is reclaimed
                    padding = Block(self._head, 0, self.size - self._head, _released=True)
                    self._live.append(padding)
                    self._used += padding._span
                    self._head = 0
                    return self._take(span, size)
                return None
            if span <= tail - self._head:  # wrapped: free space is [head, tail)
                return self._take(span, size)
            return None

    def _take(self, span: int, size: int) -> Block:
        block = Block(self._head, size, span)
        self._live.append(block)
        self._head = (self._head + span) % self.size
        self._used += span
        return block

    def release(self, block: Block) -> None:
        """Give ``block`` back; its space is reused once every block allocated before it is
        released too. Releasing a block twice is an error (it would free another's bytes)."""
        with self._lock:
            if block._released:
                raise ValueError(f"block at offset {block.offset} was already released")
            block._released = True
            while self._live and self._live[0]._released:
                self._used -= self._live.popleft()._span

    def close(self) -> None:
        """Unmap the arena (views handed out must be released first); the creator also removes
        the shared-memory object."""
        self._segment.close()
