"""The responses of one request to a decoupled model: zero or more results, then a final flag.

A decoupled model (``model_transaction_policy { decoupled: true }``) does not return its answers
from ``execute``: it sends them, one by one, through the :class:`ResponseStream` of each request
(:attr:`ModelRequest.responses <infermux.backends.base.ModelRequest.responses>`), from the
instance's thread or from any thread it started, also after ``execute`` returned. The scheduler
reads them on the event loop, in the order they were sent.
"""

from __future__ import annotations

import asyncio
import collections
import threading

from infermux.backends.base import ExecuteResult

RESPONSE_BUFFER = 16
"""Responses of one request sent and not yet read before :meth:`ResponseStream.send` blocks."""

Sent = tuple[ExecuteResult | None, bool]
"""One response as sent: its result (None: no outputs, only the final flag) and the final flag."""


class ResponseStream:
    """A bounded, thread-safe channel from a model to the reader of one request's responses.

    ``send`` blocks while ``limit`` responses wait to be read: a client that stops reading holds
    the model back instead of growing the server's memory. It never blocks on the reader's own
    event-loop thread (that would deadlock; no model code runs there). Once the reader has gone
    (:meth:`close`), sends are dropped and :attr:`cancelled` is True, so a model may stop early.
    """

    def __init__(self, limit: int = RESPONSE_BUFFER) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._limit = max(1, limit)
        self._items: collections.deque[Sent] = collections.deque()
        self._changed = threading.Condition()
        self._waiter: asyncio.Future[None] | None = None
        self._final = False
        self._closed = False

    @property
    def cancelled(self) -> bool:
        """The reader is gone: what is sent from now on is dropped."""
        return self._closed

    @property
    def finished(self) -> bool:
        """The final flag has been sent."""
        return self._final

    def send(self, result: ExecuteResult | None, *, final: bool = False) -> None:
        """Send one response (``result`` None: an empty one, which only a final flag makes
        worth sending). Raises RuntimeError once the final flag has been sent."""
        with self._changed:
            if self._final:
                raise RuntimeError("the final response of this request was already sent")
            self._final = final
            on_loop = threading.get_ident() == self._loop_thread
            while len(self._items) >= self._limit and not self._closed and not on_loop:
                self._changed.wait()
            if self._closed:
                return
            self._items.append((result, final))
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._loop.call_soon_threadsafe(_wake, waiter)

    def end(self, error: ExecuteResult) -> None:
        """End the stream with ``error`` unless the model already sent its final flag (the
        request failed outside the model's responses: in the queue, or its batch). On the loop."""
        with self._changed:
            if self._final or self._closed:
                return
            self._final = True
            self._items.append((error, True))
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    async def get(self) -> Sent:
        """The next response, waiting for it (on the loop the stream was made on)."""
        while True:
            with self._changed:
                if self._items:
                    item = self._items.popleft()
                    self._changed.notify_all()
                    return item
                waiter = self._waiter = self._loop.create_future()
            await waiter

    def close(self) -> None:
        """The reader is gone: drop what waits, release blocked senders, drop later sends."""
        with self._changed:
            self._closed = True
            self._items.clear()
            self._changed.notify_all()


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)
