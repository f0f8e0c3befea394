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
import time
import weakref

from infermux.backends.base import ExecuteResult

RESPONSE_BUFFER = 16
"""Responses of one request sent and not yet read before :meth:`ResponseStream.send` blocks."""

Sent = tuple[ExecuteResult | None, bool]
"""One response as sent: its result (None: no outputs, only the final flag) and the final flag."""

Stamped = tuple[ExecuteResult | None, bool, int]
"""One response as sent, and when it was sent (``perf_counter_ns``)."""


class ResponseStream:
    """A bounded, thread-safe channel from a model to the reader of one request's responses.

    ``send`` blocks while ``limit`` responses wait to be read: a client that stops reading holds
    the model back instead of growing the server's memory. It never blocks on the reader's own
    event-loop thread (that would deadlock; no model code runs there). Once the reader has gone
    (:meth:`close`), or the server ended the request (:meth:`end`: it failed, or overran its
    execution timeout), sends are dropped and :attr:`cancelled` is True, so a model may stop
    early; it may still send its final flag (Triton asks for it even then).

    The stream also keeps what the execution timeout of a decoupled model needs
    (``scheduling/response_gaps.py``): when the model last made progress on the request, and
    whether a send is held back by the reader (which is the client's slowness, not the model's).
    """

    def __init__(self, limit: int = RESPONSE_BUFFER) -> None:
        self._loop = asyncio.get_running_loop()
        self._wakeups = _wakeups_of(self._loop)
        self._loop_thread = threading.get_ident()
        self._limit = max(1, limit)
        self._items: collections.deque[Stamped] = collections.deque()
        self._changed = threading.Condition()
        self._waiter: asyncio.Future[None] | None = None
        self._final = False
        self._closed = False
        self._ended = False
        self._blocked = 0
        self.progress_ns = time.perf_counter_ns()
        """When the model last made progress on this request: its batch started (:meth:`begin`)
        or one of its sends returned."""
        self.resumed_ns = 0
        """When a send that waited for the reader last went on (0: none waited)."""
        self.started_ns = 0
        """When the request's batch started executing (0: not yet)."""

    @property
    def cancelled(self) -> bool:
        """The reader is gone, or the server ended the request: what is sent is dropped."""
        return self._closed or self._ended

    @property
    def finished(self) -> bool:
        """The final flag has been sent."""
        return self._final

    @property
    def over(self) -> bool:
        """Nothing more is expected from the model: it sent its final flag, the reader is gone,
        or the server ended the request."""
        return self._final or self._closed or self._ended

    @property
    def blocked(self) -> bool:
        """A send waits for the reader to catch up."""
        return self._blocked > 0

    def begin(self) -> None:
        """The request's batch starts executing: the time to its first response counts from
        now (on the loop, before the model can send)."""
        self.started_ns = self.progress_ns = time.perf_counter_ns()

    def send(self, result: ExecuteResult | None, *, final: bool = False) -> None:
        """Send one response (``result`` None: an empty one, which only a final flag makes
        worth sending). Raises RuntimeError once the final flag has been sent."""
        with self._changed:
            if self._final:
                raise RuntimeError("the final response of this request was already sent")
            self._final = final
            on_loop = threading.get_ident() == self._loop_thread
            if len(self._items) >= self._limit and not self.cancelled and not on_loop:
                self._blocked += 1
                try:
                    while len(self._items) >= self._limit and not self.cancelled:
                        self._changed.wait()
                finally:
                    self._blocked -= 1
                self.resumed_ns = time.perf_counter_ns()
            if self.cancelled:
                return
            now = self.progress_ns = time.perf_counter_ns()
            self._items.append((result, final, now))
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            self._wakeups.wake(waiter)

    def end(self, error: ExecuteResult) -> None:
        """End the stream with ``error`` unless the model already sent its final flag (the
        request failed outside the model's responses: in the queue, its batch, or by its
        execution timeout). What the model sends afterwards is dropped. On the loop."""
        with self._changed:
            if self.over:
                return
            self._ended = True
            self._items.append((error, True, time.perf_counter_ns()))
            self._changed.notify_all()  # a sender waiting for room: its request is over
            waiter, self._waiter = self._waiter, None
        if waiter is not None:
            _wake(waiter)

    async def get(self) -> Sent:
        """The next response, waiting for it (on the loop the stream was made on)."""
        result, final, _ = await self.get_stamped()
        return result, final

    async def get_stamped(self) -> Stamped:
        """The next response and when the model sent it."""
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


class _Wakeups:
    """The readers to wake on one loop, woken together: the senders of many requests (a thread
    each) share one ``call_soon_threadsafe`` per burst instead of paying a callback handle and
    a loop wake-up per response."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._lock = threading.Lock()
        self._due: list[asyncio.Future[None]] = []

    def wake(self, waiter: asyncio.Future[None]) -> None:
        """Wake ``waiter`` on the loop soon (from any thread but the loop's)."""
        with self._lock:
            self._due.append(waiter)
            if len(self._due) > 1:
                return  # the wake-up already scheduled takes this one too
        try:
            self._loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # the loop is closed: raised to the sender, as before
            with self._lock:
                self._due.clear()
            raise

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, []
        for waiter in due:
            _wake(waiter)


_WAKEUPS: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Wakeups] = (
    weakref.WeakKeyDictionary()
)
_WAKEUPS_LOCK = threading.Lock()


def _wakeups_of(loop: asyncio.AbstractEventLoop) -> _Wakeups:
    with _WAKEUPS_LOCK:
        wakeups = _WAKEUPS.get(loop)
        if wakeups is None:
            wakeups = _WAKEUPS[loop] = _Wakeups(loop)
        return wakeups
