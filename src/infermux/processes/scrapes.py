"""``/metrics`` with several executors: the supervisor asks each executor for its metric
families over its control socket and merges them (each executor has only its own models)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

from infermux.observability import metrics as prometheus

from .children import SCRAPE_TIMEOUT, Child
from .control import Scrape, Scraped


class Scrapes:
    """The scrapes under way: which executor each still waits for."""

    def __init__(self) -> None:
        self._waiting: dict[int, dict[int, asyncio.Future[Scraped]]] = {}
        self._seq = 0

    async def collect(self, executors: Iterable[Child]) -> bytes:
        """Every ``executors``' families, merged; one that does not answer within
        :data:`SCRAPE_TIMEOUT` (or dies meanwhile) is left out."""
        self._seq += 1
        seq = self._seq
        loop = asyncio.get_running_loop()
        waiting = {}
        for child in executors:
            waiting[child.index] = loop.create_future()
            child.control.send(Scrape(seq))
        self._waiting[seq] = waiting
        try:
            done, _ = await asyncio.wait(waiting.values(), timeout=SCRAPE_TIMEOUT)
        finally:
            del self._waiting[seq]
        parts = [f.result().families for f in done if not f.cancelled()]
        return prometheus.render(prometheus.merge(parts))

    def answered(self, child: Child, message: Scraped) -> None:
        waiting = self._waiting.get(message.seq, {}).get(child.index)
        if waiting is not None and not waiting.done():
            waiting.set_result(message)

    def gone(self, index: int) -> None:
        """Executor ``index`` died: no scrape waits for it any longer."""
        for waiting in (s.get(index) for s in self._waiting.values()):
            if waiting is not None and not waiting.done():
                waiting.cancel()


__all__ = ["Scrapes"]
