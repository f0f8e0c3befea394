"""Imported at start-up by every Python process of an infermux server that the GPU bench starts
with ``run.py --profile-gpu-trace`` (this directory first on ``PYTHONPATH``; see
``benchmarks/gpu/gputrace.py``).

SIGUSR1 starts torch's profiler for the GPU's own activity (kernels, graph replays' kernels,
copies, each with its stream) and stops it ``$INFERMUX_BENCH_GPU_TRACE_SECONDS`` later (2 by
default: a ResNet-50 server at c=256 replays ~100 batches a second of ~150 kernels each, and a
longer trace only costs memory); SIGUSR2 writes it as a Chrome trace to
``$INFERMUX_BENCH_GPU_TRACE/gputrace-<pid>.json``. The stop is timed on the process's running
event loop (the signal is handled on its thread), so it happens inside the measured window, and
the write, which takes a moment, after it. On a machine without CUDA it records CPU activity
instead, which is what the CPU tests exercise.
"""

from __future__ import annotations

import asyncio
import os
import signal
from types import FrameType
from typing import Any

_DIR = os.environ.get("INFERMUX_BENCH_GPU_TRACE", "")
_SECONDS = float(os.environ.get("INFERMUX_BENCH_GPU_TRACE_SECONDS", "2"))
_recording: list[Any] = []  # the profiler between start and its timed stop
_recorded: list[Any] = []  # stopped, not written yet
_asked: list[bool] = []  # SIGUSR2 came before the profiler stopped: write it once it has


def _start(_signum: int, _frame: FrameType | None) -> None:
    import torch
    from torch.profiler import ProfilerActivity, profile

    _finish()
    _recorded.clear()
    _asked.clear()
    gpu = torch.cuda.is_available()
    profiler = profile(activities=[ProfilerActivity.CUDA if gpu else ProfilerActivity.CPU])
    profiler.start()  # its first start can take a second, during which SIGUSR2 may come
    _recording.append(profiler)
    try:
        asyncio.get_running_loop().call_later(_SECONDS, _finish)
    except RuntimeError:  # no loop on this thread: SIGUSR2 stops it
        pass


def _finish() -> None:
    while _recording:
        profiler = _recording.pop()
        profiler.stop()
        _recorded.append(profiler)
    if _asked and _recorded:
        _save(_recorded.pop())


def _save(profiler: Any) -> None:
    _asked.clear()
    path = os.path.join(_DIR, f"gputrace-{os.getpid()}.json")
    profiler.export_chrome_trace(path + ".part")
    os.replace(path + ".part", path)  # seen whole or not at all


def _write(_signum: int, _frame: FrameType | None) -> None:
    _asked.append(True)
    if _recorded or not _recording:  # else the timed stop writes it
        _finish()


if _DIR:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _write)
