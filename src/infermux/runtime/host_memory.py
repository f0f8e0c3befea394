"""Host memory the GPU copies from where it lies: ranges registered with CUDA (page-locked).

A request's input rows already sit in host memory the executor holds for the whole request: the
front end's transfer arena (``ipc``), or the block a system shared-memory input was read into.
Stacking them into a staging buffer before the copy to the device costs a host ``memcpy`` per
request on the executor's event loop (measured on the H200 host: ~45 µs per 150 KB ResNet-50
image, a fifth of the executor's time). Registered with CUDA (``cuMemHostRegister``, for every
device), such a range is DMA-able: each request's rows go to the device with one asynchronous
copy, and the host copies nothing.

Whoever owns a range *offers* it (:meth:`HostMemory.offer`; cheap, no CUDA); the GPU path asks
:meth:`HostMemory.pinned` for the addresses it is about to copy, and the range holding them is
registered then, once (milliseconds for a few hundred MiB, on the first batch that needs it), so a
server without GPU models never pins anything. :meth:`HostMemory.withdraw` unregisters a range
before its owner unmaps it. A range CUDA refuses to register (e.g. a memlock limit) is
remembered as such, logged once, and its requests are staged as before.
"""

from __future__ import annotations

import bisect
import logging
import threading
from dataclasses import dataclass

from infermux.runtime.driver import DRIVER

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Range:
    start: int
    size: int
    what: str
    state: str = "offered"  # offered -> pinned | refused


class HostMemory:
    """The process's offered host ranges and which of them are pinned; use :data:`HOST_MEMORY`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._starts: list[int] = []
        self._ranges: list[_Range] = []

    def offer(self, start: int, size: int, what: str) -> None:
        """Let the GPU path pin ``[start, start + size)`` (``what`` names it in messages)."""
        if size <= 0:
            return
        with self._lock:
            index = bisect.bisect(self._starts, start)
            self._starts.insert(index, start)
            self._ranges.insert(index, _Range(start, size, what))

    def withdraw(self, start: int) -> None:
        """Forget the range offered at ``start``, unregistering it if it was pinned. Call it
        before unmapping the memory, once no copy from it is in flight."""
        with self._lock:
            index = bisect.bisect_left(self._starts, start)
            if index == len(self._starts) or self._starts[index] != start:
                return
            del self._starts[index]
            found = self._ranges.pop(index)
        if found.state == "pinned":
            _unregister(found)

    def pinned(self, address: int, size: int) -> bool:
        """Whether ``size`` bytes at ``address`` lie in one pinned range (pinning an offered
        range on first use)."""
        index = bisect.bisect(self._starts, address) - 1
        if index < 0:
            return False
        found = self._ranges[index]
        if address + size > found.start + found.size:
            return False
        if found.state == "offered":
            self._pin(found)
        return found.state == "pinned"

    @property
    def pinned_bytes(self) -> int:
        return sum(r.size for r in self._ranges if r.state == "pinned")

    def _pin(self, found: _Range) -> None:
        try:
            error = DRIVER.host_register(found.start, found.size)
        except OSError as exc:  # no CUDA driver in this process
            error = -1
            logger.debug("no CUDA driver to pin %s: %s", found.what, exc)
        if error == 0:
            found.state = "pinned"
            logger.info(
                "pinned %s (%d MiB) for direct copies to the GPU", found.what, found.size >> 20
            )
            return
        found.state = "refused"
        logger.warning(
            "cannot pin %s (%d MiB) for direct copies to the GPU (CUDA error %d): its inputs are "
            "staged through a pinned buffer instead (check the memlock limit, ulimit -l)",
            found.what,
            found.size >> 20,
            error,
        )


def _unregister(found: _Range) -> None:
    import torch

    # The driver call needs a current context; the one this thread last used will do (the
    # registration is portable).
    with torch.cuda.device(torch.cuda.current_device()):
        error = DRIVER.host_unregister(found.start)
    if error != 0:
        logger.warning("unpinning %s failed (CUDA error %d)", found.what, error)


HOST_MEMORY = HostMemory()
"""The process's registry of host memory the GPU may copy from directly."""
