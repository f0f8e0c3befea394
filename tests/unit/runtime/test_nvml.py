"""NVML readings, against a stand-in pynvml module (this machine has no NVIDIA driver); the real
one is read in tests/gpu."""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any

import pytest

from infermux.runtime.nvml import GpuReading, Nvml


class FakeError(Exception):
    pass


@dataclass
class Memory:
    used: int
    total: int


@dataclass
class Utilization:
    gpu: int


@dataclass
class Process:
    pid: int
    usedGpuMemory: int | None


def fake_pynvml(count: int = 2, power: bool = True) -> Any:
    module: Any = types.ModuleType("pynvml")
    module.NVMLError = FakeError
    module.nvmlInit = lambda: None
    module.nvmlDeviceGetCount = lambda: count
    module.nvmlDeviceGetHandleByIndex = lambda i: i
    module.nvmlDeviceGetMemoryInfo = lambda h: Memory(used=(h + 1) << 30, total=80 << 30)
    module.nvmlDeviceGetUUID = lambda h: f"GPU-{h}"
    module.nvmlDeviceGetName = lambda h: b"NVIDIA H200"  # old pynvml returned bytes

    def get_power(handle: int) -> int:
        if not power:
            raise FakeError("not supported")
        return 250_500  # milliwatts

    module.nvmlDeviceGetPowerUsage = get_power
    module.nvmlDeviceGetUtilizationRates = lambda h: Utilization(gpu=90 + h)
    module.nvmlDeviceGetComputeRunningProcesses = lambda h: [
        Process(pid=42, usedGpuMemory=(h + 1) * 1000),
        Process(pid=7, usedGpuMemory=None),
    ]
    return module


@pytest.fixture
def installed(monkeypatch: pytest.MonkeyPatch) -> Any:
    module = fake_pynvml()
    monkeypatch.setitem(sys.modules, "pynvml", module)
    return module


def test_readings_of_every_gpu(installed: Any) -> None:
    nvml = Nvml()
    assert nvml.available
    assert nvml.read() == [
        GpuReading(0, "GPU-0", "NVIDIA H200", 0.90, 1 << 30, 80 << 30, 250.5),
        GpuReading(1, "GPU-1", "NVIDIA H200", 0.91, 2 << 30, 80 << 30, 250.5),
    ]
    assert nvml.process_memory(42) == 3000
    assert nvml.process_memory(7) == 0


def test_a_gpu_without_power_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", fake_pynvml(count=1, power=False))
    (reading,) = Nvml().read()
    assert reading.power_watts is None


def test_without_a_driver_there_are_no_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    module = fake_pynvml()

    def fail() -> None:
        raise FakeError("NVML Shared Library Not Found")

    module.nvmlInit = fail
    monkeypatch.setitem(sys.modules, "pynvml", module)
    nvml = Nvml()
    assert not nvml.available
    assert nvml.read() == []
    assert nvml.process_memory(1) == 0


def test_without_the_package_there_are_no_readings(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # makes the import fail
    assert Nvml().read() == []
