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
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

from infermux.backends.base import BackendInstance, ExecuteResult, ModelRequest
from infermux.errors import InfermuxError, InternalError, UnavailableError
from infermux.scheduling.base import Completion, Finisher
from infermux.statistics import ModelStatistics

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    request: ModelRequest
    future: asyncio.Future[Completion]
    enqueued_ns: int


def _timed_execute(
    instance: BackendInstance, requests: list[ModelRequest]
) -> tuple[Sequence[ExecuteResult], int, int]:
    # Timed on the instance thread so that compute_infer excludes the hop back to the loop.
    start = time.perf_counter_ns()
    results = instance.execute(requests)
    return results, start, time.perf_counter_ns()


class GreedyBatcher:
    """A :class:`~infermux.scheduling.base.Scheduler` over a fixed set of instances.

    ``max_batch_rows`` is the most batch rows one ``execute`` call receives; 1 (or a model without
    dynamic batching) means one request per call. ``finish`` turns each request's raw result into
    its outputs right after its batch ran (timed as compute_output); ``stats`` records executions.
    """

    def __init__(
        self,
        name: str,
        instances: Sequence[BackendInstance],
        *,
        finish: Finisher,
        max_batch_rows: int = 1,
        stats: ModelStatistics | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self._name = name
        self._finish = finish
        self._stats = stats
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

    async def submit(self, request: ModelRequest) -> Completion:
        if self._closing:
            raise UnavailableError(f"model '{self._name}' is unloading")
        future: asyncio.Future[Completion] = asyncio.get_running_loop().create_future()
        self._queue.append(_Pending(request, future, time.perf_counter_ns()))
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
            dequeued = time.perf_counter_ns()
            requests = [p.request for p in batch]
            try:
                results, started, ended = await loop.run_in_executor(
                    thread, _timed_execute, instance, requests
                )
            except InfermuxError as exc:
                _fail_all(batch, exc)
                continue
            except Exception as exc:
                logger.exception("model '%s': execute failed", self._name)
                _fail_all(batch, InternalError(f"model '{self._name}' failed: {exc}"))
                continue
            if len(results) != len(batch):
                _fail_all(
                    batch,
                    InternalError(
                        f"model '{self._name}' returned {len(results)} results for "
                        f"{len(batch)} requests"
                    ),
                )
                continue
            self._complete(batch, results, dequeued, started, ended)

    def _complete(
        self,
        batch: list[_Pending],
        results: Sequence[ExecuteResult],
        dequeued: int,
        started: int,
        ended: int,
    ) -> None:
        input_ns, infer_ns = started - dequeued, ended - started
        output_total = 0
        rows = 0
        for pending, result in zip(batch, results, strict=True):
            rows += pending.request.batch_size
            begin = time.perf_counter_ns()
            try:
                outputs = self._finish(pending.request, result)
            except Exception as exc:
                output_total += time.perf_counter_ns() - begin
                if not isinstance(exc, InfermuxError):
                    logger.exception("model '%s': handling a result failed", self._name)
                    exc = InternalError(f"model '{self._name}': bad result: {exc}")
                if not pending.future.done():
                    pending.future.set_exception(exc)
                continue
            output_ns = time.perf_counter_ns() - begin
            output_total += output_ns
            if not pending.future.done():
                pending.future.set_result(
                    Completion(
                        outputs, dequeued - pending.enqueued_ns, input_ns, infer_ns, output_ns
                    )
                )
        if self._stats is not None:
            self._stats.record_execution(rows, input_ns, infer_ns, output_total)


def _fail_all(batch: list[_Pending], error: InfermuxError) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)
