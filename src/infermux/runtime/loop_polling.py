"""Polling a condition once per event-loop iteration, for a bounded time.

On the H200 host an event loop woken from a millisecond's sleep runs ~0.3-0.5 ms late
(``docs/decisions.md``, *GPU completions at low load*). Where latency matters more than a core
(low load), a side that knows what it waits for checks it once per loop iteration instead of
sleeping until woken: a ``call_soon`` chain keeps uvloop polling its sockets with a zero timeout,
so the loop goes on serving everything else meanwhile. Used for a GPU batch launched on an idle
GPU (:mod:`~infermux.runtime.completions`) and for the channel's rings at c=1
(:meth:`~infermux.transport.link.Link.poll_inbox`).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def poll_each_iteration(
    loop: asyncio.AbstractEventLoop,
    seconds: float,
    ready: Callable[[], bool],
    on_ready: Callable[[], None],
    ended: Callable[[], None],
) -> None:
    """Check ``ready()`` once per iteration of ``loop`` until it is true or ``seconds`` passed.
    ``ended()`` runs once either way, first (so that ``on_ready`` may start a new poll), then
    ``on_ready()`` if ``ready()`` was true. A ``ready()`` that raises ends the poll without
    ``on_ready``: whoever else watches the same thing meets the error and says so."""
    give_up = time.perf_counter() + seconds

    def poll() -> None:
        try:
            done = ready()
        except Exception:
            ended()
            return
        if done:
            ended()
            on_ready()
        elif time.perf_counter() < give_up:
            loop.call_soon(poll)
        else:
            ended()

    loop.call_soon(poll)
