"""How a model calls the server it runs in (Triton's Business Logic Scripting, BLS).

Backends sit below the data plane and must not import it; the data plane hands its ``infer``
down instead (``dataplane/assembly.py`` attaches it once built, the repository notes the event
loop it serves on). A model's instance thread then submits requests to that loop and waits, so a
call from a model takes the same path as a client's request: routing, validation, the target's
queue and batches, its statistics. Tensors are passed by reference: nothing is copied on the way.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

from infermux.errors import UnavailableError
from infermux.types import InferRequest, InferResponse

Infer = Callable[[InferRequest], Awaitable[InferResponse]]
"""The data plane's ``infer``: validate, route, schedule and run one request."""


class ServerCalls:
    """The server's ``infer`` for models, bound late: the repository that loads the models is
    built before the data plane that will serve their calls."""

    def __init__(self) -> None:
        self._infer: Infer | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    def attach(self, infer: Infer) -> None:
        """Serve models' calls with ``infer`` (the data plane's)."""
        self._infer = infer

    def serve_on(self, loop: asyncio.AbstractEventLoop) -> None:
        """The event loop ``infer`` runs on (the one the repository loads models from)."""
        self._loop = loop

    def infer(self, request: InferRequest) -> InferResponse:
        """Run ``request`` and wait for its answer; called from a model's thread, never from the
        server's event loop (it would wait for itself). Raises the request's error."""
        infer, loop = self._ready()
        if _running_loop() is loop:
            raise UnavailableError(
                "a model cannot wait for another model's answer on the server's event loop; "
                "call it from execute() (or await async_exec() in an async execute)"
            )
        return asyncio.run_coroutine_threadsafe(_call(infer, request), loop).result()

    async def infer_async(self, request: InferRequest) -> InferResponse:
        """Run ``request`` on the server's loop, awaited from another loop (an ``async def
        execute`` runs on a loop of its instance's thread)."""
        infer, loop = self._ready()
        if _running_loop() is loop:
            return await infer(request)
        future = asyncio.run_coroutine_threadsafe(_call(infer, request), loop)
        return await asyncio.wrap_future(future)

    def _ready(self) -> tuple[Infer, asyncio.AbstractEventLoop]:
        if self._infer is None or self._loop is None or self._loop.is_closed():
            raise UnavailableError("this server does not take requests from models yet")
        return self._infer, self._loop


async def _call(infer: Infer, request: InferRequest) -> InferResponse:
    return await infer(request)


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


_current = threading.local()


def current() -> ServerCalls | None:
    """The server of the model running on this thread (None outside a model's call, or in a
    worker process of its own: ``isolation: process``)."""
    calls: ServerCalls | None = getattr(_current, "calls", None)
    return calls


def set_current(calls: ServerCalls | None) -> ServerCalls | None:
    """Make ``calls`` this thread's server; returns the previous one, to put back."""
    previous = current()
    _current.calls = calls
    return previous
