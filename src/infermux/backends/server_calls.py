"""How a model calls the server it runs in (Triton's Business Logic Scripting, BLS).

Backends sit below the data plane and must not import it; the data plane hands its ``infer``
and ``infer_stream`` down instead (``dataplane/assembly.py`` attaches them once built, the
repository notes the event loop it serves on). A model's instance thread then submits requests
to that loop and waits, so a call from a model takes the same path as a client's request:
routing, validation, the target's queue and batches, its statistics. Tensors are passed by
reference: nothing is copied on the way.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable

from infermux.errors import UnavailableError
from infermux.types import InferRequest, InferResponse

Infer = Callable[[InferRequest], Awaitable[InferResponse]]
"""The data plane's ``infer``: validate, route, schedule and run one request."""

InferStream = Callable[[InferRequest], AsyncIterator[InferResponse]]
"""The data plane's ``infer_stream``: one request's responses in order, the last one final."""

_ON_LOOP = (
    "a model cannot wait for another model's answer on the server's event loop; "
    "call it from execute() (or await async_exec() in an async execute)"
)


class ServerCalls:
    """The server's ``infer`` for models, bound late: the repository that loads the models is
    built before the data plane that will serve their calls."""

    def __init__(self) -> None:
        self._infer: Infer | None = None
        self._stream: InferStream | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, infer: Infer, stream: InferStream | None = None) -> None:
        """Serve models' calls with ``infer`` and, for calls that read a stream of responses
        (a decoupled model's), ``stream`` (the data plane's ``infer_stream``)."""
        self._infer = infer
        self._stream = stream

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop ``infer`` runs on (the one the repository loads models from). From
        now on this is the server of threads that have none set (:func:`current`)."""
        global _serving  # noqa: PLW0603  (one server per process; a later one replaces it)
        self._loop = loop
        _serving = weakref.ref(self)

    def infer(self, request: InferRequest) -> InferResponse:
        """Run ``request`` and wait for its answer; called from a model's thread, never from the
        server's event loop (it would wait for itself). Raises the request's error."""
        infer, loop = self._ready()
        if _running_loop() is loop:
            raise UnavailableError(_ON_LOOP)
        return asyncio.run_coroutine_threadsafe(_call(infer, request), loop).result()

    async def infer_async(self, request: InferRequest) -> InferResponse:
        """Run ``request`` on the server's loop, awaited from another loop (an ``async def
        execute`` runs on a loop of its instance's thread)."""
        infer, loop = self._ready()
        if _running_loop() is loop:
            return await infer(request)
        future = asyncio.run_coroutine_threadsafe(_call(infer, request), loop)
        return await asyncio.wrap_future(future)

    def stream(self, request: InferRequest) -> CallResponses:
        """The responses to ``request`` as the target sends them: a decoupled model's zero or
        more then its final flag, any other model's one. Nothing runs before the first read."""
        _, loop = self._ready()
        if self._stream is None:
            raise UnavailableError("this server does not stream responses to models")
        return CallResponses(self._stream(request), loop)

    def _ready(self) -> tuple[Infer, asyncio.AbstractEventLoop]:
        if self._infer is None or self._loop is None or self._loop.is_closed():
            raise UnavailableError("this server does not take requests from models yet")
        return self._infer, self._loop


class CallResponses:
    """The responses to one call from a model, each read from the server's loop when asked
    for: nothing is buffered here, so a model that reads slowly holds the target back as a
    slow client does (the target's own response buffer holds what it sent ahead).

    One reader at a time, from a model's thread (:meth:`next`) or from an event loop
    (:meth:`anext`); :meth:`cancel` and :meth:`abandon` may come from any thread. Every
    touch of the underlying stream happens on the server's loop, so none of them race.
    """

    def __init__(
        self, responses: AsyncIterator[InferResponse], loop: asyncio.AbstractEventLoop
    ) -> None:
        self._responses = responses
        self._loop = loop
        self._reading: asyncio.Task[InferResponse | None] | None = None  # on the loop
        self._over = False  # the last response was read, or the call was cancelled

    @property
    def over(self) -> bool:
        """The last response was read, or the call given up: reads return None."""
        return self._over

    def next(self) -> InferResponse | None:
        """The next response, waited for on this thread; None once there are no more.
        Raises the call's InfermuxError when it fails before it runs (later failures are
        responses with ``error`` set)."""
        if self._over:
            return None
        if _running_loop() is self._loop:
            raise UnavailableError(_ON_LOOP)
        future = asyncio.run_coroutine_threadsafe(self._read(), self._loop)
        try:
            return future.result()
        except concurrent.futures.CancelledError:
            return None  # cancel() came meanwhile

    async def anext(self) -> InferResponse | None:
        """:meth:`next` for a caller on an event loop (the server's or another)."""
        if self._over:
            return None
        if _running_loop() is self._loop:
            reading: asyncio.Future[InferResponse | None] = self._loop.create_task(self._read())
        else:
            reading = asyncio.wrap_future(
                asyncio.run_coroutine_threadsafe(self._read(), self._loop)
            )
        try:
            return await reading
        except asyncio.CancelledError:
            if reading.cancelled() and self.over:
                return None  # cancel() came meanwhile, not the caller's own cancellation
            raise

    def cancel(self) -> None:
        """Give the call up: the target sees its request cancelled, as when a client goes
        (``is_cancelled()``, its sends dropped). No response is read after this."""
        if not self._over:
            self._over = True
            _soon(self._loop, self._cancel_on_loop)

    def abandon(self) -> None:
        """Nobody will read the rest: read it on the server's loop and drop it, so that the
        target runs to its end as it would for a reader (Triton drains an unread iterator)."""
        if not self._over:
            self._over = True
            _soon(self._loop, lambda: _in_background(self._loop, _drain(self._responses)))

    async def _read(self) -> InferResponse | None:
        if self._over:
            return None  # cancel() came after this read was asked for: its close is on the way
        self._reading = asyncio.current_task()
        try:
            response = await anext(self._responses, None)
        finally:
            self._reading = None
        if response is None or response.final:
            self._over = True
            await _drain(self._responses)  # nothing follows the final response: let it end
        return response

    def _cancel_on_loop(self) -> None:
        if self._reading is not None:
            self._reading.cancel()  # the read's task stops the stream where it waits
        else:
            _in_background(self._loop, _close(self._responses))


async def _call(infer: Infer, request: InferRequest) -> InferResponse:
    return await infer(request)


async def _drain(responses: AsyncIterator[InferResponse]) -> None:
    async for _ in responses:
        pass


async def _close(responses: AsyncIterator[InferResponse]) -> None:
    close = getattr(responses, "aclose", None)
    if close is not None:
        await close()


_background: set[asyncio.Task[None]] = set()  # the loop keeps only weak references to tasks


def _in_background(loop: asyncio.AbstractEventLoop, work: Awaitable[None]) -> None:
    async def run() -> None:
        await work

    task = loop.create_task(run())
    _background.add(task)
    task.add_done_callback(_background.discard)


def _soon(loop: asyncio.AbstractEventLoop, callback: Callable[[], object]) -> None:
    with contextlib.suppress(RuntimeError):  # the server's loop is closed: nothing runs there
        loop.call_soon_threadsafe(callback)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_current = threading.local()
_serving: weakref.ref[ServerCalls] | None = None  # the process's server, once it serves


def current() -> ServerCalls | None:
    """The server of the model running on this thread: the one its instance set, or, on a
    thread the model started itself (a decoupled model's sender, say), the server this process
    runs. None in a worker process of its own (``isolation: process``) or where set so."""
    if hasattr(_current, "calls"):
        calls: ServerCalls | None = _current.calls
        return calls
    return _serving() if _serving is not None else None


def set_current(calls: ServerCalls | None) -> ServerCalls | None:
    """Make ``calls`` this thread's server; returns the previous one, to put back."""
    previous = current()
    _current.calls = calls
    return previous
