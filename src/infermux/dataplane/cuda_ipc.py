"""The CUDA calls behind client CUDA shared memory: IPC handles opened and closed, the size of
the allocation a pointer lies in, and the host copies for backends that read host memory.

:class:`CudaIpc` is what :class:`~infermux.dataplane.cuda_shared_memory.CudaSharedMemoryRegistry`
needs; :class:`CudaRuntime` provides it over NVIDIA's ``cuda-python`` bindings (the ``gpu``
extra), imported when the first region is registered. Tests without a GPU give the registry a
stand-in instead.
"""

from __future__ import annotations

import ctypes
import importlib
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from infermux.errors import UnsupportedError

IPC_HANDLE_SIZE = 64  # CUDA_IPC_HANDLE_SIZE


class CudaCallError(Exception):
    """A CUDA runtime call failed; the message names the call and CUDA's error."""


class CudaIpc(Protocol):
    """The CUDA calls the registry makes (a stand-in replaces it in tests without a GPU)."""

    def open(self, handle: bytes, device_id: int) -> int:
        """Map a peer's allocation; returns its device pointer in this process."""
        ...

    def close(self, pointer: int, device_id: int) -> None: ...

    def allocation_size(self, pointer: int, device_id: int) -> int:
        """Bytes of the allocation ``pointer`` lies in, from ``pointer`` to its end (what the
        driver says, not what the client claimed); raises :class:`CudaCallError` when
        ``pointer`` is in no allocation any more."""
        ...

    def to_host(self, pointer: int, target: npt.NDArray[np.generic], device_id: int) -> None:
        """Copy ``target.nbytes`` bytes from the device into the host array ``target``."""
        ...

    def from_host(self, pointer: int, data: bytes, device_id: int) -> None: ...


class CudaRuntime:
    """:class:`CudaIpc` over ``cuda.bindings.runtime`` (cuda-python)."""

    def __init__(self) -> None:
        try:
            import cuda.bindings.runtime as cudart
        except ImportError as exc:
            raise UnsupportedError(
                "CUDA shared memory needs NVIDIA's cuda-python bindings: "
                "pip install 'infermux[gpu]'"
            ) from exc
        self._rt: Any = cudart
        self._driver: Any = importlib.import_module("cuda.bindings.driver")  # same package
        try:
            count = self._call("cudaGetDeviceCount")
        except CudaCallError as exc:
            raise UnsupportedError(f"CUDA shared memory needs a GPU: {exc}") from None
        if not count:
            raise UnsupportedError("CUDA shared memory needs a GPU, and CUDA sees none")
        self.device_count = int(count)

    def _call(self, function: str, *args: Any) -> Any:
        result = getattr(self._rt, function)(*args)
        error, values = result[0], result[1:]
        if error != self._rt.cudaError_t.cudaSuccess:
            _, name = self._rt.cudaGetErrorName(error)
            raise CudaCallError(f"{function} failed: {name.decode()}")
        return values[0] if len(values) == 1 else None

    def open(self, handle: bytes, device_id: int) -> int:
        self._call("cudaSetDevice", device_id)
        ipc_handle = self._rt.cudaIpcMemHandle_t()
        # cuda-bindings 13 exposes the handle only through the address of its 64-byte struct.
        ctypes.memmove(ipc_handle.getPtr(), handle, IPC_HANDLE_SIZE)
        flags = self._rt.cudaIpcMemLazyEnablePeerAccess
        return int(self._call("cudaIpcOpenMemHandle", ipc_handle, flags))

    def close(self, pointer: int, device_id: int) -> None:
        self._call("cudaSetDevice", device_id)
        self._call("cudaIpcCloseMemHandle", pointer)

    def allocation_size(self, pointer: int, device_id: int) -> int:
        self._call("cudaSetDevice", device_id)  # makes the device's primary context current
        error, base, size = self._driver.cuMemGetAddressRange(pointer)
        if error != self._driver.CUresult.CUDA_SUCCESS:
            _, name = self._driver.cuGetErrorName(error)
            raise CudaCallError(f"cuMemGetAddressRange failed: {name.decode()}")
        return int(base) + int(size) - pointer

    def to_host(self, pointer: int, target: npt.NDArray[np.generic], device_id: int) -> None:
        self._call("cudaSetDevice", device_id)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyDeviceToHost
        self._call("cudaMemcpy", target.ctypes.data, pointer, target.nbytes, kind)

    def from_host(self, pointer: int, data: bytes, device_id: int) -> None:
        self._call("cudaSetDevice", device_id)
        source = np.frombuffer(data, dtype=np.uint8)
        kind = self._rt.cudaMemcpyKind.cudaMemcpyHostToDevice
        self._call("cudaMemcpy", pointer, source.ctypes.data, len(data), kind)
