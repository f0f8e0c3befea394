"""GPU batches finishing, told to whoever waits for them, with one thread for the whole process.

A GPU instance launches a batch with a few non-blocking calls on its stream (copies in, a graph
replay, copies out, an event) and returns to the event loop. :meth:`Completions.watch` then puts a
*host function* on the stream behind that work: libc's ``sem_post`` on a process-wide semaphore,
run by the CUDA driver's own callback thread when the stream reaches it. No Python runs there, so
the driver's thread never waits for the GIL and the stream never stalls behind it (a Python host
callback would hold the stream until the interpreter let it in).

One completion thread waits on that semaphore with the GIL released. Each post wakes it; it looks
which watched batches' events have completed (per stream they complete in order, across streams
in any order, so it asks each event rather than assuming an order) and calls their callbacks,
which hand the news to the event loop (``call_soon_threadsafe``). Per batch that is one GIL
acquisition on the completion thread, where an instance thread per model instance needed one per
GPU call and queued for the GIL behind the loop each time (``docs/decisions.md`` has the figures).

CUDA and libc are reached through ``ctypes`` (:mod:`~infermux.runtime.driver`): the driver API's
``cuLaunchHostFunc`` takes the raw function pointer that a binding would wrap in Python.
"""

from __future__ import annotations

import ctypes
import errno
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from infermux.runtime.driver import DRIVER, DriverError

logger = logging.getLogger(__name__)

_SEM_T_BYTES = 32
"""``sizeof(sem_t)`` on 64-bit Linux (glibc and musl)."""


class CompletionError(RuntimeError):
    """The driver refused to watch a stream (the message names the CUDA error)."""


class Event(Protocol):
    """What is asked of a watched event (``torch.cuda.Event`` has it)."""

    def query(self) -> bool: ...


@dataclass(slots=True)
class _Watch:
    event: Event
    done: Callable[[], None]


class Completions:
    """The process's completion thread and its semaphore; use :data:`COMPLETIONS`.

    :meth:`watch` is called on the thread that launched the batch (the event loop's), callbacks
    run on the completion thread: they must only hand the news on (e.g. ``call_soon_threadsafe``)
    and must not raise.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: list[_Watch] = []
        self._thread: threading.Thread | None = None
        self._sem = ctypes.create_string_buffer(_SEM_T_BYTES)
        self.wakeups = 0
        """Times the completion thread woke (a figure for benchmarks and tests)."""

    def watch(self, stream_handle: int, event: Event, done: Callable[[], None]) -> None:
        """Call ``done()`` (on the completion thread) once ``event``, recorded on the stream
        ``stream_handle`` (a ``cudaStream_t``) before this call, has completed. Call it with
        the stream's device current."""
        self._start()
        watch = _Watch(event, done)
        with self._lock:
            self._watched.append(watch)
        try:
            DRIVER.launch_host_func(stream_handle, DRIVER.sem_post, ctypes.addressof(self._sem))
        except DriverError as exc:
            with self._lock:
                self._watched.remove(watch)
            raise CompletionError(str(exc)) from None

    @property
    def watching(self) -> int:
        """Batches watched and not yet reported."""
        with self._lock:
            return len(self._watched)

    def _start(self) -> None:
        if self._thread is not None:
            return
        with self._lock:
            if self._started():  # another thread won
                return
            DRIVER.bind()
            if DRIVER.libc.sem_init(self._sem, 0, 0) != 0:
                raise CompletionError(f"sem_init failed: errno {ctypes.get_errno()}")
            if not DRIVER.sem_post:
                raise CompletionError("libc has no sem_post")
            # A daemon: a GPU that never finishes must not keep the process from exiting.
            self._thread = threading.Thread(target=self._run, name="gpu-completions", daemon=True)
            self._thread.start()

    def _started(self) -> bool:
        return self._thread is not None

    def _run(self) -> None:
        sem_wait = DRIVER.libc.sem_wait
        sem = ctypes.addressof(self._sem)
        while True:
            # ctypes releases the GIL for the call: the thread sleeps outside the interpreter.
            if sem_wait(sem) != 0:
                if ctypes.get_errno() == errno.EINTR:
                    continue
                logger.error(
                    "the GPU completion thread stops: sem_wait errno %d", ctypes.get_errno()
                )
                return
            self.wakeups += 1
            self._report_finished()

    def _report_finished(self) -> None:
        finished: list[_Watch] = []
        waiting: list[_Watch] = []
        with self._lock:
            for watch in self._watched:
                (finished if watch.event.query() else waiting).append(watch)
            self._watched = waiting
        for watch in finished:
            try:
                watch.done()
            except Exception:  # a callback's bug must not stop every later completion
                logger.exception("a GPU completion callback failed")


COMPLETIONS = Completions()
"""The process's one completion thread (started by the first :meth:`Completions.watch`)."""
