"""A decoupled model's responses through Ray Serve, and how far a replica may run ahead.

The ingress calls the replica's ``infer_stream`` (an async generator) through a streaming
deployment handle (``handle.options(stream=True)``): each response reaches the ingress as the
model sends it. Ray Serve's streaming calls have no flow control of their own (the replica's
generator is read as fast as it yields, and what the ingress has not taken waits in its
memory), so the ingress and the replica keep a credit window per stream, as the front-end
channel does (``transport/streams.py``): the replica sends at most :data:`STREAM_WINDOW`
responses beyond those the ingress's reader took, then waits, and the model's own response
buffer (16) holds the model back.

The credit travels through :class:`StreamCredits`, one small Ray actor per ingress (no CPU):
the ingress tells it how many responses each stream's reader took (every half window), a
replica whose window is spent asks it to wait for more. A stream the reader left is closed
there, so a replica waiting on it stops (its request is also cancelled through Ray); an ingress
that dies takes the actor with it, and a replica's next wait fails, which ends its stream.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

STREAM_WINDOW = 16
"""Responses of one stream a replica sends before the ingress's reader took any."""

CLOSED_KEPT_S = 60.0
"""How long a closed stream is remembered (a wait that crossed the close answers at once)."""


class StreamCredits:
    """The Ray actor (``ray.remote(StreamCredits)``) that carries credit from an ingress to the
    replicas streaming to it: per stream, how many responses its reader took."""

    def __init__(self) -> None:
        self._taken: dict[str, int] = {}
        self._changed: dict[str, asyncio.Event] = {}
        self._closed: dict[str, float] = {}

    async def took(self, stream: str, count: int) -> None:
        """The reader of ``stream`` took ``count`` responses in all (calls may overtake)."""
        if stream in self._closed:
            return
        self._taken[stream] = max(count, self._taken.get(stream, 0))
        self._wake(stream)

    async def wait(self, stream: str, at_least: int) -> int:
        """Responses taken from ``stream``, once at least ``at_least``; -1 once it is closed."""
        while stream not in self._closed:
            taken = self._taken.get(stream, 0)
            if taken >= at_least:
                return taken
            changed = self._changed.setdefault(stream, asyncio.Event())
            changed.clear()
            await changed.wait()
        return -1

    async def close(self, stream: str) -> None:
        """The reader of ``stream`` is done (it ended, or gave up)."""
        now = time.monotonic()
        self._closed[stream] = now
        self._taken.pop(stream, None)
        self._wake(stream)
        self._changed.pop(stream, None)
        for old in [s for s, at in self._closed.items() if now - at > CLOSED_KEPT_S]:
            del self._closed[old]

    def _wake(self, stream: str) -> None:
        changed = self._changed.get(stream)
        if changed is not None:
            changed.set()


class Window:
    """A replica's side of one stream's credit: :meth:`spend` before each response."""

    def __init__(self, credits: Any, stream: str, window: int = STREAM_WINDOW) -> None:
        self._credits = credits  # a StreamCredits actor handle (None: no flow control)
        self._stream = stream
        self._window = max(1, window)
        self._limit = self._window
        self._sent = 0

    async def spend(self) -> bool:
        """Count one more response as sent, waiting for credit first; False once the reader
        is gone (the stream should end)."""
        if self._credits is not None and self._sent >= self._limit:
            at_least = self._sent - self._window + 1
            taken: int = await self._credits.wait.remote(self._stream, at_least)
            if taken < 0:
                return False
            self._limit = taken + self._window
        self._sent += 1
        return True


class Taken:
    """The ingress's side of one stream's credit: :meth:`took` for each response its reader
    takes, :meth:`close` once it is done."""

    def __init__(self, credits: Any, stream: str, window: int = STREAM_WINDOW) -> None:
        self._credits = credits
        self._stream = stream
        self._batch = max(1, window // 2)  # credit goes in halves of the window: fewer calls
        self._taken = 0
        self._told = 0

    def took(self) -> None:
        self._taken += 1
        if self._taken - self._told >= self._batch:
            self._told = self._taken
            self._credits.took.remote(self._stream, self._taken)  # nothing to wait for

    def close(self) -> None:
        self._credits.close.remote(self._stream)
