"""System shared memory (Triton's extension): client-registered POSIX shm regions.

A region's shm object is opened once, at registration, and its descriptor kept. Inputs are
copied out of it with ``pread`` and outputs written into it with ``pwrite``; nothing is mapped.
The client owns the object and may ``ftruncate`` it at any time: a mapping's pages past the new
end raise SIGBUS when touched, which kills the process (the server, or with ``--frontends`` > 1
the executor and every registration with it), and no check before the access can close that
window. A read of a shrunk file just comes back short. So every access checks the object's
size (``fstat``) first and answers INVALID_ARGUMENT naming the region when the bytes asked for
are no longer there, and a read that still comes back short (truncated in between) is refused
the same way. The copy costs one ``memcpy`` of the input (docs/decisions.md); it goes into a
block of a staging arena that a GPU instance copies to the device directly, so it is the only
host copy an input makes.

Every name, offset and size is checked against the region before any byte is touched.
"""

from __future__ import annotations

import contextlib
import os
import re
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from infermux.errors import (
    ErrorCode,
    InfermuxError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from infermux.ipc.arena import Arena, Block
from infermux.runtime.host_memory import HOST_MEMORY
from infermux.tensor_bytes import tensor_from_bytes, tensor_to_bytes
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    Parameters,
    SharedMemoryRegion,
    Tensor,
    element_count,
    non_negative_int,
    numpy_dtype,
)

try:  # CPython's own binding of shm_open, as used by multiprocessing.shared_memory
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

# POSIX: one leading slash, then up to NAME_MAX characters without further slashes.
_KEY = re.compile(r"^/?[^/\x00]{1,255}$")
DEFAULT_MAX_REGIONS = 256
STAGING_BYTES = 128 * 1024 * 1024
"""The staging arena inputs are read into: reused in a ring, so a read faults in no fresh pages,
and offered to the GPU path (``runtime.host_memory``), which copies the rows to the device from
there. An input that does not fit at the moment is read into fresh memory instead."""

DISABLED = (
    "system shared memory is disabled: start infermux serve with --allow-client-shm to use it"
)


@dataclass
class _Opened:
    info: SharedMemoryRegion
    fd: int


class SharedMemoryRegistry:
    """The regions clients registered, by name."""

    def __init__(
        self,
        *,
        enabled: bool,
        max_regions: int = DEFAULT_MAX_REGIONS,
        staging_bytes: int = STAGING_BYTES,
    ) -> None:
        self.enabled = enabled
        self.max_regions = max_regions  # each holds a descriptor of the server's
        self._regions: dict[str, _Opened] = {}
        self._staging_bytes = staging_bytes
        self._staging: Arena | None = None  # made on the first read that can use it

    def _check_enabled(self) -> None:
        if not self.enabled:
            raise UnsupportedError(DISABLED)

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Map ``byte_size`` bytes at ``offset`` of the shm object ``key`` as region ``name``."""
        self._check_enabled()
        if not name:
            raise InvalidArgumentError("shared memory region 'name' must not be empty")
        if name in self._regions:
            raise InfermuxError(
                f"shared memory region '{name}' is already registered", ErrorCode.ALREADY_EXISTS
            )
        check_region_count(name, len(self._regions), self.max_regions)
        if not _KEY.match(key) or key.strip("/") in (".", ".."):
            raise InvalidArgumentError(
                f"shared memory region '{name}': key '{key}' is not a valid POSIX shm name"
            )
        if offset < 0 or byte_size <= 0:
            raise InvalidArgumentError(
                f"shared memory region '{name}': offset must be >= 0 and byte_size > 0, "
                f"got offset {offset} and byte_size {byte_size}"
            )
        if _posixshmem is None:  # pragma: no cover
            raise UnsupportedError("system shared memory needs a POSIX platform")
        try:
            fd = _posixshmem.shm_open("/" + key.lstrip("/"), os.O_RDWR, mode=0o600)
        except OSError as exc:
            raise InvalidArgumentError(
                f"shared memory region '{name}': unable to open key '{key}': {exc.strerror}"
            ) from None
        try:
            size = os.fstat(fd).st_size
            if offset + byte_size > size:
                raise InvalidArgumentError(
                    f"shared memory region '{name}': offset {offset} + byte_size {byte_size} "
                    f"exceeds the {size} bytes of '{key}'"
                )
        except BaseException:
            os.close(fd)
            raise
        self._regions[name] = _Opened(SharedMemoryRegion(name, key, offset, byte_size), fd)

    def unregister(self, name: str = "") -> None:
        """Forget region ``name`` (every region when ``name`` is "")."""
        self._check_enabled()
        if name and name not in self._regions:
            raise NotFoundError(f"shared memory region '{name}' is not registered")
        for region in [name] if name else list(self._regions):
            # Nothing refers to the descriptor past a read or write: inputs are copies.
            os.close(self._regions.pop(region).fd)

    def status(self, name: str = "") -> list[SharedMemoryRegion]:
        """Registered regions (one, when ``name`` is given)."""
        self._check_enabled()
        if name:
            if name not in self._regions:
                raise NotFoundError(f"shared memory region '{name}' is not registered")
            return [self._regions[name].info]
        return [m.info for m in self._regions.values()]

    def close(self) -> None:
        """Close every region (server shutdown)."""
        if self._regions:
            self.unregister()
        staging, self._staging = self._staging, None
        if staging is not None:
            HOST_MEMORY.withdraw(staging.address)
            with contextlib.suppress(BufferError):  # views still held go with their mapping
                staging.close()

    def read(self, tensor: Tensor, held: list[Block] | None = None) -> npt.NDArray[np.generic]:
        """The data of an input that lives in shared memory, copied out of the region.

        With ``held``, the copy goes into a block of the registry's staging arena when one is
        free, and the block is appended to ``held``: the caller gives it back with
        :meth:`release` once nothing reads the input any more (outputs that view it included,
        see :meth:`unstaged`)."""
        return self.read_stacked([tensor], held)

    def read_stacked(
        self, tensors: list[Tensor], held: list[Block] | None = None
    ) -> npt.NDArray[np.generic]:
        """Several requests' data of one input, each in its own region slice, copied one after
        the other into one array (their rows stacked); ``held`` as for :meth:`read`."""
        slices = []
        for tensor in tensors:
            what = f"input '{tensor.name}'"
            opened, start, size = self._slice(what, tensor.parameters)
            if tensor.datatype != "BYTES":  # refused before copying what could not be decoded
                check_fixed_size(what, tensor, size)
            slices.append((what, opened, start, size))
        raw = self._destination(sum(size for *_, size in slices), held)
        offset = 0
        for what, opened, start, size in slices:
            _read_exactly(what, opened, start, raw[offset : offset + size])
            offset += size
        first = tensors[0]
        shape = first.shape
        if len(tensors) > 1:
            shape = (sum(t.shape[0] for t in tensors), *first.shape[1:])
        return tensor_from_bytes(first.name, first.datatype, shape, raw)

    def _destination(self, size: int, held: list[Block] | None) -> memoryview:
        if held is not None and self._staging_bytes:
            staging = self._staging
            if staging is None:
                staging = self._staging = Arena.local(self._staging_bytes)
                HOST_MEMORY.offer(staging.address, staging.size, "the shared-memory input staging")
            block = staging.allocate(size)
            if block is not None:
                held.append(block)
                return staging.buffer(block.offset, size)
        # np.empty, not bytearray(size): zero-filling what preadv overwrites costs the executor's
        # event loop ~2 us per 150 KB input (a ResNet-50 image), ~10 us per 600 KB.
        return np.empty(size, dtype=np.uint8).data

    def release(self, held: list[Block]) -> None:
        """Give back the staging blocks :meth:`read` appended to ``held``."""
        if self._staging is not None:
            for block in held:
                self._staging.release(block)
        held.clear()

    def unstaged(self, tensors: list[Tensor]) -> list[Tensor]:
        """``tensors`` with any whose data views the staging arena copied out of it (a model
        may answer with its input): they outlive the blocks, which go back before they are
        sent."""
        staging = self._staging
        if staging is None:
            return tensors
        start, end = staging.address, staging.address + staging.size
        for tensor in tensors:
            data = tensor.data
            if isinstance(data, np.ndarray) and data.size:
                address = data.__array_interface__["data"][0]
                if start <= address < end:
                    tensor.data = data.copy()
        return tensors

    def write(self, tensor: Tensor, parameters: Parameters) -> Tensor:
        """Serialise an output into the region its parameters name; returns the placed tensor."""
        what = f"output '{tensor.name}'"
        opened, start, size = self._slice(what, parameters)
        raw = tensor_to_bytes(tensor.datatype, tensor.data)
        if len(raw) > size:
            raise InvalidArgumentError(
                f"{what} needs {len(raw)} bytes but its shared memory byte size is {size}"
            )
        # Truncated after the size check, pwrite grows the object back rather than faulting.
        done = 0
        while done < len(raw):
            try:
                done += os.pwrite(opened.fd, raw[done:], start + done)
            except OSError as exc:
                raise _inaccessible(what, opened.info, exc) from None
        return placed(tensor, parameters, len(raw))

    def _slice(self, what: str, parameters: Parameters) -> tuple[_Opened, int, int]:
        """The region, the absolute offset in its object and the size a tensor refers to, once
        the slice is known to lie inside the region and the object still holds it."""
        self._check_enabled()
        region, offset, size = shm_reference(what, parameters)
        opened = self._regions.get(region)
        if opened is None:
            raise InvalidArgumentError(f"{what}: shared memory region '{region}' is not registered")
        info = opened.info
        check_bounds(what, region, offset, size, info.byte_size)
        start = info.offset + offset
        try:
            held = os.fstat(opened.fd).st_size
        except OSError as exc:
            raise _inaccessible(what, info, exc) from None
        if start + size > held:
            raise _truncated(what, info, held, start + size)
        return opened, start, size

    def has(self, name: str) -> bool:
        """Whether region ``name`` is registered here."""
        return name in self._regions


def _read_exactly(what: str, opened: _Opened, start: int, target: memoryview) -> None:
    """Fill ``target`` from the region's object at ``start`` (preadv, no mapping)."""
    size, done = len(target), 0
    while done < size:
        try:
            got = os.preadv(opened.fd, [target[done:]], start + done)
        except OSError as exc:
            raise _inaccessible(what, opened.info, exc) from None
        if got == 0:  # truncated between the size check and the read
            raise _truncated(what, opened.info, start + done, start + size)
        done += got


def check_region_count(name: str, held: int, limit: int) -> None:
    """Refuse a registration past ``limit`` regions (``--max-shm-regions``, system and CUDA
    each): a client must not make the server hold unbounded mappings and handles."""
    if held >= limit:
        raise InvalidArgumentError(
            f"shared memory region '{name}': {held} regions are registered, the server's limit "
            "(--max-shm-regions); unregister some first"
        )


def shm_reference(what: str, parameters: Parameters) -> tuple[str, int, int]:
    """``(region, offset, byte size)`` from a tensor's shared-memory parameters."""
    region = parameters.get(SHM_REGION)
    if not isinstance(region, str) or not region:
        raise InvalidArgumentError(f"{what}: '{SHM_REGION}' must name a registered region")
    size = non_negative_int(parameters.get(SHM_BYTE_SIZE), f"{what}: '{SHM_BYTE_SIZE}'")
    offset = non_negative_int(parameters.get(SHM_OFFSET, 0), f"{what}: '{SHM_OFFSET}'")
    return region, offset, size


def check_bounds(what: str, region: str, offset: int, size: int, region_size: int) -> None:
    """Refuse a slice that does not lie inside the region."""
    if offset + size > region_size:
        raise InvalidArgumentError(
            f"{what}: offset {offset} + byte size {size} is outside region '{region}' "
            f"of {region_size} bytes"
        )


def check_fixed_size(what: str, tensor: Tensor, size: int) -> None:
    """Refuse a fixed-size input whose shared-memory byte size is not what its shape needs."""
    expected = element_count(tensor.shape) * numpy_dtype(tensor.datatype).itemsize
    if size != expected:
        raise InvalidArgumentError(
            f"{what}: its shared memory byte size is {size} but shape "
            f"{list(tensor.shape)} of {tensor.datatype} needs {expected} bytes"
        )


def placed(tensor: Tensor, parameters: Parameters, size: int) -> Tensor:
    """``tensor`` as answered when its data went into shared memory: no data, the region named."""
    where: Parameters = {SHM_REGION: parameters[SHM_REGION], SHM_BYTE_SIZE: size}
    if SHM_OFFSET in parameters:
        where[SHM_OFFSET] = parameters[SHM_OFFSET]
    # reshape: a 0-d output (a scalar) has no first axis to slice.
    return Tensor(tensor.name, tensor.datatype, tensor.shape, tensor.data.reshape(-1)[:0], where)


def _truncated(what: str, info: SharedMemoryRegion, held: int, needed: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what}: shared memory region '{info.name}' was truncated to {held} bytes; it needs "
        f"{needed} (key '{info.key}', registered at offset {info.offset} with byte_size "
        f"{info.byte_size}): restore its size or register it again"
    )


def _inaccessible(what: str, info: SharedMemoryRegion, exc: OSError) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"{what}: shared memory region '{info.name}' (key '{info.key}') cannot be accessed: "
        f"{exc.strerror}"
    )
