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

When a batch is launched on an idle GPU (no other batch of the process in flight: low load, where
latency is what matters), the event loop also polls its event once per loop iteration, for at
most :attr:`Completions.spin_seconds`, and reports it itself when it completes. On the H200 host
a thread woken from a sleep of a millisecond took ~0.3-0.5 ms to run again: the host function,
the completion thread and the loop's own wake-up added 536 µs (p50) to a 0.9 ms batch, the
loop's polling 30 µs (``benchmarks/gpu/completion_latency.py``, ``docs/decisions.md``). The
price is the loop's CPU while it polls, and only at low load; under load batches overlap and
the semaphore path alone reports them. Whichever path sees a batch first reports it, once.

CUDA and libc are reached through ``ctypes`` (:mod:`~infermux.runtime.driver`): the driver API's
``cuLaunchHostFunc`` takes the raw function pointer that a binding would wrap in Python.
"""

from __future__ import annotations

import asyncio
import ctypes
import errno
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

from infermux.runtime.driver import DRIVER, DriverError
from infermux.runtime.loop_polling import poll_each_iteration
from infermux.settings import DEFAULT_GPU_COMPLETION_SPIN_US

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
    run on the completion thread, or on that loop when its polling saw the batch first: they
    must only hand the news on (e.g. ``call_soon_threadsafe``) and must not raise.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._watched: list[_Watch] = []
        self._thread: threading.Thread | None = None
        self._sem = ctypes.create_string_buffer(_SEM_T_BYTES)
        self.wakeups = 0
        """Times the completion thread woke (a figure for benchmarks and tests)."""
        self.spin_seconds = DEFAULT_GPU_COMPLETION_SPIN_US / 1e6
        """How long the loop polls a batch launched on an idle GPU (0: never). The default
        (``--gpu-completion-spin-us``): a ResNet-50 or BERT-base batch of one takes ~0.8-0.9
        ms on an H200, so small batches at low load are polled to their end, while a long
        batch stops costing CPU after 2 ms and is reported by the completion thread."""
        self.polled = 0
        """Batches the loop's polling reported (a figure for benchmarks and tests)."""
        self._polling = False  # one poll at a time

    def watch(self, stream_handle: int, event: Event, done: Callable[[], None]) -> None:
        """Call ``done()`` once (on the completion thread, or on the running loop if it polls
        the batch) when ``event``, recorded on the stream ``stream_handle`` (a
        ``cudaStream_t``) before this call, has completed. Call it with the stream's device
        current."""
        self._start()
        watch = _Watch(event, done)
        with self._lock:
            idle = not self._watched
            self._watched.append(watch)
        try:
            DRIVER.launch_host_func(stream_handle, DRIVER.sem_post, ctypes.addressof(self._sem))
        except DriverError as exc:
            with self._lock:
                self._watched.remove(watch)
            raise CompletionError(str(exc)) from None
        if idle:
            self._poll_on_loop(watch)

    def _poll_on_loop(self, watch: _Watch) -> None:
        """Poll ``watch``'s event once per iteration of the running loop (if any) until it
        completes, for at most :attr:`spin_seconds`; report it if the completion thread did not
        yet. One poll at a time: a new one starts only once the last has ended."""
        if self.spin_seconds <= 0 or self._polling:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # launched outside a loop: the completion thread reports it
            return
        self._polling = True

        def ended() -> None:
            self._polling = False

        def finished() -> None:
            if self._claim(watch):
                self.polled += 1
                _report(watch)

        # A query that fails ends the poll: the completion thread's own query meets it.
        poll_each_iteration(loop, self.spin_seconds, watch.event.query, finished, ended)

    def _claim(self, watch: _Watch) -> bool:
        """Take ``watch`` off the watched list: True for the one caller that may report it."""
        with self._lock:
            try:
                self._watched.remove(watch)
            except ValueError:  # the completion thread reported it already
                return False
        return True

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
            _report(watch)


def _report(watch: _Watch) -> None:
    try:
        watch.done()
    except Exception:  # a callback's bug must not stop every later completion
        logger.exception("a GPU completion callback failed")


COMPLETIONS = Completions()
"""The process's one completion thread (started by the first :meth:`Completions.watch`)."""
