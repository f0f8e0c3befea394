"""A channel between one front-end process and the executor: two rings, two arenas, two doorbells.

The supervisor creates every piece, so that a channel outlives neither side's crash unnoticed:
when either process dies, the supervisor retires the channel (unlinks its names; mappings stay
valid in the survivor until it lets go) and creates a fresh one for the next pair. A channel is
therefore described by names alone (:class:`ChannelSpec`), which any process can open.

Direction     ring        arena (allocated by)      doorbell
-----------   ---------   -----------------------   ------------
requests      requests    request_arena (front end)  request_bell
answers       answers     answer_arena (executor)    answer_bell
"""

from __future__ import annotations

import contextlib
import os
import uuid
from pathlib import Path
from typing import Literal, TypeVar

import msgspec

from infermux.ipc.arena import Arena
from infermux.ipc.ring import Doorbell, FrameRing
from infermux.ipc.segment import Segment

DEFAULT_RING_BYTES = 4 * 1024 * 1024
DEFAULT_ARENA_BYTES = 256 * 1024 * 1024


class ChannelSpec(msgspec.Struct, frozen=True):
    """The names of a channel's pieces."""

    id: str
    requests: str
    answers: str
    request_arena: str
    answer_arena: str
    request_bell: str
    answer_bell: str


class Channel:
    """The supervisor's handle on a channel it created: :attr:`spec` to hand out, :meth:`close`
    to retire it."""

    def __init__(
        self,
        directory: Path,
        *,
        ring_bytes: int = DEFAULT_RING_BYTES,
        arena_bytes: int = DEFAULT_ARENA_BYTES,
    ) -> None:
        ident = uuid.uuid4().hex[:12]
        self._segments: list[Segment] = []
        self._fifos: list[Path] = []
        try:
            names = [self._segment(size) for size in (ring_bytes, ring_bytes)]
            names += [self._segment(arena_bytes) for _ in range(2)]
            bells = [self._fifo(directory / f"{ident}-{side}") for side in ("req", "ans")]
        except BaseException:
            self.close()
            raise
        self.spec = ChannelSpec(ident, *names, *bells)

    def _segment(self, size: int) -> str:
        segment = Segment(size)
        self._segments.append(segment)
        return segment.name

    def _fifo(self, path: Path) -> str:
        os.mkfifo(path, 0o600)
        self._fifos.append(path)
        return str(path)

    def close(self) -> None:
        """Unlink every piece; processes that mapped them keep their mappings until they close."""
        for segment in self._segments:
            with contextlib.suppress(BufferError):
                segment.close()
        for path in self._fifos:
            path.unlink(missing_ok=True)
        self._segments.clear()
        self._fifos.clear()


Side = Literal["frontend", "executor"]


class Endpoint:
    """One side's view of a channel: it reads :attr:`inbox`, writes :attr:`outbox`, allocates
    from :attr:`arena` (where its own tensors go) and reads the peer's from :attr:`peer_arena`.
    It watches :attr:`wake` and rings :attr:`bell` after writing."""

    def __init__(self, spec: ChannelSpec, side: Side) -> None:
        self.spec = spec
        front = side == "frontend"
        opened: list[FrameRing | Arena | Doorbell] = []
        try:
            self.outbox = _keep(opened, FrameRing.attach(spec.requests if front else spec.answers))
            self.inbox = _keep(opened, FrameRing.attach(spec.answers if front else spec.requests))
            mine, theirs = (
                (spec.request_arena, spec.answer_arena)
                if front
                else (spec.answer_arena, spec.request_arena)
            )
            self.arena = _keep(opened, Arena.attach(mine, allocator=True))
            self.peer_arena = _keep(opened, Arena.attach(theirs))
            self.bell = _keep(
                opened, Doorbell.fifo(spec.request_bell if front else spec.answer_bell)
            )
            self.wake = _keep(
                opened, Doorbell.fifo(spec.answer_bell if front else spec.request_bell)
            )
        except BaseException:
            for piece in opened:
                piece.close()
            raise

    def close(self) -> None:
        """Unmap everything. Views of the arenas still held elsewhere keep their mapping alive
        (closing such an arena is skipped; the mapping goes with the last view)."""
        for piece in (self.outbox, self.inbox, self.arena, self.peer_arena, self.bell, self.wake):
            with contextlib.suppress(BufferError, OSError):
                piece.close()


_Piece = TypeVar("_Piece", FrameRing, Arena, Doorbell)


def _keep(opened: list[FrameRing | Arena | Doorbell], piece: _Piece) -> _Piece:
    opened.append(piece)
    return piece
