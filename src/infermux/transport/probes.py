"""Readiness probes a front end answers for its executor: a call that must answer within a
bound even while the executor is stopped (SIGSTOP) or stalled, so that a load balancer routes
around it (``executor_client.py``)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any


class ReadinessProbes:
    """Readiness calls answered within ``timeout_s``, else not ready. Probes of one kind share
    the call in flight, so a long stop queues one frame, not one per probe."""

    def __init__(self, call: Callable[..., Awaitable[Any]], timeout_s: float) -> None:
        self._call = call
        self._timeout_s = timeout_s
        self._in_flight: dict[tuple[str, ...], asyncio.Future[Any]] = {}

    async def ask(self, method: str, *args: str) -> bool:
        key = (method, *args)
        call = self._in_flight.get(key)
        if call is None or call.done():  # done: failed as its executor went (ask the new one)
            call = asyncio.ensure_future(self._call(method, *args))
            self._in_flight[key] = call
            call.add_done_callback(lambda done: self._done(key, done))
        try:
            return bool(await asyncio.wait_for(asyncio.shield(call), self._timeout_s))
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
            return False

    def _done(self, key: tuple[str, ...], call: asyncio.Future[Any]) -> None:
        if self._in_flight.get(key) is call:
            del self._in_flight[key]
        if not call.cancelled():
            call.exception()  # retrieved: every waiter may have timed out before it failed
