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
    check_shape_size(f"input '{name}'", shape)
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


MAX_DIMS = 64
"""numpy's most dimensions an array may have (``NPY_MAXDIMS`` in numpy 2)."""


def check_shape_size(what: str, shape: tuple[int, ...]) -> None:
    """Refuse a shape numpy could not even describe: more than :data:`MAX_DIMS` dimensions,
    or non-zero dimensions multiplying past 2**58 (at 16 bytes an element that nears numpy's
    2**63-byte bound). With a zero among them the element count is 0 and every size check
    passes, but building the array would fail as an internal error (found by
    tests/e2e/test_malformed.py, then by fuzz/ with INT64; the rank by issue 23). Both front
    ends' codecs call this on every input shape before any array is built."""
    if len(shape) > MAX_DIMS:
        raise InvalidArgumentError(
            f"{what}: shape has {len(shape)} dimensions; at most {MAX_DIMS} are supported"
        )
    product = 1
    for dim in shape:
        product *= max(dim, 1)
    if product > 2**58:
        raise InvalidArgumentError(f"{what}: shape {list(shape)} is too large")


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
    view = memoryview(raw)
    offset, size = 0, len(view)
    # Each element takes at least its 4-byte length prefix: a shape claiming more elements than
    # that is refused before the array is allocated (a client's shape must not size memory).
    if count * 4 > size:
        raise InvalidArgumentError(
            f"input '{name}': BYTES data holds fewer than the {count} elements of shape "
            f"{list(shape)} ({size} bytes; each element takes at least 4)"
        )
    out = np.empty(count, dtype=np.object_)
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
