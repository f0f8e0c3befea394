"""What ``run.py``'s in-process profilers share (``cprofiling.py``, ``gputrace.py``): the server
starts with the profiler's hook directory first on ``PYTHONPATH``, whose ``sitecustomize`` installs
signal handlers in every process, and run.py signals the profiled processes at the window's
edges, SIGUSR1 at its start and SIGUSR2 at its end."""

from __future__ import annotations

import os
import signal
from pathlib import Path


def server_env(hook: Path, variable: str, directory: Path) -> dict[str, str]:
    """Environment additions for ``infermux serve``: ``hook`` first on ``PYTHONPATH``, and
    ``variable`` naming ``directory``, where the hook writes."""
    directory.mkdir(parents=True, exist_ok=True)
    path = os.pathsep.join(p for p in (str(hook), os.environ.get("PYTHONPATH", "")) if p)
    return {"PYTHONPATH": path, variable: str(directory)}


def _signal(pids: list[int], signum: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass


def start(pids: list[int]) -> None:
    _signal(pids, signal.SIGUSR1)


def stop(pids: list[int]) -> None:
    _signal(pids, signal.SIGUSR2)
