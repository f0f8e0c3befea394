"""A single-producer single-consumer ring of byte frames in shared memory, with a doorbell.

Request and response headers between a front-end process and the executor travel here, one ring
per direction per front end (so every ring has exactly one writer and one reader); the tensors
they describe stay in the front end's :class:`~infermux.ipc.Arena`. Measured against a
socketpair and ``multiprocessing.Pipe`` in ``benchmarks/ipc/channel.py`` (``docs/decisions.md``):
334k frames/s against 215k and 83k on a 16-core host.

Layout: the producer's tail and the consumer's head are monotonically increasing byte counts,
each on its own cache line, then the data area. A frame is a 4-byte little-endian length and
its bytes; a frame that would cross the end of the data area is preceded by a wrap marker and
starts again at the beginning. The producer writes a frame's bytes before it publishes the new
tail, and the consumer reads the tail before the bytes; that order holds on x86-64, whose stores
are not reordered with other stores, and is not guaranteed elsewhere (Python has no memory
fences), so :class:`FrameRing` refuses other architectures.
"""

from __future__ import annotations

import contextlib
import os
import platform
import struct

from infermux.ipc.segment import Segment

_U64 = struct.Struct("<Q")
_U32 = struct.Struct("<I")
_WRAP = 0xFFFFFFFF
_HEAD, _TAIL = 0, 64  # byte counts, each on its own cache line
_HEAD_WORD, _TAIL_WORD = _HEAD // 8, _TAIL // 8
_LOAD_WORD = _TAIL_WORD + 1  # the producer's, on its cache line: see FrameRing.publish_load
META = 128
"""Bytes before the data area."""

ORDERED_STORES = platform.machine().lower() in ("x86_64", "amd64")
"""Whether this CPU keeps stores in program order, which the ring relies on."""


class FrameRing:
    """One direction of a channel: :meth:`put` on the producer side, :meth:`take` on the
    consumer side, over a :class:`~infermux.ipc.segment.Segment` both map."""

    def __init__(self, segment: Segment) -> None:
        if not ORDERED_STORES:
            raise RuntimeError(
                f"the shared-memory ring needs x86-64's store ordering; this is "
                f"{platform.machine()}"
            )
        if segment.size <= META + _U32.size:
            raise ValueError(f"a ring needs more than {META + _U32.size} bytes")
        self.segment = segment
        self._buf = segment.buf
        # The two counters as native 8-byte words: memoryview reads and writes one element with
        # a single aligned 8-byte load/store, which x86-64 makes atomic. struct.pack_into would
        # not do: it zero-fills its target before writing the bytes, so a reader in the other
        # process can see a counter of 0 for an instant, miss a published frame, and with its
        # doorbell already cleared, sleep on it (found by tests/unit/ipc/test_ring.py's
        # two-process stress test).
        self._words = segment.buf[:META].cast("Q")
        self.capacity = segment.size - META

    @classmethod
    def create(cls, size: int) -> FrameRing:
        """A new, empty ring of ``size`` bytes (metadata included)."""
        return cls(Segment(size))

    @classmethod
    def attach(cls, name: str) -> FrameRing:
        return cls(Segment.attach(name))

    @property
    def name(self) -> str:
        return self.segment.name

    @property
    def max_frame(self) -> int:
        """The largest frame that can ever fit."""
        return self.capacity - _U32.size

    def put(self, frame: bytes) -> bool:
        """Append ``frame``; False when the ring has no room for it now (nothing written)."""
        size = _U32.size + len(frame)
        if size > self.capacity:
            raise ValueError(f"a {len(frame)}-byte frame exceeds the ring's {self.max_frame}")
        buf, words = self._buf, self._words
        head = words[_HEAD_WORD]
        tail = words[_TAIL_WORD]
        pos = tail % self.capacity
        skip = self.capacity - pos if pos + size > self.capacity else 0
        if tail + skip + size - head > self.capacity:
            return False
        if skip:
            if skip >= _U32.size:  # else the reader knows a tail this short is a wrap too
                _U32.pack_into(buf, META + pos, _WRAP)
            pos = 0
        _U32.pack_into(buf, META + pos, len(frame))
        buf[META + pos + _U32.size : META + pos + size] = frame
        words[_TAIL_WORD] = tail + skip + size  # publish: after the bytes
        return True

    def pending(self) -> bool:
        """Whether frames are published and not taken yet (two loads: no syscall, no copy)."""
        words = self._words
        return bool(words[_HEAD_WORD] != words[_TAIL_WORD])

    def publish_load(self, running: int) -> None:
        """Producer side: how many requests this side is running (a hint for the consumer's
        choice to poll, not part of the frame protocol; one aligned store)."""
        self._words[_LOAD_WORD] = running

    def load(self) -> int:
        """Consumer side: what the producer last published with :meth:`publish_load` (0 until
        it does)."""
        return int(self._words[_LOAD_WORD])

    def take(self) -> list[bytes]:
        """Every frame published so far, oldest first (empty when there are none)."""
        buf, words = self._buf, self._words
        head = words[_HEAD_WORD]
        tail = words[_TAIL_WORD]  # read before the bytes it covers
        frames = []
        while head < tail:
            pos = head % self.capacity
            left = self.capacity - pos
            if left < _U32.size:
                head += left
                continue
            length = _U32.unpack_from(buf, META + pos)[0]
            if length == _WRAP:
                head += left
                continue
            start = META + pos + _U32.size
            frames.append(bytes(buf[start : start + length]))
            head += _U32.size + length
        words[_HEAD_WORD] = head  # hand the space back after copying the frames out
        return frames

    def close(self) -> None:
        self._words.release()
        self._buf = memoryview(b"")
        self.segment.close()


class Doorbell:
    """A wake-up across processes: an eventfd (a pipe where there is none), or a named FIFO
    (:meth:`fifo`) that processes started independently open by path. The consumer watches
    :meth:`fileno` (e.g. ``loop.add_reader``) and calls :meth:`clear` before draining its ring;
    the producer :meth:`ring` s after each :meth:`FrameRing.put` batch."""

    def __init__(self) -> None:
        if hasattr(os, "eventfd"):
            self._read = self._write = os.eventfd(0, os.EFD_NONBLOCK | os.EFD_CLOEXEC)
        else:  # pragma: no cover - no eventfd (not Linux)
            self._read, self._write = os.pipe()
            os.set_blocking(self._read, False)
            os.set_blocking(self._write, False)

    @classmethod
    def fifo(cls, path: str) -> Doorbell:
        """Open the FIFO at ``path`` (made with :func:`os.mkfifo`). Read-write, so that opening
        never blocks and the FIFO never reports end-of-file when the other side goes away."""
        bell = cls.__new__(cls)
        bell._read = bell._write = os.open(path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        return bell

    def fileno(self) -> int:
        return self._read

    def ring(self) -> None:
        # A full pipe (or counter) means the consumer is due to wake anyway.
        with contextlib.suppress(BlockingIOError):
            os.write(self._write, _U64.pack(1))

    def clear(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.read(self._read, 4096)

    def close(self) -> None:
        os.close(self._read)
        if self._write != self._read:
            os.close(self._write)
