"""One side of a front-end <-> executor channel on an asyncio loop.

Frames are handed to ``on_frames`` as they arrive (the doorbell's fd is watched by the loop, so
no thread waits); :meth:`Link.send` writes a frame and rings the peer's doorbell, unless the
frame can wait for the peer's next wake-up. A full ring (the peer stalled) keeps frames in
order in a backlog, never drops them: it is retried whenever the peer wakes this side (it took
frames and answered) and every millisecond otherwise.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
from collections.abc import Callable

from infermux.errors import InvalidArgumentError, UnavailableError
from infermux.ipc import Block, Endpoint
from infermux.ipc.wire import WireTensor, arena_bytes, write_tensor
from infermux.runtime.loop_polling import poll_each_iteration
from infermux.types import Tensor, uses_shared_memory

logger = logging.getLogger(__name__)

_RETRY_SECONDS = 0.001
"""The backlog's fallback retry. Not shorter: uvloop rounds ``call_later`` to whole milliseconds,
so anything under half of one ran at once and the loop spun until the peer drained its ring."""
_SPACE_POLL_SECONDS = 0.001


class Link:
    """An :class:`Endpoint` driven by the running event loop."""

    def __init__(self, endpoint: Endpoint, on_frames: Callable[[list[bytes]], None]) -> None:
        self.endpoint = endpoint
        self._on_frames = on_frames
        self._loop = asyncio.get_running_loop()
        self._backlog: collections.deque[bytes] = collections.deque()
        self._retry: asyncio.TimerHandle | None = None
        self._rung_this_iteration = False
        self._ring_due = False
        self._space = asyncio.Event()
        self._polling = False
        self.closed = False
        self._loop.add_reader(endpoint.wake.fileno(), self._drain)
        # Frames may have been written before this side started watching.
        self._loop.call_soon(self._drain)

    @property
    def id(self) -> str:
        return self.endpoint.spec.id

    def _drain(self) -> None:
        if self.closed:
            return
        self.endpoint.wake.clear()
        if self._backlog:  # the peer is awake and answering: it has likely made room
            self._flush_backlog()
        frames = self.endpoint.inbox.take()
        if frames:
            self._on_frames(frames)

    def poll_inbox(self, seconds: float) -> None:
        """Look for frames once per loop iteration, for at most ``seconds`` or until some
        arrive, and drain them at once, instead of sleeping until the peer's doorbell wakes the
        loop: on the H200 host a loop that slept a millisecond runs ~0.3-0.5 ms after its
        doorbell rang (``docs/decisions.md``, *GPU completions at low load*). For a side that
        waits for its only request's answer; the loop keeps serving everything else meanwhile,
        at the price of its CPU while it polls. One poll at a time."""
        if self._polling or seconds <= 0:
            return
        self._polling = True
        inbox = self.endpoint.inbox

        def ended() -> None:
            self._polling = False

        def ready() -> bool:
            return self.closed or inbox.pending()

        def arrived() -> None:
            if not self.closed:
                self._drain()

        poll_each_iteration(self._loop, seconds, ready, arrived, ended)

    # -- sending ----------------------------------------------------------------------------------

    def send(self, frame: bytes, *, wake: bool = True) -> None:
        """Write ``frame`` for the peer (in order) and make sure its doorbell rings after it.
        ``wake=False`` leaves the frame for the peer's next wake-up: news that can wait (blocks
        released) should not cost the peer a context switch of its own."""
        if self.closed:
            return
        if self._backlog or not self.endpoint.outbox.put(frame):
            self._backlog.append(frame)
            self._schedule_retry()
        if not wake:
            return
        # The first frame of a loop iteration rings at once (low latency when idle); frames
        # written after it in the same iteration share one more ring at its end (fewer
        # syscalls under load). Never fewer: a frame written after the peer drained must ring.
        if self._rung_this_iteration:
            if not self._ring_due:
                self._ring_due = True
                self._loop.call_soon(self._ring_again)
            return
        self._rung_this_iteration = True
        self._loop.call_soon(self._new_iteration)
        self.endpoint.bell.ring()

    def _new_iteration(self) -> None:
        self._rung_this_iteration = False

    def _ring_again(self) -> None:
        self._ring_due = False
        if not self.closed:
            self.endpoint.bell.ring()

    def _schedule_retry(self) -> None:
        if self._retry is None:
            self._retry = self._loop.call_later(_RETRY_SECONDS, self._flush_backlog)

    def _flush_backlog(self) -> None:
        if self._retry is not None:
            self._retry.cancel()
            self._retry = None
        if self.closed:
            return
        while self._backlog and self.endpoint.outbox.put(self._backlog[0]):
            self._backlog.popleft()
        self.endpoint.bell.ring()
        if self._backlog:
            self._schedule_retry()

    # -- arena ------------------------------------------------------------------------------------

    async def allocate(self, size: int, what: str) -> Block:
        """A block of this side's arena, waiting while the arena is full (the peer frees space
        as it answers); refused outright when ``size`` could never fit."""
        arena = self.endpoint.arena
        if size > arena.size:
            raise InvalidArgumentError(
                f"{what} needs {size} bytes, more than the {arena.size}-byte transfer arena "
                "between front end and executor (infermux serve --ipc-arena-mb)"
            )
        while (block := arena.allocate(size)) is None:
            self._space.clear()
            # Releases travel without a wake-up (see send), so look for them ourselves too.
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._space.wait(), _SPACE_POLL_SECONDS)
            self._drain()
            if self.closed:
                raise UnavailableError("the channel closed while waiting for arena space")
        return block

    async def put_tensor(self, tensor: Tensor, what: str) -> tuple[Block | None, WireTensor]:
        """Write ``tensor``'s bytes into a block of this side's arena (waiting for space) and
        describe them; a tensor placed in client shared memory has no bytes to write (no
        block), the peer's data plane reads or wrote the region itself."""
        if uses_shared_memory(tensor.parameters):
            return None, WireTensor(tensor.name, tensor.datatype, tensor.shape, tensor.parameters)
        size, raw = arena_bytes(tensor)
        block = await self.allocate(size, what)
        return block, write_tensor(self.endpoint.arena, block, tensor, raw)

    def release(self, block: Block) -> None:
        """Give a block of this side's arena back and wake whoever waits for space."""
        self.endpoint.arena.release(block)
        self._space.set()

    def mute(self) -> None:
        """Stop watching and sending, keeping the mappings (views of the peer's arena may still
        be in use); frames not yet delivered are dropped: the peer is gone or being replaced.
        Whoever waits for arena space is woken with an error."""
        if self.closed:
            return
        self.closed = True
        self._loop.remove_reader(self.endpoint.wake.fileno())
        if self._retry is not None:
            self._retry.cancel()
        self._backlog.clear()
        self._space.set()

    def close(self) -> None:
        """:meth:`mute`, then unmap."""
        self.mute()
        self.endpoint.close()
