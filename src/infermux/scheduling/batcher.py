"""Batch formation when an instance is free.

Each instance has a worker coroutine and one dedicated thread (backends need not be thread-safe, and
a blocking ``execute`` must never stall the event loop). While an instance computes, requests
collect in the queue; as soon as it is free it takes everything waiting, up to ``max_batch_size``
rows, as its next batch. That is Triton's dynamic batching with ``max_queue_delay_microseconds: 0``;
delays, preferred sizes, priorities and queue policies build on this stage.
"""

from __future__ import annotations

import asyncio
import collections
import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from infermux.backends.base import BackendInstance, ExecuteResult, ModelRequest
from infermux.errors import InfermuxError, InternalError, UnavailableError

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    request: ModelRequest
    future: asyncio.Future[ExecuteResult]


class GreedyBatcher:
    """A :class:`~infermux.scheduling.base.Scheduler` over a fixed set of instances.

    ``max_batch_rows`` is the most batch rows one ``execute`` call receives; 1 (or a model without
    dynamic batching) means one request per call.
    """

    def __init__(
        self,
        name: str,
        instances: Sequence[BackendInstance],
        *,
        max_batch_rows: int = 1,
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self._name = name
        self._instances = list(instances)
        self._max_rows = max(1, max_batch_rows)
        self._queue: collections.deque[_Pending] = collections.deque()
        self._wakeup = asyncio.Event()
        self._closing = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        self._threads = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"{name}-instance{i}")
            for i in range(len(self._instances))
        ]
        self._workers = [
            asyncio.get_running_loop().create_task(self._work(i), name=f"{name}-worker{i}")
            for i in range(len(self._instances))
        ]

    @property
    def pending(self) -> int:
        return self._in_flight

    async def submit(self, request: ModelRequest) -> ExecuteResult:
        if self._closing:
            raise UnavailableError(f"model '{self._name}' is unloading")
        future: asyncio.Future[ExecuteResult] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(request, future))
        self._in_flight += 1
        self._idle.clear()
        self._wakeup.set()
        try:
            return await future
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()

    async def close(self) -> None:
        self._closing = True
        await self._idle.wait()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        loop = asyncio.get_running_loop()
        for instance, thread in zip(self._instances, self._threads, strict=True):
            try:
                await loop.run_in_executor(thread, instance.close)
            except Exception:
                logger.exception("model '%s': closing an instance failed", self._name)
            thread.shutdown(wait=False)

    def _next_batch(self) -> list[_Pending]:
        batch: list[_Pending] = []
        rows = 0
        while self._queue:
            head = self._queue[0]
            if head.future.done():  # the client went away before the request ran
                self._queue.popleft()
                continue
            size = head.request.batch_size if self._max_rows > 1 else 1
            if batch and rows + size > self._max_rows:
                break
            batch.append(self._queue.popleft())
            rows += size
            if rows >= self._max_rows:
                break
        return batch

    async def _work(self, index: int) -> None:
        loop = asyncio.get_running_loop()
        instance, thread = self._instances[index], self._threads[index]
        while True:
            if not self._queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            batch = self._next_batch()
            if not batch:
                continue
            requests = [p.request for p in batch]
            try:
                results = await loop.run_in_executor(thread, instance.execute, requests)
            except InfermuxError as exc:
                _fail_all(batch, exc)
                continue
            except Exception as exc:
                logger.exception("model '%s': execute failed", self._name)
                _fail_all(batch, InternalError(f"model '{self._name}' failed: {exc}"))
                continue
            for pending, result in zip(batch, results, strict=True):
                if not pending.future.done():
                    pending.future.set_result(result)


def _fail_all(batch: list[_Pending], error: InfermuxError) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
