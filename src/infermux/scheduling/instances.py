"""One model instance as the batcher drives it: its dedicated thread, its execution timeout, and
its replacement when an execution overruns.

A Python thread cannot be stopped from outside, so an instance stuck in ``execute`` is *abandoned*:
its batch fails at once, its thread is left to finish (or not) on its own, with ``close`` queued
behind the stuck call, and a fresh instance is loaded on a fresh thread. Instance threads are
daemon threads so that an abandoned one never holds up the process's exit. An instance that can
stop its own work (``abort``, a process-isolated Python model kills its worker) is aborted and
kept instead: it restarts itself.
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

from infermux.backends.base import BackendInstance, ExecuteResult, ModelRequest
from infermux.errors import UnavailableError

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
    kept, stuck or not).
    """

    def __init__(
        self,
        label: str,
        thread_name: str,
        instance: BackendInstance,
        *,
        reload: Reload | None = None,
        timeout_s: float | None = None,
    ) -> None:
        self.label = label
        self._thread_name = thread_name
        self.instance = instance
        self._reload = reload
        self._timeout_s = timeout_s
        self._thread = InstanceThread(thread_name)

    async def execute(
        self, requests: list[ModelRequest]
    ) -> tuple[Sequence[ExecuteResult], int, int]:
        """Results, and when execution started and ended (``perf_counter_ns``)."""
        loop = asyncio.get_running_loop()
        running = loop.run_in_executor(self._thread, _timed_execute, self.instance, requests)
        if self._timeout_s is None:
            return await running
        try:
            # shield: cancelling the wrapper must not try to cancel a call that is running.
            return await asyncio.wait_for(asyncio.shield(running), self._timeout_s)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
            running.add_done_callback(_ignore_result)
            raise ExecutionTimeout(
                f"{self.label} did not finish within its "
                f"execution timeout ({self._timeout_s * 1000:g} ms); the instance is replaced"
            ) from None

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
        stuck, self._thread = self._thread, InstanceThread(self._thread_name)
        stuck.submit(_close_quietly, self.instance, self.label)  # if the stuck call ever returns
        stuck.shutdown(wait=False)
        for attempt in itertools.count():
            try:
                self.instance = await loop.run_in_executor(self._thread, self._reload)
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
        try:
            await loop.run_in_executor(self._thread, self.instance.close)
        except Exception:
            logger.exception("%s: closing it failed", self.label)
        # Joined (off the loop; it is idle now) so that the thread has dropped its last
        # reference to the instance when the caller collects what the model left behind.
        await loop.run_in_executor(None, functools.partial(self._thread.shutdown, wait=True))


def _ignore_result(future: asyncio.Future[Any]) -> None:
    # The batch was failed already; whatever the overrun call ends with is dropped here (and not
    # reported as "exception never retrieved").
    if not future.cancelled():
        with contextlib.suppress(BaseException):
            future.exception()
