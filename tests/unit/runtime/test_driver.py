"""The ctypes driver binding on a machine that may have no CUDA driver."""

from __future__ import annotations

import ctypes
from typing import Any

import pytest

from infermux.runtime.driver import Driver


def test_allocation_end_is_none_without_a_driver(monkeypatch: pytest.MonkeyPatch) -> None:
    """No libcuda: the caller falls back to the runtime's path, which says why it cannot."""

    def missing(name: str, *args: object, **kwargs: object) -> ctypes.CDLL:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(ctypes, "CDLL", missing)
    assert Driver().allocation_end(0x1000) is None


def test_allocation_end_is_none_when_the_driver_refuses() -> None:
    """A driver error (no current context, a pointer in no allocation) is not an answer."""

    class Refusing:
        @staticmethod
        def cuMemGetAddressRange_v2(base: Any, size: Any, pointer: int) -> int:
            return 201  # CUDA_ERROR_INVALID_CONTEXT

    driver = Driver()
    driver._cuda = Refusing()
    assert driver.allocation_end(0x1000) is None


def test_allocation_end_is_base_plus_size() -> None:
    class Answering:
        @staticmethod
        def cuMemGetAddressRange_v2(base: Any, size: Any, pointer: int) -> int:
            ctypes.cast(base, ctypes.POINTER(ctypes.c_uint64))[0] = 0x1000
            ctypes.cast(size, ctypes.POINTER(ctypes.c_size_t))[0] = 3000
            return 0

    driver = Driver()
    driver._cuda = Answering()
    assert driver.allocation_end(0x1000 + 1000) == 0x1000 + 3000
