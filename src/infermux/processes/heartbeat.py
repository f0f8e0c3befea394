"""The supervisor's heartbeat: is each process it runs still answering?

A process that has exited is noticed by its control socket closing; one that is stopped
(SIGSTOP) or whose event loop is blocked is not, and a front end in that state still holds its
gRPC socket: with ``SO_REUSEPORT`` the kernel keeps handing it a share of the new connections,
which then hang. So the supervisor pings every process that is up, once a second, over its
control socket (answered from the process's event loop, :func:`~.control.follow`), and kills
one that has not answered for its role's timeout (``--frontend-heartbeat-timeout-secs``,
``--executor-heartbeat-timeout-secs``; 0: never). SIGKILL, because a stopped process acts on
no other signal; its death then takes the usual path (sockets closed, process restarted).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable, Mapping

from .children import Child
from .control import Ping

logger = logging.getLogger("infermux")

INTERVAL = 1.0


class Heartbeat:
    """Pings children and kills those that stop answering. ``timeouts``: seconds by role."""

    def __init__(self, timeouts: Mapping[str, float]) -> None:
        self._timeouts = timeouts
        self._answered: dict[Child, float] = {}
        self._last_beat: float | None = None

    def answered(self, child: Child) -> None:
        """``child`` sent a :class:`~.control.Pong`."""
        if child in self._answered:
            self._answered[child] = time.monotonic()

    async def run(self, children: Callable[[], Iterable[Child]]) -> None:
        """Beat every :data:`INTERVAL` seconds, forever (cancelled at shutdown)."""
        while True:
            await asyncio.sleep(INTERVAL)
            self.beat(children())

    def beat(self, children: Iterable[Child], now: float | None = None) -> list[Child]:
        """Ping the watched ``children`` and kill those silent too long; returns the killed."""
        now = time.monotonic() if now is None else now
        stalled = self._last_beat is not None and now - self._last_beat > 3 * INTERVAL
        self._last_beat = now
        watched = [c for c in children if self._watches(c)]
        # Children first seen now start their count now; the gone are forgotten. After a stall
        # of the supervisor itself (a starved machine) answers may sit unread in its sockets:
        # everyone starts afresh rather than being killed for the supervisor's delay.
        previous = {} if stalled else self._answered
        self._answered = {c: previous.get(c, now) for c in watched}
        killed = []
        for child in watched:
            silent = now - self._answered[child]
            timeout = self._timeouts[child.role]
            if silent <= timeout:
                child.control.send(Ping())
                continue
            logger.error(
                "%s (pid %s) has not answered the supervisor for %.1f s (stopped or hung); "
                "killing it%s",
                child.name,
                child.process.pid,
                silent,
                " so that it gets no new connections" if child.role == "frontend" else "",
            )
            child.hung = True
            child.process.kill()
            del self._answered[child]
            killed.append(child)
        return killed

    def _watches(self, child: Child) -> bool:
        timeout = self._timeouts.get(child.role, 0.0)
        return timeout > 0 and child.up and not child.stopping and not child.hung


__all__ = ["INTERVAL", "Heartbeat"]
