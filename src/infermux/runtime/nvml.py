"""GPU readings from NVML (``nvidia-ml-py``): utilisation, memory, power, per GPU.

What the driver sees, for every process on the GPU, unlike torch's allocator statistics, which
see only this process's tensors. The metrics layer publishes these labelled by GPU UUID, as
Triton does. Without ``nvidia-ml-py`` or without an NVIDIA driver there are no readings (an empty
list), never an error: a CPU-only server has no GPUs to report.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from typing import Any

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class GpuReading:
    """One GPU at one instant. ``utilization`` is the fraction (0..1) of the last sample period
    in which a kernel ran; ``power_watts`` is None where the GPU does not report power."""

    index: int
    uuid: str
    name: str
    utilization: float
    memory_used_bytes: int
    memory_total_bytes: int
    power_watts: float | None


class Nvml:
    """A lazily initialised NVML session; :meth:`read` is thread-safe and cheap (~µs per GPU)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._nvml: Any = None
        self._failed = False

    def _session(self) -> Any:
        with self._lock:
            if self._nvml is None and not self._failed:
                try:
                    import pynvml

                    pynvml.nvmlInit()
                    self._nvml = pynvml
                except Exception as exc:  # no package, no driver, no GPU: no readings
                    self._failed = True
                    logger.debug("NVML is unavailable: %s", exc)
            return self._nvml

    @property
    def available(self) -> bool:
        return self._session() is not None

    def read(self) -> list[GpuReading]:
        """A reading of every GPU the driver shows ([] without NVML)."""
        nvml = self._session()
        if nvml is None:
            return []
        readings = []
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            memory = nvml.nvmlDeviceGetMemoryInfo(handle)
            try:
                power: float | None = nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0  # mW
            except nvml.NVMLError:
                power = None
            readings.append(
                GpuReading(
                    index=index,
                    uuid=_text(nvml.nvmlDeviceGetUUID(handle)),
                    name=_text(nvml.nvmlDeviceGetName(handle)),
                    utilization=nvml.nvmlDeviceGetUtilizationRates(handle).gpu / 100.0,
                    memory_used_bytes=int(memory.used),
                    memory_total_bytes=int(memory.total),
                    power_watts=power,
                )
            )
        return readings

    def process_memory(self, pid: int) -> int:
        """GPU memory the driver accounts to process ``pid``, over every GPU (0 without NVML)."""
        nvml = self._session()
        if nvml is None:
            return 0
        total = 0
        for index in range(nvml.nvmlDeviceGetCount()):
            handle = nvml.nvmlDeviceGetHandleByIndex(index)
            for process in nvml.nvmlDeviceGetComputeRunningProcesses(handle):
                if process.pid == pid and process.usedGpuMemory is not None:
                    total += int(process.usedGpuMemory)
        return total


def _text(value: str | bytes) -> str:
    # nvidia-ml-py returns str; older pynvml releases returned bytes.
    return value.decode() if isinstance(value, bytes) else value


NVML = Nvml()
"""The process's NVML session."""
