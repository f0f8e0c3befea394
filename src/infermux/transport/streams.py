"""A decoupled model's responses across the channel, and how far the executor may run ahead.

A streamed request (an :class:`~infermux.ipc.wire.Infer` with a ``window``) is answered by one
:class:`~infermux.ipc.wire.Part` frame per response, as the model sends it; nothing waits for
the stream to end. Flow control is a credit window per stream: the executor sends at most
:data:`STREAM_WINDOW` responses beyond those the front end's reader took, then stops pulling
from the data plane's stream, whose own bound (``backends/responses.py``: 16 per request) then
blocks the model's next send. So a reader that stops reading holds the model back with at most
``STREAM_WINDOW`` responses with the front end (copied out of the arena as they arrive, their
blocks handed back at once) and ``RESPONSE_BUFFER`` in the executor, per stream.

The executor side is :class:`Credit`; the front end's, :class:`Streams` of :class:`Incoming`.
"""

from __future__ import annotations

import asyncio
import collections
from collections.abc import AsyncGenerator, Callable

from infermux.errors import InfermuxError, InternalError
from infermux.ipc import Block
from infermux.ipc.wire import (
    Cancel,
    Failure,
    Part,
    ToFrontend,
    encode,
    part_error,
    raise_failure,
    read_tensor,
)
from infermux.ipc.wire import Credit as CreditFrame
from infermux.types import InferResponse

from .link import Link

Free = Callable[[Link, list[int]], None]
"""Hands answer blocks (offsets in the executor's arena) back to the executor."""

STREAM_WINDOW = 16
"""Responses of one stream the executor sends before the front end's reader took any."""


class Credit:
    """The executor's count of responses it may still send on one stream."""

    def __init__(self, window: int) -> None:
        self._left = max(1, window)
        self._more = asyncio.Event()

    def grant(self, count: int) -> None:
        """The reader took ``count`` more responses (a Credit frame)."""
        self._left += count
        self._more.set()

    async def spend(self) -> None:
        """Wait until one more response may be sent, and count it as sent."""
        while self._left <= 0:
            self._more.clear()
            await self._more.wait()
        self._left -= 1


class Incoming:
    """One stream in a front end: responses arrived and not yet taken by the reader, and the
    input blocks the executor may still read (until its first frame for the stream)."""

    def __init__(self, window: int = STREAM_WINDOW) -> None:
        self.blocks: list[Block] = []
        self.over = False
        """Its last frame came (final response or failure), or the channel went."""
        self.abandoned = False
        """The reader left before the end: what still comes is dropped."""
        self._items: collections.deque[InferResponse | InfermuxError] = collections.deque()
        self._waiter: asyncio.Future[None] | None = None
        self._batch = max(1, window // 2)  # credit goes back in halves: fewer frames
        self._taken = 0

    def put(self, item: InferResponse | InfermuxError, *, last: bool) -> None:
        """A response (or the error that ends the stream) arrived; ``last``: nothing follows."""
        self.over = self.over or last
        if self.abandoned:
            return
        self._items.append(item)
        waiter, self._waiter = self._waiter, None
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def get(self) -> InferResponse:
        """The next response, waiting for it; raises the error that ended the stream."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            await self._waiter
        item = self._items.popleft()
        if isinstance(item, InfermuxError):
            raise item
        return item

    def took(self) -> int:
        """Count one response as taken by the reader; the credit to send back now (0: none
        yet, it goes back in batches of half the window)."""
        self._taken += 1
        if self._taken < self._batch or self.over:
            return 0
        taken, self._taken = self._taken, 0
        return taken

    def abandon(self) -> None:
        """The reader is gone: drop what waits and whatever comes later."""
        self.abandoned = True
        self._items.clear()


class Streams:
    """A front end's streamed requests on one channel that are not over, by ``seq``."""

    def __init__(self) -> None:
        self._open: dict[int, Incoming] = {}

    def __len__(self) -> int:
        return len(self._open)

    def __contains__(self, seq: int) -> bool:
        return seq in self._open

    def open(self, seq: int, blocks: list[Block]) -> Incoming:
        """Stream ``seq``, whose inputs are in ``blocks`` of the front end's arena."""
        stream = self._open[seq] = Incoming(STREAM_WINDOW)
        stream.blocks = blocks
        return stream

    def answered(self, link: Link, message: ToFrontend, free: Free) -> None:
        """A frame for one of these streams: a response, or the failure that ends it."""
        seq = message.seq
        stream = self._open[seq]
        for block in stream.blocks:  # the executor copied the inputs before answering
            link.release(block)
        stream.blocks = []
        if not isinstance(message, Part):
            del self._open[seq]
            if isinstance(message, Failure):
                stream.put(raise_failure(message), last=True)
            else:
                stream.put(InternalError(f"unexpected answer to stream {seq}"), last=True)
            return
        if message.final:
            del self._open[seq]
        try:
            if not stream.abandoned:  # copied at once: the arena holds no slow reader's backlog
                stream.put(_response(link, message), last=message.final)
            elif message.final:
                stream.over = True
        finally:
            free(link, [o.offset for o in message.outputs])

    def fail_all(self, error: InfermuxError) -> None:
        """The channel went away: every stream ends with ``error``."""
        for stream in self._open.values():
            stream.put(error, last=True)
        self._open.clear()


async def read_stream(link: Link, seq: int, stream: Incoming) -> AsyncGenerator[InferResponse]:
    """Stream ``seq``'s responses as its reader takes them, the reader's credit sent back; a
    reader that leaves before the final response (closes this early, or is cancelled) drops
    what still comes and sends :class:`~infermux.ipc.wire.Cancel`, which closes the request's
    stream in the executor: the model sees it cancelled. Close it with ``aclosing``, so the
    Cancel goes at once."""
    try:
        while True:
            response = await stream.get()
            credit = stream.took()
            if credit and not link.closed:
                link.send(encode(CreditFrame(seq, credit)))
            yield response
            if response.final:
                return
    finally:
        if not stream.over:
            stream.abandon()
            if not link.closed:  # a closed link's executor is gone, or going
                link.send(encode(Cancel(seq)))


def _response(link: Link, frame: Part) -> InferResponse:
    """The response a :class:`Part` carries, its outputs copied out of the arena."""
    outputs = [read_tensor(link.endpoint.peer_arena, o, copy=True) for o in frame.outputs]
    return InferResponse(
        frame.model,
        frame.version,
        outputs,
        frame.id,
        frame.parameters,
        final=frame.final,
        error=part_error(frame),
        flag_only=frame.flag_only,
    )
