"""One model instance as the batcher drives it: where its batches run, its execution timeout, and
its replacement when an execution overruns.

A batch runs in one of two ways. An instance that launches batches without blocking (a GPU
instance replaying a CUDA graph: :class:`~infermux.backends.base.LaunchesOnLoop`) is driven from
the event loop: the launch is a few non-blocking calls, the GPU's completion comes back to the
loop as an event, and no thread of its own is involved. Every other batch runs ``execute`` on the
instance's dedicated thread (backends need not be thread-safe, and a blocking ``execute`` must
never stall the event loop), made on first use.

A Python thread cannot be stopped from outside, so an instance stuck in ``execute`` is *abandoned*:
its batch fails at once, its thread is left to finish (or not) on its own, with ``close`` queued
behind the stuck call, and a fresh instance is loaded on a fresh thread. Instance threads are
daemon threads so that an abandoned one never holds up the process's exit. An instance that can
stop its own work (``abort``, a process-isolated Python model kills its worker) is aborted and
kept instead: it restarts itself.

For a decoupled model the timeout bounds each gap between a request's responses instead of the
whole ``execute`` (``scheduling/response_gaps.py``): a stall while ``execute`` runs is handled
as above; one after it returned ends only the request that stalled.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import itertools
import logging
import queue
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from infermux.backends.base import BackendInstance, Collect, ExecuteResult, ModelRequest
from infermux.errors import FailureReason, UnavailableError
from infermux.scheduling.response_gaps import ResponseGaps

logger = logging.getLogger(__name__)

T = TypeVar("T")

Reload = Callable[[], BackendInstance]
"""Loads (and warms up) a fresh instance in the place of a timed-out one; blocking."""

RELOAD_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class ExecutionTimeout(UnavailableError):
    """An instance did not finish a batch within the model's execution timeout."""


class InstanceThread(Executor):
    """A one-thread executor whose thread is a daemon (``ThreadPoolExecutor``'s are joined at
    exit, so one stuck model would keep the server from ever exiting)."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = (
            queue.SimpleQueue()
        )
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        future: Future[T] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        self._jobs.put(None)  # after every job already queued
        if wait:
            self._thread.join()

    def _run(self) -> None:
        while (job := self._jobs.get()) is not None:
            _run_job(*job)
            # An idle thread waiting for the next job must not keep this one's closure (the
            # instance, the batch's inputs) alive: an unloaded model would never be freed.
            del job


def _run_job(future: Future[Any], call: Callable[[], Any]) -> None:
    if not future.set_running_or_notify_cancel():
        return
    try:
        future.set_result(call())
    except BaseException as exc:  # handed to the caller, who decides
        future.set_exception(exc)


def _timed_execute(
    instance: BackendInstance, requests: list[ModelRequest]
) -> tuple[Sequence[ExecuteResult], int, int]:
    # Timed on the instance thread so that compute_infer excludes the hop back to the loop.
    start = time.perf_counter_ns()
    results = instance.execute(requests)
    return results, start, time.perf_counter_ns()


def _close_quietly(instance: BackendInstance, label: str) -> None:
    try:
        instance.close()
    except Exception:
        logger.exception("%s: closing the abandoned instance failed", label)


class InstanceSlot:
    """One instance (``label`` names it in messages) and the thread it runs on.

    ``timeout_s`` (None: none) bounds each ``execute``; on overrun :meth:`execute` raises
    :class:`ExecutionTimeout` and the caller must :meth:`replace` the instance before giving it
    another batch. ``reload`` makes the replacement (None: the instance cannot be replaced and is
    kept, stuck or not). ``gaps`` (the model's, when it has a timeout) watches
    the gaps between the responses of a batch whose requests stream.
    """

    def __init__(
        self,
        label: str,
        thread_name: str,
        instance: BackendInstance,
        *,
        reload: Reload | None = None,
        timeout_s: float | None = None,
        gaps: ResponseGaps | None = None,
    ) -> None:
        self.label = label
        self._thread_name = thread_name
        self.instance = instance
        self._reload = reload
        self._timeout_s = timeout_s
        self._gaps = gaps
        # Made on first use: an instance whose every batch launches from the loop never needs one.
        self._thread: InstanceThread | None = None

    def _worker(self) -> InstanceThread:
        if self._thread is None:
            self._thread = InstanceThread(self._thread_name)
        return self._thread

    async def execute(
        self, requests: list[ModelRequest]
    ) -> tuple[Sequence[ExecuteResult], int, int]:
        """Results, and when execution started and ended (``perf_counter_ns``)."""
        launch = getattr(self.instance, "launch", None)
        if launch is not None:
            launched = await self._launched(launch, requests)
            if launched is not None:
                return launched
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(self._worker(), _timed_execute, self.instance, requests)
        if self._timeout_s is None:
            return await running
        if self._gaps is not None and any(r.responses is not None for r in requests):
            return await self._watched(running, requests, self._gaps)
        try:
            # shield: cancelling the wrapper must not try to cancel a call that is running.
            return await asyncio.wait_for(asyncio.shield(running), self._timeout_s)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
            running.add_done_callback(_ignore_result)
            raise self._timed_out() from None

    async def _watched(
        self,
        running: asyncio.Future[tuple[Sequence[ExecuteResult], int, int]],
        requests: list[ModelRequest],
        gaps: ResponseGaps,
    ) -> tuple[Sequence[ExecuteResult], int, int]:
        """A decoupled batch: ``execute`` may run as long as its requests keep answering."""
        batch = gaps.watch(requests, self._expire)
        try:
            await asyncio.wait((running, batch.stalled), return_when=asyncio.FIRST_COMPLETED)
        finally:
            batch.executed()
        if running.done():
            return running.result()
        running.add_done_callback(_ignore_result)
        raise ExecutionTimeout(
            f"{self.label} sent no response within its execution timeout "
            f"({self._timeout_ms:g} ms, which bounds each gap between the responses of a "
            "decoupled model); the instance is replaced"
        )

    def _expire(self, request: ModelRequest) -> None:
        """A request stalled after its batch's ``execute`` returned: end it alone."""
        error = ExecutionTimeout(
            f"{self.label}: request '{request.id}' got no response within the execution "
            f"timeout ({self._timeout_ms:g} ms, which bounds each gap between the responses of "
            "a decoupled model); the request is ended"
        )
        error.reason = FailureReason.BACKEND
        logger.warning("%s", error.message)
        request.cancelled = True
        if request.responses is not None:
            request.responses.end(error)

    @property
    def _timeout_ms(self) -> float:
        return (self._timeout_s or 0) * 1000

    async def _launched(
        self, launch: Callable[..., Collect | None], requests: list[ModelRequest]
    ) -> tuple[Sequence[ExecuteResult], int, int] | None:
        """The batch started on the loop (:class:`~infermux.backends.base.LaunchesOnLoop`) and
        awaited there; None when the instance runs this batch on its thread instead."""
        loop = asyncio.get_running_loop()
        finished: asyncio.Future[None] = loop.create_future()

        def done() -> None:  # on the completion thread
            with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits any more
                loop.call_soon_threadsafe(_resolve, finished)

        start = time.perf_counter_ns()
        collect = launch(requests, done)
        if collect is None:
            return None
        if self._timeout_s is None:
            await finished
        else:
            try:
                # shield: a timeout must leave the future for done() to resolve.
                await asyncio.wait_for(asyncio.shield(finished), self._timeout_s)
            except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
                raise self._timed_out() from None
        return collect(), start, time.perf_counter_ns()

    def _timed_out(self) -> ExecutionTimeout:
        return ExecutionTimeout(
            f"{self.label} did not finish within its "
            f"execution timeout ({self._timeout_ms:g} ms); the instance is replaced"
        )

    async def replace(self, closing: Callable[[], bool]) -> None:
        """After a timeout: abort the instance, or abandon it and load a fresh one (retried with
        back-off while the load fails, until ``closing()``)."""
        loop = asyncio.get_running_loop()
        abort = getattr(self.instance, "abort", None)
        if callable(abort):
            logger.warning("%s: execution timed out; aborting it", self.label)
            await loop.run_in_executor(None, abort)
            return
        if self._reload is None:
            logger.error("%s: execution timed out; it cannot be replaced", self.label)
            return
        logger.warning(
            "%s: execution timed out; loading a replacement (the stuck call is abandoned)",
            self.label,
        )
        # The stuck call runs on the thread, or on the GPU (a launched batch): either way the
        # close waits behind it there (a GPU instance's close synchronises its stream first).
        stuck, self._thread = self._worker(), None
        stuck.submit(_close_quietly, self.instance, self.label)  # if the stuck call ever returns
        stuck.shutdown(wait=False)
        for attempt in itertools.count():
            try:
                self.instance = await loop.run_in_executor(self._worker(), self._reload)
                logger.info("%s replaced", self.label)
                return
            except Exception as exc:
                delay = RELOAD_BACKOFF_S[min(attempt, len(RELOAD_BACKOFF_S) - 1)]
                logger.error("%s: replacement failed (%s); retry in %g s", self.label, exc, delay)
            if closing():
                return
            await asyncio.sleep(delay)

    async def close(self) -> None:
        loop = asyncio.get_running_loop()
        thread = self._worker()  # a daemon, also for an instance that never needed one
        try:
            await loop.run_in_executor(thread, self.instance.close)
        except Exception:
            logger.exception("%s: closing it failed", self.label)
        # Joined (off the loop; it is idle now) so that the thread has dropped its last
        # reference to the instance when the caller collects what the model left behind.
        await loop.run_in_executor(None, functools.partial(thread.shutdown, wait=True))
        self._thread = None


def _resolve(future: asyncio.Future[None]) -> None:
    if not future.done():
        future.set_result(None)


def _ignore_result(future: asyncio.Future[Any]) -> None:
    # The batch was failed already; whatever the overrun call ends with is dropped here (and not
    # reported as "exception never retrieved").
    if not future.cancelled():
        with contextlib.suppress(BaseException):
            future.exception()
