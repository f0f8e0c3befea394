"""Transport-free value types: datatypes, tensors, inference requests and responses.

Front ends decode wire formats into these and encode these back; the data plane and everything below
it only ever see these types.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import ml_dtypes
import numpy as np
import numpy.typing as npt

from infermux.errors import InvalidArgumentError

Parameter = bool | int | float | str
"""A request/tensor parameter value, as KServe V2 and Triton's ``InferParameter`` allow."""

Parameters = dict[str, Parameter]

# V2 datatype name -> numpy dtype. BYTES tensors are object arrays holding ``bytes``; BF16 uses
# ml_dtypes' bfloat16 because numpy has no native one.
_NUMPY_DTYPES: dict[str, np.dtype[np.generic]] = {
    "BOOL": np.dtype(np.bool_),
    "UINT8": np.dtype(np.uint8),
    "UINT16": np.dtype(np.uint16),
    "UINT32": np.dtype(np.uint32),
    "UINT64": np.dtype(np.uint64),
    "INT8": np.dtype(np.int8),
    "INT16": np.dtype(np.int16),
    "INT32": np.dtype(np.int32),
    "INT64": np.dtype(np.int64),
    "FP16": np.dtype(np.float16),
    "FP32": np.dtype(np.float32),
    "FP64": np.dtype(np.float64),
    "BF16": np.dtype(ml_dtypes.bfloat16),
    "BYTES": np.dtype(np.object_),
}
_DATATYPE_OF: dict[np.dtype[np.generic], str] = {v: k for k, v in _NUMPY_DTYPES.items()}

DATATYPES: tuple[str, ...] = tuple(_NUMPY_DTYPES)
"""Every V2 datatype infermux understands, in Triton's order."""


def numpy_dtype(datatype: str) -> np.dtype[np.generic]:
    """The numpy dtype that holds elements of V2 ``datatype``; raises on an unknown name."""
    try:
        return _NUMPY_DTYPES[datatype]
    except KeyError:
        raise InvalidArgumentError(
            f"unknown datatype '{datatype}' (expected one of {', '.join(DATATYPES)})"
        ) from None


def datatype_of(dtype: np.dtype[np.generic]) -> str:
    """The V2 datatype name for a numpy dtype (``str``/``bytes`` arrays count as BYTES)."""
    if dtype.kind in "OSU":
        return "BYTES"
    try:
        return _DATATYPE_OF[dtype.newbyteorder("=")]
    except KeyError:
        raise InvalidArgumentError(f"numpy dtype {dtype} has no V2 datatype") from None


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype; 0 for BYTES (variable length)."""
    if datatype == "BYTES":
        return 0
    return numpy_dtype(datatype).itemsize


def element_count(shape: tuple[int, ...]) -> int:
    """Number of elements of a (fully known) shape; a scalar shape ``()`` holds one."""
    count = 1
    for dim in shape:
        count *= dim
    return count


@dataclass(slots=True)
class Tensor:
    """A named tensor: ``data`` is row-major, ``data.shape == shape``, in the datatype's dtype."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    data: npt.NDArray[np.generic]
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class RequestedOutput:
    """An output the client asked for, with its per-output parameters (e.g. ``binary_data``)."""

    name: str
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferRequest:
    """One V2 inference request. ``model_version`` is "" for the model's default version.

    ``outputs`` empty means "every output of the model".
    """

    model_name: str
    model_version: str
    inputs: list[Tensor]
    outputs: list[RequestedOutput] = field(default_factory=list)
    id: str = ""
    parameters: Parameters = field(default_factory=dict)


@dataclass(slots=True)
class InferResponse:
    """The answer to one :class:`InferRequest`; outputs appear in the order they were requested."""

    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: Parameters = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TensorMetadata:
    """Name, datatype and full shape (``-1`` for variable dims, batch dim included) of a tensor."""

    name: str
    datatype: str
    shape: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class ModelMetadata:
    """The V2 model metadata response."""

    name: str
    versions: tuple[str, ...]
    platform: str
    inputs: tuple[TensorMetadata, ...]
    outputs: tuple[TensorMetadata, ...]


@dataclass(frozen=True, slots=True)
class ServerMetadata:
    """The V2 server metadata response; ``extensions`` lists only what is really implemented."""

    name: str
    version: str
    extensions: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class RepositoryIndexEntry:
    """One row of the repository index: a model version and its state (READY, UNAVAILABLE, ...)."""

    name: str
    version: str
    state: str
    reason: str
