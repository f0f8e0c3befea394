"""One CUDA stream per model instance, with a priority from the model's config.

Each instance enqueues its batch (copies in, forward, copies out) on its own stream, so instances
of one model on one GPU overlap instead of serialising on the default stream. A batch launched
from the event loop (:meth:`InstanceStream.launching`) is not waited for: the process's
completion thread reports it (:mod:`~infermux.runtime.completions`); a batch run on an instance
thread (:meth:`InstanceStream.batch`) waits on an event, with the GIL released.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Literal

from infermux.errors import ModelLoadError
from infermux.runtime.completions import COMPLETIONS

if TYPE_CHECKING:
    import torch

Priority = Literal["high", "normal", "low"]

PRIORITY_PARAMETER = "STREAM_PRIORITY"
"""Config parameter: ``high``, ``normal`` (default) or ``low``."""

_PRIORITIES: tuple[Priority, ...] = ("high", "normal", "low")


def parse_priority(model: str, value: str) -> Priority:
    """The config's ``STREAM_PRIORITY`` (empty means normal); a load error for anything else."""
    text = value.strip().lower() or "normal"
    for priority in _PRIORITIES:
        if text == priority:
            return priority
    raise ModelLoadError(
        f"model '{model}': parameter {PRIORITY_PARAMETER} must be high, normal or low, "
        f"got {value!r}"
    )


def priority_for(priority: Priority, priority_range: tuple[int, int]) -> int:
    """The CUDA stream priority for ``priority`` within the device's ``(least, greatest)`` range.

    CUDA numbers priorities backwards (lower = more urgent; e.g. ``(0, -5)``). The default, 0, is
    normal; on today's GPUs it is also the least urgent, so ``low`` and ``normal`` coincide there.
    """
    least, greatest = priority_range
    if priority == "high":
        return greatest
    if priority == "low":
        return least
    return 0 if min(least, greatest) <= 0 <= max(least, greatest) else least


class InstanceStream:
    """A model instance's CUDA stream on its device, and the event its thread waits on.

    Use :meth:`batch` around everything one batch enqueues; leaving it waits for the GPU.
    """

    def __init__(self, device: torch.device, priority: Priority = "normal") -> None:
        import torch

        # torch's stubs leave Stream and Event unannotated and make the static priority_range
        # an instance method, so they are reached through an untyped name.
        cuda: Any = torch.cuda
        self.device = device
        value = priority_for(priority, cuda.Stream.priority_range())
        with torch.cuda.device(device):
            self.stream: torch.cuda.Stream = cuda.Stream(device=device, priority=value)
            # The weights were copied on the default stream when they were loaded; torch's streams
            # do not synchronise with it, so this stream starts after those copies.
            self.stream.wait_stream(torch.cuda.default_stream(device))
            # Spinning (not blocking-sync) events: the lowest latency, and the spin happens with
            # the GIL released, on the instance's own thread. Timed, for the busy fraction.
            self._start: torch.cuda.Event = cuda.Event(enable_timing=True)
            self._done: torch.cuda.Event = cuda.Event(enable_timing=True)
        self.priority = value
        self.busy_seconds = 0.0
        """GPU time of this stream's batches (first copy in to last copy out), summed; its rate
        of change is the stream's occupancy (see :class:`Occupancy`)."""

    @contextlib.contextmanager
    def batch(self) -> Iterator[torch.cuda.Stream]:
        """Make this device and stream current; on exit, wait until the GPU finished the batch.

        The wait also runs when the body raises: staging buffers are reused by the next batch, so
        nothing may still be copying from them when this returns.
        """
        with self.launching() as stream:
            yield stream
        self._done.synchronize()
        self.finished()

    @contextlib.contextmanager
    def launching(self, done: Callable[[], None] | None = None) -> Iterator[torch.cuda.Stream]:
        """Make this device and stream current around what one batch enqueues, without waiting
        for it: on exit :attr:`done` is recorded behind the batch and, when ``done`` is given,
        the process's completion thread calls it once the GPU reached that point
        (:data:`~infermux.runtime.completions.COMPLETIONS`); then call :meth:`finished`. When
        the body (or the watch) raises, this waits for what was enqueued before the error
        propagates: the staging buffers are the next batch's."""
        import torch

        with torch.cuda.device(self.device), torch.cuda.stream(self.stream):
            self._start.record(self.stream)
            try:
                yield self.stream
                self._done.record(self.stream)
                if done is not None:
                    COMPLETIONS.watch(self.stream.cuda_stream, self._done, done)
            except BaseException:
                self._done.record(self.stream)
                self._done.synchronize()
                self.finished()
                raise

    @property
    def done(self) -> torch.cuda.Event:
        """The event recorded behind the last batch :meth:`launching` enqueued."""
        return self._done

    def finished(self) -> None:
        """Account the last batch's GPU time (its :attr:`done` event has completed)."""
        self.busy_seconds += self._start.elapsed_time(self._done) / 1000.0

    def allocated_bytes(self) -> int:
        """Device bytes allocated on this stream outside any graph pool and still in use: the
        cuBLAS/cuDNN workspaces torch keeps per stream (32 MiB of cuBLAS workspace on Hopper).

        Reads the allocator's snapshot (milliseconds, under its lock): call it after a batch,
        on the instance's thread, not per request.
        """
        import torch

        cuda: Any = torch.cuda  # memory_snapshot is unannotated
        handle = self.stream.cuda_stream
        return sum(
            int(segment["allocated_size"])
            for segment in cuda.memory_snapshot()
            if segment.get("stream") == handle
            and tuple(segment.get("segment_pool_id", (0, 0))) == (0, 0)
        )

    def close(self) -> None:
        """Wait for anything still enqueued (nothing is, after :meth:`batch` returned)."""
        self.stream.synchronize()


class Occupancy:
    """The fraction of wall time a stream was busy between two :meth:`sample` calls."""

    def __init__(self, busy_seconds: float = 0.0, now: float | None = None) -> None:
        self._busy = busy_seconds
        self._at = time.monotonic() if now is None else now

    def sample(self, busy_seconds: float, now: float | None = None) -> float:
        """Busy fraction (0..1) since the last sample, given the stream's ``busy_seconds``."""
        now = time.monotonic() if now is None else now
        elapsed = now - self._at
        busy = busy_seconds - self._busy
        self._busy, self._at = busy_seconds, now
        if elapsed <= 0:
            return 0.0
        return min(max(busy / elapsed, 0.0), 1.0)
