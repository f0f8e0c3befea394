"""GPU readings through NVML (``pynvml`` from nvidia-ml-py), failing soft: with no GPU, no driver
or no pynvml every reading is None, so the same run works as a CPU smoke test.

NVML never creates a CUDA context, so the orchestrator can sample without taking GPU memory.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

MIB = 1024 * 1024


class Nvml:
    """One GPU (index 0 by default); ``error`` says why readings are None."""

    def __init__(self, index: int = 0) -> None:
        self.error: str | None = None
        self._nvml: Any = None
        self._handle: Any = None
        try:
            import pynvml

            pynvml.nvmlInit()
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            self._nvml = pynvml
        except Exception as exc:  # ImportError, NVMLError_LibraryNotFound, no device, ...
            self.error = f"{type(exc).__name__}: {exc}"

    @property
    def available(self) -> bool:
        return self._nvml is not None

    def info(self) -> dict[str, Any]:
        if not self.available:
            return {"available": False, "error": self.error}
        nv = self._nvml
        name = nv.nvmlDeviceGetName(self._handle)
        return {
            "available": True,
            "name": name.decode() if isinstance(name, bytes) else name,
            "driver": _text(nv.nvmlSystemGetDriverVersion()),
            "memory_total_mib": round(nv.nvmlDeviceGetMemoryInfo(self._handle).total / MIB),
        }

    def device_used_mib(self) -> float | None:
        """Memory used on the device by everyone (includes other tenants and contexts)."""
        if not self.available:
            return None
        return round(float(self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used) / MIB, 1)

    def utilization(self) -> tuple[int, int] | None:
        """(GPU busy %, memory-controller busy %) over NVML's last sample period."""
        if not self.available:
            return None
        rates = self._nvml.nvmlDeviceGetUtilizationRates(self._handle)
        return int(rates.gpu), int(rates.memory)

    def processes(self) -> dict[int, float]:
        """pid -> MiB for every compute process NVML reports (empty when unavailable)."""
        if not self.available:
            return {}
        try:
            found = self._nvml.nvmlDeviceGetComputeRunningProcesses(self._handle)
        except Exception:
            return {}
        return {int(p.pid): round((p.usedGpuMemory or 0) / MIB, 1) for p in found}

    def process_mib(self, pids: set[int]) -> float | None:
        """Summed memory of ``pids``; None when NVML reports none of them. In a container NVML
        may report host pids, which never match: callers then fall back to the device delta."""
        found = self.processes()
        mine = [mib for pid, mib in found.items() if pid in pids]
        return round(sum(mine), 1) if mine else None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


class Sampler:
    """Samples utilisation, device memory and a process set's memory every ``period`` seconds on a
    thread, between ``start()`` and ``stop()``."""

    def __init__(
        self, nvml: Nvml, pids: Callable[[], set[int]] | None = None, period: float = 0.1
    ) -> None:
        self._nvml = nvml
        self._pids = pids
        self._period = period
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._util: list[int] = []
        self._mem_util: list[int] = []
        self._device_mib: list[float] = []
        self._server_mib: list[float] = []

    def start(self) -> None:
        if not self._nvml.available:
            return
        self._thread = threading.Thread(target=self._loop, name="nvml-sampler", daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        pids: set[int] = set()
        refreshed = 0.0
        while not self._stop.is_set():
            util = self._nvml.utilization()
            if util is not None:
                self._util.append(util[0])
                self._mem_util.append(util[1])
            used = self._nvml.device_used_mib()
            if used is not None:
                self._device_mib.append(used)
            if self._pids is not None:
                now = time.monotonic()
                if now - refreshed > 1.0:  # a /proc scan per second is plenty
                    pids, refreshed = self._pids(), now
                mib = self._nvml.process_mib(pids)
                if mib is not None:
                    self._server_mib.append(mib)
            self._stop.wait(self._period)

    def stop(self) -> dict[str, Any]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

        def mean(values: list[int]) -> float | None:
            return round(statistics.fmean(values), 1) if values else None

        return {
            "gpu_util_mean": mean(self._util),
            "gpu_util_max": max(self._util, default=None),
            "mem_util_mean": mean(self._mem_util),
            "device_used_max_mib": max(self._device_mib, default=None),
            "server_gpu_mib_max": max(self._server_mib, default=None),
            "samples": len(self._util),
        }
