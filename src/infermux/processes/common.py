"""What every infermux process sets up the same way: logging and the event loop."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from infermux.observability.logs import configure_logging

__all__ = ["become_child", "configure_logging", "run"]


def run(coro: Coroutine[Any, Any, None]) -> None:
    """Run ``coro`` on uvloop where it exists (plain asyncio elsewhere, e.g. Windows)."""
    try:
        import uvloop
    except ImportError:
        asyncio.run(coro)
    else:
        uvloop.run(coro)


def become_child() -> None:
    """Settings for a process the supervisor runs: Ctrl-C in a terminal reaches the whole
    process group, but only the supervisor decides the shutdown order, so children ignore
    SIGINT; and a child must not outlive a supervisor killed outright (Linux: SIGTERM then)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    if sys.platform == "linux":
        with contextlib.suppress(OSError, AttributeError):
            libc = ctypes.CDLL(None, use_errno=True)
            pr_set_pdeathsig = 1
            libc.prctl(pr_set_pdeathsig, signal.SIGTERM)
