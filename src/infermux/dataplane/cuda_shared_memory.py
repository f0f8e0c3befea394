"""CUDA shared memory (Triton's extension): client GPU buffers shared through CUDA IPC handles.

A client on the same host allocates GPU memory, exports it with ``cudaIpcGetMemHandle`` and
registers the 64-byte handle with a device id and a size; infermux opens it once
(``cudaIpcOpenMemHandle``). An input placed in such a region reaches a backend that reads GPU
memory (PyTorch) as a :class:`~infermux.types.DeviceArray`, gathered device to device into the
instance's buffers, so an image never travels through host memory. Other backends, and BYTES or
BOOL inputs (whose contents must be parsed or checked on the host), get a host copy. Outputs of a
micro-batch that a CUDA graph runs are copied device to device into their regions by the batch
itself (:meth:`CudaSharedMemoryRegistry.destinations`); other outputs are computed into pinned host
memory and copied host to device into the region. The size a
client registers is held to the allocation the driver says the handle maps
(``cuMemGetAddressRange``), at registration and before every copy (a micro-batch's requests
share one query per region). A micro-batch's slices of one input or output are checked in one
pass (``device_views``, ``destinations``); any doubt sends them through the general path, one
by one, which names what is wrong.

CUDA is reached through NVIDIA's ``cuda-python`` bindings (the ``gpu`` extra, ``cuda_ipc.py``),
imported when the first region is registered; without them, or without a GPU, registration
fails with the reason.
"""

from __future__ import annotations

import contextlib
import math
import threading
import weakref
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.errors import (
    ErrorCode,
    InfermuxError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from infermux.tensor_bytes import tensor_from_bytes, tensor_to_bytes
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    CudaSharedMemoryRegion,
    DeviceArray,
    Parameters,
    Tensor,
    numpy_dtype,
)

from .cuda_ipc import IPC_HANDLE_SIZE, CudaCallError, CudaIpc, CudaRuntime
from .shared_memory import (
    DEFAULT_MAX_REGIONS,
    check_bounds,
    check_fixed_size,
    check_region_count,
    placed,
    shm_reference,
)

DISABLED = "CUDA shared memory is disabled: start infermux serve with --allow-client-shm to use it"

# Read on the device only where the bytes need no host-side parsing or checking.
_HOST_ONLY = ("BYTES", "BOOL")
_PLAIN_REFERENCE = frozenset((SHM_REGION, SHM_OFFSET, SHM_BYTE_SIZE))

AllocationSizes = dict[int, int]
"""The sizes of the CUDA allocations behind regions, by the region's mapped pointer, as the
driver reported them for one micro-batch's reads: its requests' slices of one region are held to
one answer (``CudaSharedMemoryRegistry._check_allocation``)."""


class _Region:
    """An opened region. Arrays read from it hold it; the handle is closed when the region is
    unregistered *and* no array in flight refers to it any more."""

    def __init__(self, info: CudaSharedMemoryRegion, pointer: int, ipc: CudaIpc) -> None:
        self.info = info
        self.pointer = pointer
        self.closer = weakref.finalize(self, ipc.close, pointer, info.device_id)


class CudaSharedMemoryRegistry:
    """The CUDA regions clients registered, by name."""

    def __init__(
        self,
        *,
        enabled: bool,
        ipc: Callable[[], CudaIpc] = CudaRuntime,
        max_regions: int = DEFAULT_MAX_REGIONS,
    ) -> None:
        self.enabled = enabled
        self.max_regions = max_regions
        self._make_ipc = ipc
        self._ipc: CudaIpc | None = None
        self._lock = threading.Lock()
        self._regions: dict[str, _Region] = {}

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise UnsupportedError(DISABLED)

    def _runtime(self) -> CudaIpc:
        ipc = self._ipc  # set once: the lock only guards its creation
        if ipc is not None:
            return ipc
        with self._lock:
            if self._ipc is None:
                self._ipc = self._make_ipc()
            return self._ipc

    def has(self, name: str) -> bool:
        return name in self._regions

    def register(self, name: str, raw_handle: bytes, device_id: int, byte_size: int) -> None:
        """Open the allocation ``raw_handle`` exports on GPU ``device_id`` as region ``name``."""
        self._check_enabled()
        if not name:
            raise InvalidArgumentError("CUDA shared memory region 'name' must not be empty")
        if name in self._regions:
            raise InfermuxError(
                f"shared memory region '{name}' is already registered", ErrorCode.ALREADY_EXISTS
            )
        check_region_count(name, len(self._regions), self.max_regions)
        if len(raw_handle) != IPC_HANDLE_SIZE:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': 'raw_handle' must be the "
                f"{IPC_HANDLE_SIZE} bytes of a cudaIpcMemHandle_t, got {len(raw_handle)} bytes"
            )
        if device_id < 0 or byte_size <= 0:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': 'device_id' must be >= 0 and 'byte_size' "
                f"> 0, got device_id {device_id} and byte_size {byte_size}"
            )
        ipc = self._runtime()
        count = getattr(ipc, "device_count", None)
        if count is not None and device_id >= count:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': 'device_id' {device_id} does not exist "
                f"(CUDA sees {count} device(s))"
            )
        try:
            pointer = ipc.open(raw_handle, device_id)
        except CudaCallError as exc:
            raise InvalidArgumentError(
                f"CUDA shared memory region '{name}': cannot open the IPC handle on device "
                f"{device_id}: {exc}"
            ) from None
        # byte_size is the client's claim; the driver knows what the handle really maps.
        try:
            available = ipc.allocation_size(pointer, device_id)
        except CudaCallError as exc:
            available, problem = 0, f"cannot size the allocation the handle maps: {exc}"
        else:
            problem = (
                f"byte_size {byte_size} exceeds the {available} bytes of the CUDA allocation "
                "the handle exports"
            )
        if byte_size > available:
            with contextlib.suppress(CudaCallError):
                ipc.close(pointer, device_id)
            raise InvalidArgumentError(f"CUDA shared memory region '{name}': {problem}")
        info = CudaSharedMemoryRegion(name, device_id, byte_size)
        self._regions[name] = _Region(info, pointer, ipc)

    def unregister(self, name: str = "") -> None:
        """Forget region ``name`` (every region when ``name`` is "")."""
        self._check_enabled()
        if name and name not in self._regions:
            raise NotFoundError(f"CUDA shared memory region '{name}' is not registered")
        for key in [name] if name else list(self._regions):
            del self._regions[key]  # closed once no request in flight holds it

    def status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        self._check_enabled()
        if name:
            if name not in self._regions:
                raise NotFoundError(f"CUDA shared memory region '{name}' is not registered")
            return [self._regions[name].info]
        return [r.info for r in self._regions.values()]

    def close(self) -> None:
        """Close every handle now (server shutdown: nothing is in flight any more)."""
        regions = list(self._regions.values())
        self._regions.clear()
        for region in regions:
            region.closer()

    def read(
        self, tensor: Tensor, *, on_device: bool, sizes: AllocationSizes | None = None
    ) -> DeviceArray | npt.NDArray[np.generic]:
        """An input placed in a CUDA region: a device view when ``on_device`` (and the datatype
        allows), else a host copy. ``sizes``: the allocation sizes already asked for the
        micro-batch this input is read for."""
        what = f"input '{tensor.name}'"
        region, start, size = self._slice(what, tensor.parameters, sizes)
        if on_device and tensor.datatype not in _HOST_ONLY:
            check_fixed_size(what, tensor, size)
            dtype = numpy_dtype(tensor.datatype)
            return DeviceArray(start, tensor.shape, dtype, region.info.device_id, region)
        raw = np.empty(size, dtype=np.uint8)
        try:
            self._runtime().to_host(start, raw, region.info.device_id)
        except CudaCallError as exc:
            raise InternalError(f"{what}: cannot read region '{region.info.name}': {exc}") from None
        return tensor_from_bytes(tensor.name, tensor.datatype, tensor.shape, raw.tobytes())

    def device_views(
        self, tensors: Sequence[Tensor], sizes: AllocationSizes
    ) -> tuple[DeviceArray, ...] | None:
        """One input of a micro-batch, every request's rows as a device view, when each slice
        is plainly valid: what :meth:`read` with ``on_device`` gives one by one, with the same
        checks made inline in one pass. None when any is not (a region of another kind or
        none, a host-only datatype, a bad reference or size, a slice out of bounds):
        :meth:`read` then takes them one by one and names what is wrong.

        Why a second path: the general one spent ~5 µs of the executor's loop per slice on
        references, bounds and views, the largest per-request cost over CUDA shm
        (``docs/benchmarks.md``, *The CUDA-shm executor path, profiled again*)."""
        datatype = tensors[0].datatype
        dtype = self._device_dtype(datatype)
        if dtype is None:
            return None
        itemsize = dtype.itemsize
        views = []
        for tensor in tensors:
            parameters = tensor.parameters
            place = self._place(parameters, sizes)
            if place is None or tensor.datatype != datatype:
                return None
            region, offset, size = place
            if size != math.prod(tensor.shape) * itemsize:
                return None
            info = region.info
            views.append(
                DeviceArray(region.pointer + offset, tensor.shape, dtype, info.device_id, region)
            )
        return tuple(views)

    def destinations(
        self,
        datatype: str,
        row: tuple[int, ...],
        places: Sequence[Parameters],
        rows: Sequence[int],
        sizes: AllocationSizes,
    ) -> tuple[DeviceArray, ...] | None:
        """Where one output of a micro-batch goes, request by request (``rows[i]`` rows of
        shape ``row`` at ``places[i]``), as device views a GPU backend may copy into; the
        slices checked as :meth:`write` checks them. None unless every place is a plain
        reference (region, offset, byte size, nothing else) to room enough in a CUDA region
        and the datatype has device bytes: the output then goes through the host, where
        :meth:`write` names what is wrong."""
        dtype = self._device_dtype(datatype)
        if dtype is None:
            return None
        row_bytes = math.prod(row) * dtype.itemsize
        views = []
        for parameters, count in zip(places, rows, strict=True):
            if not _PLAIN_REFERENCE.issuperset(parameters):
                return None  # more than a place (e.g. classification): the host path
            place = self._place(parameters, sizes)
            if place is None:
                return None
            region, offset, size = place
            if size < count * row_bytes:
                return None
            info = region.info
            views.append(
                DeviceArray(region.pointer + offset, (count, *row), dtype, info.device_id, region)
            )
        return tuple(views)

    def _device_dtype(self, datatype: str) -> np.dtype[Any] | None:
        """The dtype of ``datatype`` when its bytes may stay on the device (None: not)."""
        if not self.enabled or datatype in _HOST_ONLY:
            return None
        try:
            return numpy_dtype(datatype)
        except InfermuxError:
            return None

    def _place(
        self, parameters: Parameters, sizes: AllocationSizes
    ) -> tuple[_Region, int, int] | None:
        """:meth:`_slice`'s checks made inline, None for any slice it would refuse."""
        name = parameters.get(SHM_REGION)
        region = self._regions.get(name) if type(name) is str else None
        offset = parameters.get(SHM_OFFSET, 0)
        size = parameters.get(SHM_BYTE_SIZE)
        # type() is not isinstance(): a bool is no offset or size, as shm_reference says.
        if region is None or type(offset) is not int or type(size) is not int:
            return None
        if offset < 0 or size < 0 or offset + size > region.info.byte_size:
            return None
        try:  # answered from ``sizes`` after the micro-batch's first slice of the region
            self._check_allocation("", region, offset, size, sizes)
        except InfermuxError:
            return None
        return region, offset, size

    def write(self, tensor: Tensor, parameters: Parameters) -> Tensor:
        """Copy an output into the CUDA region its parameters name."""
        what = f"output '{tensor.name}'"
        region, start, size = self._slice(what, parameters)
        raw = tensor_to_bytes(tensor.datatype, tensor.data)
        if len(raw) > size:
            raise InvalidArgumentError(
                f"{what} needs {len(raw)} bytes but its shared memory byte size is {size}"
            )
        try:
            self._runtime().from_host(start, raw, region.info.device_id)
        except CudaCallError as exc:
            raise InternalError(
                f"{what}: cannot write region '{region.info.name}': {exc}"
            ) from None
        return placed(tensor, parameters, len(raw))

    def _slice(
        self, what: str, parameters: Parameters, sizes: AllocationSizes | None = None
    ) -> tuple[_Region, int, int]:
        self._check_enabled()
        name, offset, size = shm_reference(what, parameters)
        region = self._regions.get(name)
        if region is None:
            raise InvalidArgumentError(f"{what}: shared memory region '{name}' is not registered")
        check_bounds(what, name, offset, size, region.info.byte_size)
        self._check_allocation(what, region, offset, size, sizes)
        return region, region.pointer + offset, size

    def _check_allocation(
        self,
        what: str,
        region: _Region,
        offset: int,
        size: int,
        sizes: AllocationSizes | None,
    ) -> None:
        """Refuse a slice past the end of the allocation the handle maps, as the driver reports
        it before this copy (or device view). Registration already held the client's byte_size
        to it, and an allocation cannot shrink (one its owner frees stays mapped here until the
        handle is closed: seen on an H200, driver 580); asking again costs about 2 µs and means
        no copy rests on a check made elsewhere. A copy past the real end is an illegal
        address, which poisons the CUDA context of every model on the device.

        A micro-batch's requests share one answer per region (``sizes``): perf_analyzer's
        requests all name the same few regions, and each answer costs ~2.5 µs of the
        executor's loop (``docs/benchmarks.md``, *CUDA shm size check*)."""
        name = region.info.name
        available = sizes.get(region.pointer) if sizes is not None else None
        if available is None:
            try:
                available = self._runtime().allocation_size(region.pointer, region.info.device_id)
            except CudaCallError as exc:
                raise InvalidArgumentError(
                    f"{what}: shared memory region '{name}' maps no CUDA allocation any more: {exc}"
                ) from None
            if sizes is not None:
                sizes[region.pointer] = available
        if offset + size > available:
            raise InvalidArgumentError(
                f"{what}: offset {offset} + byte size {size} is past the end of the CUDA "
                f"allocation of {available} bytes that region '{name}' maps"
            )
