"""The execution timeout of a decoupled model: a bound on each gap between its responses.

A decoupled model may stream for as long as it likes: what its execution timeout bounds is how
long a request waits for its next response, the first one counted from when its batch started.
A model that keeps answering within the limit is never cut; one that stalls longer is.

What happens to a request that stalls depends on where the model is:

- While its batch's ``execute`` still runs on the instance's thread, the instance is stuck as far
  as the server can tell. The slot fails the batch's unfinished requests with the timeout error
  and replaces the instance, as it does when a non-decoupled execution overruns
  (``scheduling/instances.py``).
- Once ``execute`` has returned (a model answering from threads of its own), the instance is free
  and may be running other batches: only the stalled request is ended, with the timeout error as
  its final response, and the model is told (its later sends are dropped, ``is_cancelled()``).

A response held back by a slow reader is the client's doing, not the model's: while any send of
a watched request waits for its reader, the clock stands still for every watched request of the
model (one model thread may answer several requests), and starts again when that send goes on.

One watcher task per model sleeps until the earliest deadline; nothing runs per response.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Sequence

from infermux.backends.base import ModelRequest
from infermux.backends.responses import ResponseStream
from infermux.scheduling.deadline import Deadline

Expire = Callable[[ModelRequest], None]
"""Ends one stalled request whose batch's ``execute`` has returned (the slot's message)."""


class WatchedBatch:
    """One batch of a decoupled model under watch. ``stalled`` is resolved when one of its
    requests stalls while ``execute`` still runs; :meth:`executed` says it has returned."""

    def __init__(
        self, requests: Sequence[ModelRequest], expire: Expire, stalled: asyncio.Future[None]
    ) -> None:
        self.requests = [r for r in requests if r.responses is not None]
        self.stalled = stalled
        self._expire = expire
        self._executing = True

    def executed(self) -> None:
        """``execute`` returned: from now on a stall ends only the request that stalled."""
        self._executing = False

    def _streams(self) -> list[ResponseStream]:
        return [r.responses for r in self.requests if r.responses is not None]

    def check(self, now: int, held: int, timeout: int) -> int | None:
        """Act on what has stalled by ``now``; the next deadline (None: nothing left to watch).
        ``held`` is when a send last waited for its reader: no gap counts from before it."""
        if self._executing:
            if self.stalled.done():
                return None  # the slot fails the batch and replaces the instance
            streams = self._streams()
            if not streams:
                return None
            waiting = [s.progress_ns for s in streams if not s.over]
            # Every request has its final flag: execute must still return in time after it.
            last = max(min(waiting) if waiting else max(s.progress_ns for s in streams), held)
            if now - last >= timeout:
                self.stalled.set_result(None)
                return None
            return last + timeout
        due: int | None = None
        for request in self.requests:
            stream = request.responses
            if stream is None or stream.over:
                continue
            last = max(stream.progress_ns, held)
            if now - last >= timeout:
                self._expire(request)
            else:
                due = last + timeout if due is None else min(due, last + timeout)
        return due


class ResponseGaps:
    """Watches the batches of one decoupled model against its execution timeout."""

    def __init__(self, timeout_s: float) -> None:
        self._timeout_ns = max(1, int(timeout_s * 1e9))
        self._batches: list[WatchedBatch] = []
        self._task: asyncio.Task[None] | None = None
        self._held_ns = 0
        # The watcher sleeps on a timerfd, not asyncio.sleep: uvloop would spin through the last
        # 0.5 ms before each deadline (scheduling/deadline.py). Made once, on the first watch.
        self._woken = asyncio.Event()
        self._deadline: Deadline | None = None

    def watch(self, requests: Sequence[ModelRequest], expire: Expire) -> WatchedBatch:
        """Watch a batch about to execute (its streams' clocks were started by ``begin()``)."""
        loop = asyncio.get_running_loop()
        batch = WatchedBatch(requests, expire, loop.create_future())
        self._batches.append(batch)
        if self._task is None or self._task.done():
            if self._deadline is None:
                self._deadline = Deadline(loop, self._woken.set)
            # A new batch's deadlines are the latest of all: a sleeping watcher need not wake.
            self._task = loop.create_task(self._run(self._deadline), name="response-gaps")
        return batch

    async def _run(self, deadline: Deadline) -> None:
        while self._batches:
            now = time.perf_counter_ns()
            held = self._held(now)
            earliest: int | None = None
            still: list[WatchedBatch] = []
            for batch in self._batches:
                due = batch.check(now, held, self._timeout_ns)
                if due is not None:
                    still.append(batch)
                    earliest = due if earliest is None else min(earliest, due)
            self._batches = still  # batches watched while this task sleeps are added to it
            if earliest is not None:
                self._woken.clear()
                deadline.at(earliest)
                await self._woken.wait()

    def _held(self, now: int) -> int:
        for batch in self._batches:
            for request in batch.requests:
                stream = request.responses
                if stream is None:
                    continue
                if stream.blocked:
                    self._held_ns = now
                elif stream.resumed_ns > self._held_ns:
                    self._held_ns = stream.resumed_ns
        return self._held_ns

    async def close(self) -> None:
        """Stop watching (the model is unloading; its requests are over)."""
        self._batches.clear()
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
            self._task = None
        if self._deadline is not None:
            self._deadline.close()
            self._deadline = None
