"""What a model instance holds in memory, by device and component, and how it adds up per model.

Instances report :class:`MemoryUse` rows (weights, device buffers, CUDA graph pools, pinned
staging); weights shared by several instances on one GPU carry the same ``shared_key`` and are
counted once. The totals per device are Triton's statistics ``memory_usage`` rows; the breakdown
is what the load log shows.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol, runtime_checkable

from infermux.types import MemoryUsage

MemoryKind = Literal["GPU", "CPU", "CPU_PINNED"]
"""Triton's ``memory_usage`` types."""


@dataclass(frozen=True, slots=True)
class MemoryUse:
    """``byte_size`` bytes of ``kind`` memory on device ``device_id``, used for ``component``
    (``weights``, ``buffers``, ``graphs``, ``staging``)."""

    kind: MemoryKind
    device_id: int
    component: str
    byte_size: int
    shared_key: str = ""
    """Rows with the same non-empty key are one allocation, shared (counted once per model)."""


@runtime_checkable
class ReportsMemory(Protocol):
    """A backend instance that can say what it holds (optional: others report nothing)."""

    def memory_usage(self) -> Sequence[MemoryUse]:
        """Cheap (no device synchronisation): it is called from the event loop on every
        statistics request."""
        ...


def _unique(uses: Iterable[MemoryUse]) -> list[MemoryUse]:
    seen: set[tuple[str, MemoryKind, int]] = set()
    unique = []
    for use in uses:
        if use.shared_key:
            key = (use.shared_key, use.kind, use.device_id)
            if key in seen:
                continue
            seen.add(key)
        unique.append(use)
    return unique


def total_by_device(uses: Iterable[MemoryUse]) -> tuple[MemoryUsage, ...]:
    """Triton's ``memory_usage`` rows: bytes per (type, device id), shared rows counted once."""
    totals: dict[tuple[str, int], int] = {}
    for use in _unique(uses):
        key = (use.kind, use.device_id)
        totals[key] = totals.get(key, 0) + use.byte_size
    return tuple(
        MemoryUsage(kind, device_id, size) for (kind, device_id), size in sorted(totals.items())
    )


def instance_memory(instances: Iterable[object]) -> list[MemoryUse]:
    """Every row reported by the instances that report memory."""
    return [use for i in instances if isinstance(i, ReportsMemory) for use in i.memory_usage()]


def by_component(uses: Iterable[MemoryUse]) -> dict[tuple[MemoryKind, int, str], int]:
    """Bytes per (kind, device id, component), shared rows counted once (what the metrics show)."""
    totals: dict[tuple[MemoryKind, int, str], int] = {}
    for use in _unique(uses):
        key = (use.kind, use.device_id, use.component)
        totals[key] = totals.get(key, 0) + use.byte_size
    return totals


def describe(uses: Iterable[MemoryUse]) -> str:
    """One log line: bytes per device and component, shared weights counted once, e.g.
    ``GPU 0: weights 48.8 MiB, buffers 36.8 MiB, graphs 120.0 MiB; pinned host: staging ...``."""
    by_device: dict[tuple[str, int], dict[str, int]] = {}
    for (memory_kind, device_id, component), size in by_component(uses).items():
        by_device.setdefault((memory_kind, device_id), {})[component] = size
    parts = []
    for (kind, device_id), components in sorted(by_device.items()):
        where = "pinned host" if kind == "CPU_PINNED" else f"{kind} {device_id}"
        sizes = ", ".join(f"{name} {format_bytes(size)}" for name, size in components.items())
        parts.append(f"{where}: {sizes}")
    return "; ".join(parts) or "nothing reported"


def format_bytes(size: int) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(size)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if value < 1024 or unit == "GiB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")
