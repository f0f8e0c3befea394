"""Raw tensor bytes as Triton's protocols carry them (HTTP binary extension, gRPC raw contents).

Fixed-size elements are little-endian, row-major, unpadded; each BYTES element is a 4-byte
little-endian length followed by its bytes.
"""

from __future__ import annotations

import struct

import numpy as np
import numpy.typing as npt

from infermux.errors import InvalidArgumentError
from infermux.types import element_count, numpy_dtype

_LENGTH = struct.Struct("<I")


def tensor_from_bytes(
    name: str, datatype: str, shape: tuple[int, ...], raw: bytes | memoryview
) -> npt.NDArray[np.generic]:
    """Decode ``raw`` into an array of ``shape``; raises naming the tensor if sizes disagree.

    Fixed-size tensors are zero-copy views of ``raw`` (read-only when ``raw`` is ``bytes``).
    """
    count = element_count(shape)
    if datatype == "BYTES":
        return _bytes_elements(name, shape, count, raw)
    dtype = numpy_dtype(datatype)
    expected = count * dtype.itemsize
    if len(raw) != expected:
        raise InvalidArgumentError(
            f"input '{name}': got {len(raw)} bytes of binary data but shape {list(shape)} "
            f"of {datatype} needs {expected} bytes"
        )
    if datatype == "BOOL" and np.frombuffer(raw, dtype=np.uint8).max(initial=0) > 1:
        raise InvalidArgumentError(f"input '{name}': BOOL bytes must be 0 or 1")
    return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)


def tensor_to_bytes(datatype: str, array: npt.NDArray[np.generic]) -> bytes:
    """Serialise ``array`` in the raw tensor encoding."""
    if datatype == "BYTES":
        parts = []
        for item in array.reshape(-1):
            data = item if isinstance(item, bytes) else str(item).encode("utf-8")
            parts.append(_LENGTH.pack(len(data)))
            parts.append(data)
        return b"".join(parts)
    little = array.dtype.newbyteorder("<")
    return np.ascontiguousarray(array, dtype=little).tobytes()


def count_bytes_elements(raw: bytes | memoryview) -> int:
    """How many length-prefixed BYTES elements ``raw`` holds (raises if it is malformed)."""
    count, offset, size = 0, 0, len(raw)
    while offset < size:
        if offset + 4 > size:
            raise InvalidArgumentError("malformed BYTES data: truncated length prefix")
        (length,) = _LENGTH.unpack_from(raw, offset)
        offset += 4 + length
        count += 1
    if offset != size:
        raise InvalidArgumentError("malformed BYTES data: an element runs past the end")
    return count


def _bytes_elements(
    name: str, shape: tuple[int, ...], count: int, raw: bytes | memoryview
) -> npt.NDArray[np.generic]:
    out = np.empty(count, dtype=np.object_)
    view = memoryview(raw)
    offset, size = 0, len(view)
    for i in range(count):
        if offset + 4 > size:
            raise InvalidArgumentError(
                f"input '{name}': BYTES data holds fewer than the {count} elements of shape "
                f"{list(shape)}"
            )
        (length,) = _LENGTH.unpack_from(view, offset)
        offset += 4
        if offset + length > size:
            raise InvalidArgumentError(
                f"input '{name}': BYTES element {i} declares {length} bytes but only "
                f"{size - offset} remain"
            )
        out[i] = bytes(view[offset : offset + length])
        offset += length
    if offset != size:
        raise InvalidArgumentError(
            f"input '{name}': {size - offset} bytes of BYTES data remain after the {count} "
            f"elements of shape {list(shape)}"
        )
    return out.reshape(shape)
