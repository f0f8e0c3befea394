"""A wake-up on the event loop at a deadline given in nanoseconds: no early firing, no spinning.

The dynamic batcher waits for the oldest request's queue delay (``max_queue_delay_microseconds``,
often a few hundred µs). uvloop, which infermux runs on, keeps timers in whole milliseconds and
rounds a delay to the nearest one: a wait under 0.5 ms fires at the next loop iteration, so
waiting out the rest of a delay with ``wait_for``/``call_later`` spins the loop until it is over
(one 500 µs delay: 46 iterations and 511 µs of CPU, measured), and one over 0.5 ms fires up to a
millisecond late. asyncio's own loop rounds its waits up to whole milliseconds instead.

A :class:`Deadline` arms a Linux ``timerfd`` that the loop watches like any other file: the
kernel wakes the loop's ``epoll`` when the time comes (within the timer slack, ~50 µs), and
arming costs one syscall. Where there is no timerfd (not Linux) it falls back to ``call_later``
rounded *up* to whole milliseconds: late, never spinning. ``docs/decisions.md`` has the figures.
"""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import os
import time
import weakref
from collections.abc import Callable

_CLOCK_MONOTONIC = 1
_TFD_NONBLOCK = os.O_NONBLOCK
_TFD_CLOEXEC = os.O_CLOEXEC


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


class _Itimerspec(ctypes.Structure):
    _fields_ = [("it_interval", _Timespec), ("it_value", _Timespec)]


def _libc_timerfd() -> tuple[Callable[..., int], Callable[..., int]] | None:
    """libc's ``timerfd_create`` and ``timerfd_settime`` (None where there are none). Python
    3.13 has them in :mod:`os`; the 3.11 and 3.12 infermux supports do not."""
    try:
        # None: the process's own symbols, libc among them, where no libc file is found by name
        # (as runtime/driver.py binds it).
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        create, settime = libc.timerfd_create, libc.timerfd_settime
    except (OSError, AttributeError):
        return None
    create.argtypes = [ctypes.c_int, ctypes.c_int]
    create.restype = ctypes.c_int
    settime.argtypes = [
        ctypes.c_int,
        ctypes.c_int,
        ctypes.POINTER(_Itimerspec),
        ctypes.POINTER(_Itimerspec),
    ]
    settime.restype = ctypes.c_int
    return create, settime


_TIMERFD = _libc_timerfd()


class Deadline:
    """Calls ``callback`` on ``loop`` once the time :meth:`at` last set has come. Re-arming
    replaces the previous time; :meth:`close` when done (it holds a file descriptor)."""

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._loop = loop
        self._callback = callback
        self._handle: asyncio.TimerHandle | None = None  # the fallback's
        self._fd = -1
        self._closer: weakref.finalize[[int], Deadline] | None = None
        self._spec = _Itimerspec()
        self._armed_ns: int | None = None  # the time the timerfd is set for (None: not set)
        if _TIMERFD is not None:
            fd = _TIMERFD[0](_CLOCK_MONOTONIC, _TFD_NONBLOCK | _TFD_CLOEXEC)
            if fd >= 0:
                self._fd = fd
                loop.add_reader(fd, self._expired)
                # An owner never closed (a test's batcher): the descriptor goes with the object.
                self._closer = weakref.finalize(self, os.close, fd)

    @property
    def precise(self) -> bool:
        """Whether a timerfd keeps the time (else whole milliseconds, late)."""
        return self._fd >= 0

    def at(self, when_ns: int) -> None:
        """Call back at ``when_ns`` on :func:`time.perf_counter_ns`'s clock (at once, on the
        loop's next iteration, when it has passed)."""
        if when_ns == self._armed_ns:  # every idle worker asks for the same time: armed already
            return
        left = when_ns - time.perf_counter_ns()
        if self._fd < 0:
            if self._handle is not None:
                self._handle.cancel()
            # Whole milliseconds, rounded up: uvloop would round a shorter one down to 0.
            delay = max(0, -(-left // 1_000_000)) / 1e3
            self._handle = self._loop.call_later(delay, self._callback)
            return
        value = self._spec.it_value
        left = max(left, 1)  # 0 would disarm it
        value.tv_sec, value.tv_nsec = divmod(left, 1_000_000_000)
        if _TIMERFD[1](self._fd, 0, ctypes.byref(self._spec), None) != 0:  # type: ignore[index]
            raise OSError(ctypes.get_errno(), "timerfd_settime failed")
        self._armed_ns = when_ns

    def cancel(self) -> None:
        self._armed_ns = None
        if self._fd < 0:
            if self._handle is not None:
                self._handle.cancel()
                self._handle = None
            return
        value = self._spec.it_value
        value.tv_sec = value.tv_nsec = 0
        _TIMERFD[1](self._fd, 0, ctypes.byref(self._spec), None)  # type: ignore[index]

    def close(self) -> None:
        self.cancel()
        if self._fd >= 0:
            if not self._loop.is_closed():
                self._loop.remove_reader(self._fd)
            assert self._closer is not None
            self._closer()  # closes the descriptor, once
            self._fd = -1

    def _expired(self) -> None:
        try:
            os.read(self._fd, 8)
        except BlockingIOError:  # re-armed or cancelled since: not expired
            return
        self._armed_ns = None
        self._callback()
