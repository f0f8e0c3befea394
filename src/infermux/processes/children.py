"""The supervisor's bookkeeping of the processes it runs: who they are, where they sit, how long
to wait before restarting one that died, how they are stopped."""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from multiprocessing.process import BaseProcess
from typing import Literal

from infermux.ipc import Channel

from .control import Control, Stop
from .desired import Desired

logger = logging.getLogger("infermux")

MAX_BACKOFF = 10.0
STABLE_SECONDS = 10.0  # a process up this long resets its restart delay
KILL_GRACE = 5.0
SCRAPE_TIMEOUT = 5.0  # an executor that does not answer a scrape in time is left out of it


@dataclass(eq=False)
class Child:
    role: Literal["executor", "frontend"]
    index: int
    process: BaseProcess
    control: Control
    started_at: float = field(default_factory=time.monotonic)
    up: bool = False  # Started (front end) / Ready (executor) received
    only: bool = False  # the one process of its role (names it without an index)
    stopping: bool = False
    hung: bool = False  # killed for not answering the heartbeat
    given: Desired = field(default_factory=Desired)  # executor: what it was told clients changed

    @property
    def name(self) -> str:
        if self.role == "executor" and self.only:
            return "executor"
        return f"{self.role}-{self.index}"


@dataclass(eq=False)
class Slot:
    """A process position: the process now filling it, its restart delay, and (front ends)
    its channel to each executor, by executor index."""

    index: int
    child: Child | None = None
    channels: dict[int, Channel] = field(default_factory=dict)
    backoff: float = 0.0


async def stop(children: list[Child], timeout: float) -> None:
    """Tell ``children`` to stop; kill those still running after ``timeout`` seconds."""
    for child in children:
        child.stopping = True
        child.control.send(Stop())
    await asyncio.gather(*(_reap(c, timeout) for c in children))


async def _reap(child: Child, timeout: float) -> None:
    if not await asyncio.to_thread(_ended, child.process, timeout):
        logger.warning("%s did not stop in %.0f s; killing it", child.name, timeout)
        child.process.kill()
    # Reaps it, unless the supervisor's watcher of this child did (then it returns at once).
    await asyncio.to_thread(child.process.join)
    child.control.close()


def _ended(process: BaseProcess, timeout: float) -> bool:
    """Whether ``process`` exited within ``timeout`` seconds, told by its sentinel, which does
    not reap it. ``join`` followed by ``is_alive`` is not enough here: the supervisor's watcher
    of the child joins it from another thread, and when that thread reaps it first, this one's
    ``waitpid`` fails and ``is_alive`` answers True for a process that is gone."""
    return bool(wait([process.sentinel], timeout))


def next_backoff(current: float, child: Child) -> float:
    if time.monotonic() - child.started_at > STABLE_SECONDS:
        return 0.0
    return min(MAX_BACKOFF, max(0.5, current * 2))
