"""Which executor processes host which model, as one front end knows it, and which of them a
request goes to (``remote_plane.py`` says when the map is asked for again, and why).

The map comes from the attached executors' repository indexes; an executor that is away keeps
the models it had, so that a request for them is answered by its 503 (it is restarting) rather
than by another executor's "unknown model". A request goes to the attached host with the fewest
of this front end's requests in flight, ties taken in turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Iterator, Sequence

from infermux.errors import ErrorCode, InfermuxError, UnavailableError

from .executor_client import RemoteExecutor

_STALE_S = 1.0
"""How old the host map may be before a model missing from it makes it be asked for again."""


class Hosts:
    """The host map of a front end with ``executors``, and the requests it has on each."""

    def __init__(self, executors: Sequence[RemoteExecutor]) -> None:
        self._executors = executors
        self._hosts: dict[str, list[RemoteExecutor]] = {}
        self._stale = True
        self._learning: asyncio.Future[dict[str, list[RemoteExecutor]]] | None = None
        self._learned_at = 0.0
        self._turn = 0
        self._busy: dict[RemoteExecutor, int] = {}

    def learn_soon(self) -> None:
        """Ask for the map now, in the background (failures: asked again when needed)."""
        task = asyncio.ensure_future(self.of(""))
        task.add_done_callback(lambda t: t.cancelled() or t.exception())

    def forget(self) -> None:
        """The map may be wrong (an attach, a detach, a load or unload): ask for it again."""
        self._stale = True
        self._learning = None

    async def _learn(self) -> dict[str, list[RemoteExecutor]]:
        previous = self._hosts
        attached = [e for e in self._executors if e.attached]
        indexes = await asyncio.gather(
            *(e.repository_index(ready_only=True) for e in attached), return_exceptions=True
        )
        served = dict(zip(attached, indexes, strict=True))
        hosts: dict[str, list[RemoteExecutor]] = {}
        for executor in self._executors:
            index = served.get(executor)
            if index is None or isinstance(index, BaseException):
                names = [n for n, held in previous.items() if executor in held]
            else:
                names = list(dict.fromkeys(row.name for row in index))
            for name in names:
                hosts.setdefault(name, []).append(executor)
        return hosts

    async def of(self, name: str, *, refresh: bool = False) -> list[RemoteExecutor]:
        """Executors serving ``name``. The map is asked for again when forced, when it was
        forgotten, or when ``name`` is not in it and it is older than :data:`_STALE_S` (a model
        that appeared in poll mode); requests that miss together share one asking."""
        now = time.monotonic()
        old = now - self._learned_at > _STALE_S
        must = self._stale or refresh or (name not in self._hosts and old)
        if must and (self._learning is None or self._learning.done()):
            self._learning = asyncio.ensure_future(self._learn())
            self._learned_at = now
            self._stale = False
        learning = self._learning
        if learning is not None and (must or not learning.done()):  # wait for the news
            hosts = await learning
            if self._learning is learning:  # not forgotten meanwhile
                self._hosts = hosts
        return self._hosts.get(name, [])

    def fallback(self) -> RemoteExecutor:
        """Where a request for a model nobody serves goes, for that executor's own error
        (unknown model, still loading, not ready: the same answer as with one executor)."""
        return next((e for e in self._executors if e.attached), self._executors[0])

    async def one(self, name: str) -> RemoteExecutor:
        """One executor serving ``name``, an attached one if any is."""
        hosts = await self.of(name)
        return next((e for e in hosts if e.attached), hosts[0]) if hosts else self.fallback()

    async def least_busy_of(self, name: str) -> RemoteExecutor:
        """Where a request for ``name`` goes first."""
        return self.least_busy(await self.of(name)) or self.fallback()

    async def other(
        self, model: str, chosen: RemoteExecutor, retry: InfermuxError
    ) -> RemoteExecutor:
        """Where a request for ``model`` that ``chosen`` failed with ``retry`` (nothing ran) is
        sent again; raises when there is none."""
        # Who was away when it failed: one that re-attaches while the map is asked for again
        # may be missing from the answer (asked before it was back), yet it may host the model.
        away = [e for e in self._executors if not e.attached]
        hosts = await self.of(model, refresh=True)
        other = self.least_busy([e for e in hosts if e is not chosen and e.attached])
        if other is not None:
            return other
        down = away or [e for e in self._executors if not e.attached]
        if retry.code is ErrorCode.NOT_FOUND and down:
            # Nobody here knows the model, but an executor that may host it is restarting.
            raise UnavailableError(
                f"model '{model}' is not served now: {down[0].why_detached}"
            ) from retry
        raise retry

    def least_busy(self, hosts: list[RemoteExecutor]) -> RemoteExecutor | None:
        """The attached host with the fewest of this front end's requests in flight, ties
        taken in turn (a detached one only when no host is attached: its answer is the 503
        saying why)."""
        live = [e for e in hosts if e.attached] or hosts
        if not live:
            return None
        self._turn += 1
        start = self._turn % len(live)
        return min(live[start:] + live[:start], key=lambda e: self._busy.get(e, 0))

    @contextlib.contextmanager
    def sending(self, executor: RemoteExecutor) -> Iterator[None]:
        """Count a request (or a stream, for as long as it streams) on ``executor`` from the
        choice on: the executor's own count starts only once the tensors are in its arena, too
        late for requests choosing at the same moment."""
        self._busy[executor] = self._busy.get(executor, 0) + 1
        try:
            yield
        finally:
            self._busy[executor] -= 1
