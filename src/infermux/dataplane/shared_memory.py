"""System shared memory (Triton's extension): client-registered POSIX shm regions.

A region is mapped once at registration. Inputs are read in place (zero-copy numpy views of the
mapping for fixed-size datatypes); outputs are serialised straight into the mapping. Every name,
offset and size is checked against the region before any byte is touched.
"""

from __future__ import annotations

import contextlib
import mmap
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
from infermux.tensor_bytes import tensor_from_bytes, tensor_to_bytes
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    Parameters,
    SharedMemoryRegion,
    Tensor,
    non_negative_int,
)

try:  # CPython's own binding of shm_open, as used by multiprocessing.shared_memory
    import _posixshmem  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - Windows
    _posixshmem = None

# POSIX: one leading slash, then up to NAME_MAX characters without further slashes.
_KEY = re.compile(r"^/?[^/\x00]{1,255}$")
DEFAULT_MAX_REGIONS = 256

DISABLED = (
    "system shared memory is disabled: start infermux serve with --allow-client-shm to use it"
)


@dataclass
class _Mapped:
    info: SharedMemoryRegion
    mapping: mmap.mmap


class SharedMemoryRegistry:
    """The regions clients registered, by name."""

    def __init__(self, *, enabled: bool, max_regions: int = DEFAULT_MAX_REGIONS) -> None:
        self.enabled = enabled
        self.max_regions = max_regions  # each holds a mapping and a descriptor of the server's
        self._regions: dict[str, _Mapped] = {}

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
            mapping = mmap.mmap(fd, offset + byte_size)
        finally:
            os.close(fd)
        self._regions[name] = _Mapped(SharedMemoryRegion(name, key, offset, byte_size), mapping)

    def unregister(self, name: str = "") -> None:
        """Forget region ``name`` (every region when ``name`` is "")."""
        self._check_enabled()
        if name and name not in self._regions:
            raise NotFoundError(f"shared memory region '{name}' is not registered")
        for region in [name] if name else list(self._regions):
            mapped = self._regions.pop(region)
            # A request still reading it keeps the mapping alive until its view is freed.
            with contextlib.suppress(BufferError):
                mapped.mapping.close()

    def status(self, name: str = "") -> list[SharedMemoryRegion]:
        """Registered regions (one, when ``name`` is given)."""
        self._check_enabled()
        if name:
            if name not in self._regions:
                raise NotFoundError(f"shared memory region '{name}' is not registered")
            return [self._regions[name].info]
        return [m.info for m in self._regions.values()]

    def close(self) -> None:
        """Unmap everything (server shutdown)."""
        if self._regions:
            self.unregister()

    def read(self, tensor: Tensor) -> npt.NDArray[np.generic]:
        """The data of an input that lives in shared memory, read in place."""
        view = self._view(f"input '{tensor.name}'", tensor.parameters)
        array = tensor_from_bytes(tensor.name, tensor.datatype, tensor.shape, view)
        if array.base is not None:
            array.flags.writeable = False  # the client's memory: models must not write into it
        return array

    def write(self, tensor: Tensor, parameters: Parameters) -> Tensor:
        """Serialise an output into the region its parameters name; returns the placed tensor."""
        what = f"output '{tensor.name}'"
        view = self._view(what, parameters)
        raw = tensor_to_bytes(tensor.datatype, tensor.data)
        if len(raw) > len(view):
            raise InvalidArgumentError(
                f"{what} needs {len(raw)} bytes but its shared memory byte size is {len(view)}"
            )
        view[: len(raw)] = raw
        return placed(tensor, parameters, len(raw))

    def _view(self, what: str, parameters: Parameters) -> memoryview:
        self._check_enabled()
        region, offset, size = shm_reference(what, parameters)
        mapped = self._regions.get(region)
        if mapped is None:
            raise InvalidArgumentError(f"{what}: shared memory region '{region}' is not registered")
        info = mapped.info
        check_bounds(what, region, offset, size, info.byte_size)
        start = info.offset + offset
        return memoryview(mapped.mapping)[start : start + size]

    def has(self, name: str) -> bool:
        """Whether region ``name`` is registered here."""
        return name in self._regions


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


def placed(tensor: Tensor, parameters: Parameters, size: int) -> Tensor:
    """``tensor`` as answered when its data went into shared memory: no data, the region named."""
    where: Parameters = {SHM_REGION: parameters[SHM_REGION], SHM_BYTE_SIZE: size}
    if SHM_OFFSET in parameters:
        where[SHM_OFFSET] = parameters[SHM_OFFSET]
    return Tensor(tensor.name, tensor.datatype, tensor.shape, tensor.data[:0], where)
