"""``Driver.copy`` on the CPU, against a stand-in for ``libcuda``: the batch's copies reach the
driver as three arrays in one call (CUDA 13's and 12.8's batched copy), or one call per copy where
the driver has no batched copy. The real driver runs in ``tests/gpu/test_driver_gpu.py``."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from infermux.runtime.driver import Copy, Driver, DriverError, gathered

COPIES: list[Copy] = [(1 << 40, 2 << 40, 4096), ((1 << 40) + 4096, 3 << 40, 512), (7, 9, 1)]


def _read(address: int, count: int) -> list[int]:
    return list((ctypes.c_uint64 * count).from_address(address))


class Library:
    """What ``Driver`` binds, recording the calls; ``batch`` names the batched copy it has."""

    def __init__(self, batch: str = "", result: int = 0) -> None:
        self.calls: list[tuple[str, Any]] = []
        self.result = result
        if batch:
            setattr(self, batch, self._batched(batch))

    def _batched(self, name: str) -> Any:
        def call(*args: Any) -> int:
            dsts, srcs, sizes, count, attrs, attr_index, num_attrs, *rest = args
            attributes = ctypes.cast(attrs, ctypes.POINTER(ctypes.c_int))
            columns = (_read(address, count) for address in (dsts, srcs, sizes))
            self.calls.append(
                (
                    name,
                    {
                        "copies": list(zip(*columns, strict=True)),
                        "order": attributes[0],
                        "attribute_index": _read(attr_index, 1),
                        "attributes": num_attrs,
                        "stream": rest[-1],
                        "fail_index": len(rest) == 2,
                    },
                )
            )
            return self.result

        return call

    def cuMemcpyAsync(self, target: int, source: int, size: int, stream: int) -> int:
        self.calls.append(("cuMemcpyAsync", (target, source, size, stream)))
        return self.result


def driver(library: Library) -> Driver:
    made = Driver()
    made._bind_batch(library)
    made._cuda = library  # bound: bind() returns it
    return made


@pytest.mark.parametrize("name", ["cuMemcpyBatchAsync_v2", "cuMemcpyBatchAsync"])
def test_a_batch_of_copies_is_one_driver_call(name: str) -> None:
    library = Library(name)
    made = driver(library)
    assert made.batch_copies == name
    made.copy(COPIES, 77)
    assert library.calls == [
        (
            name,
            {
                "copies": COPIES,
                "order": 1,  # CU_MEMCPY_SRC_ACCESS_ORDER_STREAM
                "attribute_index": [0],
                "attributes": 1,
                "stream": 77,
                "fail_index": name == "cuMemcpyBatchAsync",  # 12.8's signature has it
            },
        )
    ]


def test_cuda_13s_batched_copy_is_preferred() -> None:
    library = Library("cuMemcpyBatchAsync")
    library.cuMemcpyBatchAsync_v2 = library._batched("cuMemcpyBatchAsync_v2")  # type: ignore[attr-defined]
    assert driver(library).batch_copies == "cuMemcpyBatchAsync_v2"


def test_without_a_batched_copy_each_copy_is_its_own_call() -> None:
    library = Library()
    made = driver(library)
    assert made.batch_copies == ""
    made.copy(COPIES, 5)
    assert library.calls == [("cuMemcpyAsync", (*copy, 5)) for copy in COPIES]


def test_one_copy_or_none_skips_the_batch() -> None:
    library = Library("cuMemcpyBatchAsync_v2")
    made = driver(library)
    made.copy([], 5)
    made.copy(COPIES[:1], 5)
    assert library.calls == [("cuMemcpyAsync", (*COPIES[0], 5))]


def test_gathered_lays_the_parts_one_after_the_other() -> None:
    assert gathered(1000, [(50, 8), (70, 16), (90, 4)]) == [
        (1000, 50, 8),
        (1008, 70, 16),
        (1024, 90, 4),
    ]


@pytest.mark.parametrize("batch", ["cuMemcpyBatchAsync_v2", ""])
def test_a_refused_copy_names_the_call_and_the_error(batch: str) -> None:
    made = driver(Library(batch, result=700))
    with pytest.raises(DriverError, match=f"{batch or 'cuMemcpyAsync'} failed with CUDA error 700"):
        made.copy(COPIES, 0)
