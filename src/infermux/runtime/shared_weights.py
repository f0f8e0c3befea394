"""A process-wide cache of model weights: loaded once per file and device, shared, ref-counted.

Several instances of one model version on one GPU run the same weights; loading them once per
instance would multiply the model's GPU memory by the instance count. Instances *acquire* the
weights (the first one loads them) and *release* them on close; the last release drops the
cache's reference and hands the freed memory back to the driver.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

T = TypeVar("T")

WeightsKey = tuple[str, int, str]
"""(file path, mtime in ns, device): a rewritten file is new weights, and so is another device."""


@dataclass(slots=True)
class _Entry(Generic[T]):
    users: int = 0
    value: T | None = None
    # Held while loading, so one device's model loads once while other models load in parallel.
    loading: threading.Lock = field(default_factory=threading.Lock)


class Lease(Generic[T]):
    """One instance's use of shared weights; :meth:`release` it exactly when the instance closes."""

    def __init__(self, cache: SharedWeights[T], key: WeightsKey, value: T) -> None:
        self._cache: SharedWeights[T] | None = cache
        self.key = key
        self.value = value

    def release(self) -> None:
        """Give the weights back; later calls do nothing (close may run twice on error paths)."""
        cache, self._cache = self._cache, None
        if cache is not None:
            del self.value  # the instance's reference must go before the cache frees memory
            cache.release(self.key)


class SharedWeights(Generic[T]):
    """Weights shared by every instance of one model file on one device.

    ``free(device)`` runs after the last user of a key releases it (outside the lock), e.g.
    :func:`release_device_memory`, which returns cached CUDA blocks to the driver.
    """

    def __init__(self, free: Callable[[str], None] | None = None) -> None:
        self._free = free or release_device_memory
        self._lock = threading.Lock()
        self._entries: dict[WeightsKey, _Entry[T]] = {}

    def acquire(self, path: str, device: str, load: Callable[[], T], variant: str = "") -> Lease[T]:
        """The weights of ``path`` on ``device``, made by ``load()`` for the first user only.
        ``variant`` tells apart different weights made from one file (e.g. at another precision).

        An exception from ``load`` propagates to this caller and leaves nothing cached; an
        instance waiting for the same key then tries loading itself.
        """
        key = (f"{path} [{variant}]" if variant else path, os.stat(path).st_mtime_ns, device)
        with self._lock:
            entry = self._entries.setdefault(key, _Entry())
            entry.users += 1
        try:
            with entry.loading:
                if entry.value is None:
                    entry.value = load()
                return Lease(self, key, entry.value)
        except BaseException:
            self.release(key)
            raise

    def release(self, key: WeightsKey) -> None:
        """Drop one use of ``key``; the last one frees the weights."""
        with self._lock:
            entry = self._entries[key]
            entry.users -= 1
            if entry.users > 0:
                return
            del self._entries[key]
        entry.value = None
        self._free(key[2])

    def users(self, key: WeightsKey) -> int:
        """How many instances hold ``key`` (0 once released)."""
        with self._lock:
            entry = self._entries.get(key)
            return entry.users if entry else 0

    def held(self) -> list[WeightsKey]:
        """The keys held now (for diagnostics and tests)."""
        with self._lock:
            return list(self._entries)


def release_device_memory(device: str) -> None:
    """Return cached, unused blocks of a CUDA ``device`` to the driver (other processes may need
    the freed weights); nothing for other devices, whose memory the allocator gives back itself."""
    if not device.startswith("cuda"):
        return
    import torch

    with torch.cuda.device(device):
        torch.cuda.empty_cache()


WEIGHTS: SharedWeights[Any] = SharedWeights()
"""The process's cache, shared by every backend (keys name the file, so they never collide)."""
