"""``run.py --profile-cprofile``: a deterministic profile of the executor's event-loop thread
during the profile run, for where py-spy cannot look (its ``--native`` mode crashed on the H200,
and without it time spent inside C calls, CUDA's and torch's included, is credited to the Python
line that made them, unnamed).

The server starts with ``cprofile_hook/`` first on ``PYTHONPATH``, whose ``sitecustomize`` installs
two signal handlers in every process; :func:`start` and :func:`stop` signal the executors at the
profile window's edges, and :func:`summary` turns the dumps into text (the top functions by own
time and by cumulative time, with call counts: per batch or per request is then a division by the
run's executions or inferences).
"""

from __future__ import annotations

import io
import pstats
import time
from pathlib import Path

import profile_hooks

HOOK = Path(__file__).resolve().parent / "cprofile_hook"
start = profile_hooks.start  # SIGUSR1 to the profiled processes: the window opens
stop = profile_hooks.stop  # SIGUSR2: it closes


def server_env(directory: Path) -> dict[str, str]:
    """Environment additions for ``infermux serve`` (dumps go to ``directory``)."""
    return profile_hooks.server_env(HOOK, "INFERMUX_BENCH_CPROFILE", directory)


def summary(directory: Path, pids: list[int], title: str, *, wait_s: float = 5.0) -> str:
    """Text of each pid's dump (waiting up to ``wait_s`` for them to be written)."""
    deadline = time.monotonic() + wait_s
    paths = [directory / f"cprofile-{pid}.prof" for pid in pids]
    while not all(p.exists() for p in paths) and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(0.2)  # a dump seen may still be being written
    parts = [f"# cProfile: {title}"]
    for pid, path in zip(pids, paths, strict=True):
        if not path.exists():
            parts.append(f"## pid {pid}: no dump (the signal was not handled in {wait_s:g} s)")
            continue
        for order in ("tottime", "cumulative"):
            text = io.StringIO()
            stats = pstats.Stats(str(path), stream=text)
            stats.sort_stats(order).print_stats(45)
            parts.append(f"## pid {pid}, by {order}\n{text.getvalue()}")
    return "\n\n".join(parts)
