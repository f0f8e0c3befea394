"""What every infermux process sets up the same way: logging and the event loop; and the
shared-memory check the supervisor makes before starting any."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import signal
import sys
from collections.abc import Coroutine
from typing import Any

from infermux.errors import StartupError
from infermux.observability.logs import configure_logging
from infermux.settings import ServerSettings, channel_bytes, shared_memory_free

__all__ = ["become_child", "check_shared_memory", "configure_logging", "run"]


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


def check_shared_memory(settings: ServerSettings, free: int | None = None) -> None:
    """Refuse to start when /dev/shm cannot hold every channel. Shared memory is allocated as
    it is touched, so an undersized /dev/shm (Docker's default is 64 MiB) would not fail here
    but kill a process with SIGBUS under load; better a clear error now."""
    needed = settings.frontends * settings.executors * channel_bytes(settings.ipc_arena_mb)
    free = shared_memory_free() if free is None else free
    if free is not None and needed > free:
        raise StartupError(
            f"--frontends {settings.frontends} --executors {settings.executors} with "
            f"--ipc-arena-mb {settings.ipc_arena_mb} needs "
            f"{needed / 2**20:,.0f} MiB of shared memory but /dev/shm has {free / 2**20:,.0f} "
            "MiB free; lower --ipc-arena-mb or --frontends, or enlarge /dev/shm (Docker: "
            "--shm-size)"
        )
