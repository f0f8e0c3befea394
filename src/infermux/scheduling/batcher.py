"""The dynamic batcher: batch formation while instances compute, with Triton's semantics.

Each instance has a worker coroutine and one dedicated thread (backends need not be thread-safe, and
a blocking ``execute`` must never stall the event loop); an instance that overruns the model's
execution timeout fails its batch and is replaced (``scheduling/instances.py``). Workers pull
batches from the model's :class:`RequestQueue`. A free worker dispatches at once when
``max_queue_delay_microseconds`` is 0; otherwise when the queue holds ``max_batch_size`` rows,
when it can form a preferred batch size, or when the oldest request has waited the delay. While
instances compute, requests collect, so batches grow with load without a timer loop.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncGenerator, Callable, Sequence

from infermux.backends.base import BackendInstance, ExecuteResult, ModelRequest
from infermux.backends.outputs import to_output_tensors
from infermux.errors import FailureReason, InfermuxError, InternalError, RejectedError
from infermux.model_config import DynamicBatchingConfig, ModelConfig
from infermux.observability.statistics import ModelStatistics
from infermux.observability.tracing import TRACING
from infermux.scheduling.base import Completion, Finisher, Response
from infermux.scheduling.deadline import Deadline
from infermux.scheduling.instances import ExecutionTimeout, InstanceSlot, Reload
from infermux.scheduling.queue import TIMED_OUT, Pending, RequestQueue
from infermux.scheduling.response_gaps import ResponseGaps
from infermux.scheduling.streaming import stream_responses
from infermux.types import Tensor

logger = logging.getLogger(__name__)

Compatible = Callable[[ModelRequest, ModelRequest], bool]


class DynamicBatcher:
    """A :class:`~infermux.scheduling.base.Scheduler` over a fixed set of instances.

    ``batching`` None means Triton's default scheduler: one request per execution, FIFO, no queue
    policy. ``max_batch_size`` bounds the rows of one batch. ``finish`` turns each request's raw
    result into its outputs right after its batch ran (timed as compute_output). ``compatible``,
    when given, keeps requests that cannot be stacked together out of one batch.
    ``execution_timeout_s`` bounds one ``execute`` (for a request to a decoupled model: each gap
    between its responses, ``scheduling/response_gaps.py``); ``reloads`` (one per instance) make
    the replacement of an instance that overran it, and ``replaced(index, instance)`` is told.
    """

    def __init__(
        self,
        name: str,
        instances: Sequence[BackendInstance],
        *,
        finish: Finisher,
        batching: DynamicBatchingConfig | None = None,
        max_batch_size: int = 1,
        compatible: Compatible | None = None,
        stats: ModelStatistics | None = None,
        execution_timeout_s: float | None = None,
        reloads: Sequence[Reload | None] = (),
        replaced: Callable[[int, BackendInstance], None] | None = None,
    ) -> None:
        if not instances:
            raise ValueError("a scheduler needs at least one instance")
        self._name = name
        self._finish = finish
        self._stats = stats
        self._compatible = compatible
        self._queue = RequestQueue(batching)
        self._max_rows = max(1, max_batch_size) if batching is not None else 1
        self._delay_ns = batching.max_queue_delay_microseconds * 1000 if batching else 0
        self._preferred = [p for p in (batching.preferred_batch_sizes if batching else ()) if p]
        self._preserve = bool(batching and batching.preserve_ordering)
        self._tail: asyncio.Future[None] | None = None  # last response gate (preserve_ordering)
        self._replaced = replaced
        self._wakeup = asyncio.Event()
        # Every idle worker waits for the same moment: the oldest request's delay running out.
        self._due = Deadline(asyncio.get_running_loop(), self._wakeup.set)
        self._closing = False
        self._in_flight = 0
        self._idle = asyncio.Event()
        self._idle.set()
        # A decoupled model's timeout bounds each gap between responses, not the whole batch.
        self._gaps = ResponseGaps(execution_timeout_s) if execution_timeout_s else None
        self._slots = [
            InstanceSlot(
                _label(name, stats, i),
                f"{name}-instance{i}",
                instance,
                reload=reloads[i] if i < len(reloads) else None,
                timeout_s=execution_timeout_s,
                gaps=self._gaps,
            )
            for i, instance in enumerate(instances)
        ]
        loop = asyncio.get_running_loop()
        self._loop = loop
        self._workers = [
            loop.create_task(self._work(i), name=f"{name}-worker{i}")
            for i in range(len(self._slots))
        ]

    @classmethod
    def for_model(
        cls,
        config: ModelConfig,
        name: str,
        instances: Sequence[BackendInstance],
        *,
        compatible: Compatible | None = None,
        stats: ModelStatistics | None = None,
        execution_timeout_s: float | None = None,
        reloads: Sequence[Reload | None] = (),
        replaced: Callable[[int, BackendInstance], None] | None = None,
    ) -> DynamicBatcher:
        """The scheduler of a loaded model: batching as ``config`` says, and each request's raw
        result checked against the config's outputs and cast to their types
        (:func:`~infermux.backends.outputs.to_output_tensors`) before it is answered."""

        def finish(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
            return to_output_tensors(config, request, result)

        return cls(
            name,
            instances,
            finish=finish,
            batching=config.dynamic_batching,
            max_batch_size=config.max_batch_size,
            compatible=compatible,
            stats=stats,
            execution_timeout_s=execution_timeout_s,
            reloads=reloads,
            replaced=replaced,
        )

    @property
    def pending(self) -> int:
        return self._in_flight

    @property
    def queued(self) -> int:
        """Requests admitted and not yet taken into a batch."""
        return self._queue.count

    async def submit(self, request: ModelRequest) -> Completion:
        if self._closing:
            raise RejectedError(f"model '{self._name}' is unloading")
        pending = Pending(
            request,
            self._loop.create_future(),
            self._queue.level_of(request.parameters),
            request.batch_size if self._max_rows > 1 else 1,
        )
        if TRACING.tracer is not None:
            pending.trace = TRACING.current()
        self._queue.admit(pending)  # raises when the level is full
        if pending.deadline_ns:
            self._loop.call_later(
                (pending.deadline_ns - pending.enqueued_ns) / 1e9, self._apply_timeouts
            )
        gate: asyncio.Future[None] | None = None
        previous = self._tail
        if self._preserve:
            gate = self._tail = self._loop.create_future()
        self._in_flight += 1
        self._idle.clear()
        self._wakeup.set()
        try:
            try:
                # Not shielded: a shield costs every request one more event-loop pass on its
                # way out (measured on the H200: part of a 14% drop at c=256). A cancellation
                # cancels this future; a batch that runs the request skips cancelled futures.
                completion = await pending.future
                error: InfermuxError | None = None
            except InfermuxError as exc:
                completion, error = None, exc
            if gate is not None and previous is not None and not previous.done():
                await asyncio.shield(previous)  # responses leave in arrival order
        except BaseException:  # cancelled: the client is gone
            if gate is not None:
                _release_after(previous, gate)
            if pending.queued:  # leave the queue now: it never runs
                self._queue.remove(pending)
                pending.future.cancel()
            elif pending.batch_done is not None and not pending.batch_done.done():
                pending.request.cancelled = True  # the model may see it and stop early
                # In a running batch, which cannot be interrupted: its result is dropped, but
                # the cancellation completes only when the batch ends, because until then the
                # model may read the request's inputs (which, across processes, are views of
                # the front end's arena that it reuses once the request is over).
                await asyncio.wait((pending.batch_done,))
            if pending.future.done() and not pending.future.cancelled():
                pending.future.exception()  # the batch's error is nobody's now: retrieved
            raise
        finally:
            self._in_flight -= 1
            if self._in_flight == 0:
                self._idle.set()
        if gate is not None:
            gate.set_result(None)
        if error is not None:
            raise error
        assert completion is not None
        return completion

    def submit_stream(self, request: ModelRequest) -> AsyncGenerator[Response]:
        return stream_responses(self._name, request, self.submit, self._finish)

    async def close(self) -> None:
        self._closing = True
        await self._idle.wait()
        for worker in self._workers:
            worker.cancel()
        await asyncio.gather(*self._workers, return_exceptions=True)
        self._due.close()
        if self._gaps is not None:
            await self._gaps.close()
        for slot in self._slots:
            await slot.close()

    # -- batch formation --------------------------------------------------------------------------

    def _apply_timeouts(self) -> None:
        for pending in self._queue.expire(time.perf_counter_ns()):
            if not pending.future.done():
                pending.future.set_exception(RejectedError(TIMED_OUT))
        self._wakeup.set()  # DELAY requests moved: let idle workers look again

    async def _next_batch(self) -> list[Pending]:
        queue = self._queue
        while True:
            if not queue:
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            oldest = queue.oldest_ns()
            due = self._delay_ns == 0 or time.perf_counter_ns() - oldest >= self._delay_ns
            target = self._target(queue.rows, due)
            if target:
                batch = queue.take(target, self._compatible)
                if batch:
                    return batch
                continue
            # Not yet: sleep until a request arrives or the oldest one has waited the delay
            # (a timerfd: uvloop's millisecond timers would spin through a sub-ms delay).
            self._wakeup.clear()
            self._due.at(oldest + self._delay_ns)
            await self._wakeup.wait()

    def _target(self, rows: int, due: bool) -> int:
        """How many rows to take now (0: keep waiting)."""
        if rows >= self._max_rows or due:
            return self._max_rows
        reachable = [p for p in self._preferred if p <= rows]
        return max(reachable) if reachable else 0

    async def _work(self, index: int) -> None:
        slot = self._slots[index]
        while True:
            # The batch lives only in _run: a worker waiting for its next batch must not keep
            # the last one's requests alive, nor what they hold (tensors, views of shared
            # memory, a CUDA region's mapping, which then cannot be closed on unregister).
            await self._run(index, slot, await self._next_batch())

    async def _run(self, index: int, slot: InstanceSlot, batch: list[Pending]) -> None:
        done: asyncio.Future[None] = self._loop.create_future()
        for pending in batch:
            pending.batch_done = done
        try:
            await self._execute(index, slot, batch)
        finally:
            done.set_result(None)  # the batch's inputs are no longer read

    async def _execute(self, index: int, slot: InstanceSlot, batch: list[Pending]) -> None:
        if self._queue:
            self._wakeup.set()  # another idle worker may form the next batch meanwhile
        dequeued = time.perf_counter_ns()
        requests = [p.request for p in batch]
        for request in requests:
            if request.responses is not None:
                request.responses.begin()  # its first response is timed from here
        try:
            results, started, ended = await slot.execute(requests)
        except ExecutionTimeout as exc:
            _fail_all(batch, _from_backend(exc))
            if self._stats is not None:
                self._stats.record_timeout(index)
            await slot.replace(lambda: self._closing)
            if self._replaced is not None:
                self._replaced(index, slot.instance)
            return
        except InfermuxError as exc:
            _fail_all(batch, _from_backend(exc))
            return
        except Exception as exc:
            logger.exception("model '%s': execute failed", self._name)
            _fail_all(batch, _from_backend(InternalError(f"model '{self._name}' failed: {exc}")))
            return
        if len(results) != len(batch):
            message = f"returned {len(results)} results for {len(batch)} requests"
            _fail_all(batch, _from_backend(InternalError(f"model '{self._name}' {message}")))
            return
        self._complete(batch, results, dequeued, started, ended, instance=index)

    def _complete(
        self,
        batch: list[Pending],
        results: Sequence[ExecuteResult],
        dequeued: int,
        started: int,
        ended: int,
        *,
        instance: int,
    ) -> None:
        input_ns, infer_ns = started - dequeued, ended - started
        output_total = 0
        rows = 0
        for pending, result in zip(batch, results, strict=True):
            rows += pending.request.batch_size
            begin = time.perf_counter_ns()
            try:
                if pending.request.responses is not None and not isinstance(result, Exception):
                    outputs = []  # its answers went through its response stream
                else:
                    outputs = self._finish(pending.request, result)
            except Exception as exc:
                output_total += time.perf_counter_ns() - begin
                if not isinstance(exc, InfermuxError):
                    logger.exception("model '%s': handling a result failed", self._name)
                    exc = InternalError(f"model '{self._name}': bad result: {exc}")
                if not pending.future.done():
                    pending.future.set_exception(_from_backend(exc))
                continue
            output_ns = time.perf_counter_ns() - begin
            output_total += output_ns
            if not pending.future.done():
                queue_ns = dequeued - pending.enqueued_ns
                pending.future.set_result(
                    Completion(outputs, queue_ns, input_ns, infer_ns, output_ns)
                )
        if self._stats is not None:
            self._stats.record_execution(rows, input_ns, infer_ns, output_total, instance)
            if TRACING.tracer is not None:
                TRACING.record_batch(
                    self._stats.name,
                    self._stats.version,
                    [(p.trace, p.enqueued_ns) for p in batch],
                    dequeued_ns=dequeued,
                    ended_ns=time.perf_counter_ns(),
                    rows=rows,
                )


def _label(name: str, stats: ModelStatistics | None, index: int) -> str:
    if stats is None or index >= len(stats.instances):
        return f"model '{name}' instance {index}"
    return f"model '{stats.name}' version {stats.version} instance '{stats.instances[index]}'"


def _from_backend(error: InfermuxError) -> InfermuxError:
    """``error`` came from running the model (raised, or a result that could not be used)."""
    error.reason = FailureReason.BACKEND
    return error


def _fail_all(batch: list[Pending], error: InfermuxError) -> None:
    for pending in batch:
        if not pending.future.done():
            pending.future.set_exception(error)


def _release_after(previous: asyncio.Future[None] | None, gate: asyncio.Future[None]) -> None:
    """Open ``gate`` once ``previous`` is open (a cancelled request must not block later ones)."""

    def open_gate(_: object = None) -> None:
        if not gate.done():
            gate.set_result(None)

    if previous is None or previous.done():
        open_gate()
    else:
        previous.add_done_callback(open_gate)
