"""The gather kernel's wrapper on the CPU, against a stand-in driver: what one launch carries
(its by-value table, its grid), launches split at MAX_COPIES, the driver's copies where the
kernel cannot be had, and the kernel's source through NVRTC where cuda-python is installed. The
kernel itself runs in ``tests/gpu/test_driver_gpu.py``."""

from __future__ import annotations

import ctypes
import logging
from typing import Any

import pytest

from infermux.runtime import gather_kernel
from infermux.runtime.driver import Copy, DriverError
from infermux.runtime.gather_kernel import MAX_COPIES, GatherKernel


class Driver:
    """Records module loads, launches (with the table as the kernel would read it) and copies."""

    def __init__(self, load_error: Exception | None = None) -> None:
        self.loads: list[tuple[bytes, bytes]] = []
        self.launches: list[dict[str, Any]] = []
        self.copies: list[tuple[list[Copy], int]] = []
        self.load_error = load_error

    def load_function(self, image: bytes, name: bytes) -> int:
        if self.load_error is not None:
            raise self.load_error
        self.loads.append((image, name))
        return 0xF00

    def launch_kernel(
        self, function: int, grid: Any, block: Any, parameter: Any, stream: int
    ) -> None:
        raw = ctypes.string_at(ctypes.addressof(parameter), ctypes.sizeof(parameter))
        table = gather_kernel._Table.from_buffer_copy(raw)  # the bytes the kernel receives
        count = table.count
        self.launches.append(
            {
                "function": function,
                "grid": grid,
                "block": block,
                "stream": stream,
                "copies": list(
                    zip(table.dst[:count], table.src[:count], table.size[:count], strict=True)
                ),
            }
        )

    def copy(self, copies: Any, stream: int) -> None:
        self.copies.append((list(copies), stream))


@pytest.fixture
def ptx(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    compiled: list[int] = []

    def compile_ptx() -> bytes:
        compiled.append(1)
        return b"PTX"

    monkeypatch.setattr(gather_kernel, "compile_ptx", compile_ptx)
    return compiled


def copies(count: int, size: int = 1024) -> list[Copy]:
    return [(1 << 40 | i * size, 2 << 40 | i * size, size) for i in range(count)]


def test_a_batch_is_one_launch_carrying_every_copy(ptx: list[int]) -> None:
    driver = Driver()
    kernel = GatherKernel(driver)  # type: ignore[arg-type]
    batch = [*copies(46), (5, 7, 100_000)]
    kernel.copy(batch, 9, 0)
    (launch,) = driver.launches
    assert launch["copies"] == batch
    # One row of blocks per copy; enough blocks for the largest at 16 bytes per thread step.
    assert launch["grid"] == (-(-100_000 // (256 * 16)), 47, 1)
    assert (launch["function"], launch["block"], launch["stream"]) == (0xF00, (256, 1, 1), 9)
    assert driver.loads == [(b"PTX", b"infermux_gather")]
    assert driver.copies == []


def test_a_large_copy_gets_at_most_64_blocks(ptx: list[int]) -> None:
    driver = Driver()
    GatherKernel(driver).copy([*copies(1), (5, 7, 10**8)], 0, 0)  # type: ignore[arg-type]
    assert driver.launches[0]["grid"] == (64, 2, 1)


def test_more_copies_than_a_launch_carries_split(ptx: list[int]) -> None:
    driver = Driver()
    kernel = GatherKernel(driver)  # type: ignore[arg-type]
    batch = copies(MAX_COPIES + 5)
    kernel.copy(batch, 1, 0)
    assert [len(launch["copies"]) for launch in driver.launches] == [MAX_COPIES, 5]
    assert [c for launch in driver.launches for c in launch["copies"]] == batch
    assert [launch["grid"] for launch in driver.launches] == [(1, MAX_COPIES, 1), (1, 5, 1)]


def test_the_kernel_is_compiled_once_and_loaded_once_per_device(ptx: list[int]) -> None:
    driver = Driver()
    kernel = GatherKernel(driver)  # type: ignore[arg-type]
    for device in (0, 1, 0, 1):
        kernel.copy(copies(2), 0, device)
    assert len(ptx) == 1
    assert len(driver.loads) == 2
    assert len(driver.launches) == 4


def test_one_copy_goes_to_the_driver(ptx: list[int]) -> None:
    driver = Driver()
    GatherKernel(driver).copy(copies(1), 3, 0)  # type: ignore[arg-type]
    assert driver.copies == [(copies(1), 3)]
    assert driver.launches == []
    assert ptx == []


@pytest.mark.parametrize(
    "error",
    [DriverError("cuModuleLoadData failed with CUDA error 222"), OSError("no libcuda.so.1")],
)
def test_without_the_kernel_the_driver_copies_and_says_why(
    ptx: list[int], error: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    driver = Driver(load_error=error)
    kernel = GatherKernel(driver)  # type: ignore[arg-type]
    with caplog.at_level(logging.INFO, logger="infermux.runtime.gather_kernel"):
        kernel.copy(copies(3), 4, 0)
        kernel.copy(copies(2), 4, 1)  # not tried again on another device either
    assert driver.copies == [(copies(3), 4), (copies(2), 4)]
    assert kernel.unavailable == str(error)
    assert [r.getMessage() for r in caplog.records] == [
        f"no gather kernel: device copies go to the driver: {error}"
    ]


def test_without_nvrtc_the_driver_copies(monkeypatch: pytest.MonkeyPatch) -> None:
    def compile_ptx() -> bytes:
        raise RuntimeError("NVRTC is not installed (cuda-python): no module named 'cuda'")

    monkeypatch.setattr(gather_kernel, "compile_ptx", compile_ptx)
    driver = Driver()
    kernel = GatherKernel(driver)  # type: ignore[arg-type]
    kernel.copy(copies(2), 0, 0)
    assert driver.copies == [(copies(2), 0)]
    assert "NVRTC is not installed" in kernel.unavailable


def test_the_source_compiles_and_takes_the_table_ctypes_lays_out() -> None:
    pytest.importorskip("cuda.bindings.nvrtc")
    try:
        ptx = gather_kernel.compile_ptx()
    except RuntimeError as exc:  # cuda-python without libnvrtc
        pytest.skip(str(exc))
    text = ptx.decode()
    assert ".entry infermux_gather(" in text
    size = ctypes.sizeof(gather_kernel._Table)
    assert size == 3 * MAX_COPIES * 8 + 8  # three columns and the count, 8-byte aligned
    assert f"infermux_gather_param_0[{size}]" in text
