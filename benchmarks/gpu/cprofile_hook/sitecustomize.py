"""Imported at start-up by every Python process of an infermux server that the GPU bench starts
with ``run.py --profile-cprofile`` (this directory first on ``PYTHONPATH``; see
``benchmarks/gpu/cprofiling.py``).

SIGUSR1 starts a fresh ``cProfile`` of the thread the signal is handled on, the main thread: in
an executor that is the event loop's. SIGUSR2 stops it and writes
``$INFERMUX_BENCH_CPROFILE/cprofile-<pid>.prof``. Deterministic profiling sees every call on that
thread, C functions included (a ``ctypes`` CUDA call, a torch method, a syscall wrapper), where
py-spy's ``--native`` sampling crashed on the H200 and its Python-only sampling shows native time
only as its caller's own.
"""

from __future__ import annotations

import cProfile
import os
import signal
from types import FrameType

_DIR = os.environ.get("INFERMUX_BENCH_CPROFILE", "")
_running: list[cProfile.Profile] = []


def _start(_signum: int, _frame: FrameType | None) -> None:
    while _running:
        _running.pop().disable()
    profile = cProfile.Profile()
    _running.append(profile)
    profile.enable()


def _stop(_signum: int, _frame: FrameType | None) -> None:
    if not _running:
        return
    profile = _running.pop()
    profile.disable()
    profile.dump_stats(os.path.join(_DIR, f"cprofile-{os.getpid()}.prof"))


if _DIR:
    signal.signal(signal.SIGUSR1, _start)
    signal.signal(signal.SIGUSR2, _stop)
