"""Transport-free value types: datatypes, tensors, inference requests and responses.

Front ends decode wire formats into these and encode these back; the data plane and everything below
it only ever see these types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from infermux.errors import InfermuxError, InvalidArgumentError

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


def non_negative_int(value: object, what: str) -> int:
    """``value`` as an int >= 0 (bools refused), or an INVALID_ARG error naming ``what``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidArgumentError(f"{what} must be an integer >= 0, got {value!r}")
    return value


def element_size(datatype: str) -> int:
    """Bytes per element of a fixed-size datatype; 0 for BYTES (variable length)."""
    if datatype == "BYTES":
        return 0
    return numpy_dtype(datatype).itemsize


def element_count(shape: tuple[int, ...]) -> int:
    """Number of elements of a (fully known) shape; a scalar shape ``()`` holds one."""
    return math.prod(shape)


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
    trace_context: dict[str, str] = field(default_factory=dict)
    """The caller's W3C ``traceparent``/``tracestate`` (HTTP headers, gRPC metadata), if any."""
    deadline_ns: int = 0
    """When the caller stops waiting, as ``time.monotonic_ns()`` (a gRPC deadline; 0: none).
    In one process the transport cancels the request then; across processes it travels to the
    executor, which must not start the request after it."""


@dataclass(slots=True)
class InferResponse:
    """The answer to one :class:`InferRequest`; outputs appear in the order they were requested."""

    model_name: str
    model_version: str
    outputs: list[Tensor]
    id: str = ""
    parameters: Parameters = field(default_factory=dict)
    final: bool = True
    """The last response to its request (a decoupled model's may be one of many)."""
    error: InfermuxError | None = None
    """A decoupled model's failed response (no outputs); its stream may go on after it."""
    flag_only: bool = False
    """No response, only the final flag (a decoupled model sent the flag alone): a front end
    sends it only where the client asked for it (Triton's ``enable_empty_final_response``)."""


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


SHM_REGION = "shared_memory_region"
SHM_BYTE_SIZE = "shared_memory_byte_size"
SHM_OFFSET = "shared_memory_offset"
SHM_KEYS = (SHM_REGION, SHM_BYTE_SIZE, SHM_OFFSET)
"""Tensor parameters that place an input or output in a registered shared-memory region.

Front ends pass them through in ``Tensor.parameters`` / ``RequestedOutput.parameters``; a
shared-memory input's ``data`` is an empty placeholder until the data plane reads the region.
A shared-memory output comes back with these parameters and empty ``data``.
"""


def uses_shared_memory(parameters: Parameters) -> bool:
    """Whether a tensor's parameters place it in shared memory."""
    return SHM_REGION in parameters or SHM_BYTE_SIZE in parameters


@dataclass(frozen=True, slots=True)
class SharedMemoryRegion:
    """A registered system shared-memory region (the status row)."""

    name: str
    key: str
    offset: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class CudaSharedMemoryRegion:
    """A registered CUDA shared-memory region (the status row)."""

    name: str
    device_id: int
    byte_size: int


class DeviceArray:
    """A C-contiguous tensor in GPU memory that infermux does not own: an input a client placed
    in a CUDA shared-memory region. Backends that run on the GPU read it in place through
    ``__cuda_array_interface__`` (torch, cupy, numba); nothing copies it through host memory.

    ``owner`` keeps the region's mapping alive while the array is in flight; the region itself
    must not be written by the client until the response arrives, as with Triton.
    """

    __slots__ = ("_owner", "device_id", "dtype", "pointer", "shape")

    def __init__(
        self,
        pointer: int,
        shape: tuple[int, ...],
        dtype: np.dtype[Any],
        device_id: int,
        owner: object = None,
    ) -> None:
        self.pointer = pointer
        self.shape = shape
        self.dtype = dtype
        self.device_id = device_id
        self._owner = owner

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def nbytes(self) -> int:
        # math.prod: numpy's costs ~2.4 µs a call, and the GPU path asks per request and input.
        return int(math.prod(self.shape)) * self.dtype.itemsize

    def reshape(self, shape: tuple[int, ...]) -> DeviceArray:
        """The same bytes seen with another shape of the same element count."""
        if int(math.prod(shape)) != int(math.prod(self.shape)):
            raise ValueError(f"cannot reshape {list(self.shape)} into {list(shape)}")
        return DeviceArray(self.pointer, shape, self.dtype, self.device_id, self._owner)

    def rows(self, start: int, stop: int) -> DeviceArray:
        """Rows ``start:stop`` of the first dimension (a view)."""
        row = self.nbytes // self.shape[0] if self.shape and self.shape[0] else 0
        return DeviceArray(
            self.pointer + start * row,
            (stop - start, *self.shape[1:]),
            self.dtype,
            self.device_id,
            self._owner,
        )

    @property
    def __cuda_array_interface__(self) -> dict[str, Any]:
        # Version 3 without a stream: the client synchronised before it sent the request. Not
        # marked read-only, which torch refuses; infermux only ever copies out of it.
        return {
            "shape": self.shape,
            "typestr": self.dtype.str,
            "data": (self.pointer, False),
            "version": 3,
            "strides": None,
        }

    def __repr__(self) -> str:
        return (
            f"DeviceArray(shape={list(self.shape)}, dtype={self.dtype}, "
            f"device={self.device_id}, pointer={self.pointer:#x})"
        )


@dataclass(slots=True)
class Duration:
    """A Triton ``StatisticDuration``: how many times, and total nanoseconds."""

    count: int = 0
    ns: int = 0

    def add(self, ns: int, count: int = 1) -> None:
        self.count += count
        self.ns += ns


INFER_STAT_KEYS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)
"""Keys of Triton's ``inference_stats``, in Triton's order (all always present)."""

RESPONSE_STAT_KEYS = (
    "compute_infer",
    "compute_output",
    "success",
    "fail",
    "empty_response",
    "cancel",
)
"""Keys of one entry of Triton's ``response_stats`` (``InferResponseStatistics``), in order."""


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Per-batch-size execution statistics (Triton's ``InferBatchStatistics``)."""

    batch_size: int
    compute_input: Duration
    compute_infer: Duration
    compute_output: Duration


@dataclass(frozen=True, slots=True)
class MemoryUsage:
    """Memory a model version holds on one device (Triton's ``MemoryUsage``): ``type`` is
    ``GPU``, ``CPU`` or ``CPU_PINNED``; ``id`` the device id."""

    type: str
    id: int
    byte_size: int


@dataclass(frozen=True, slots=True)
class ModelStats:
    """A snapshot of one model version's statistics (Triton's ``ModelStatistics``).

    ``inference_stats`` has every key of :data:`INFER_STAT_KEYS`; ``last_inference`` is in
    milliseconds since the epoch (0 = never). ``response_stats`` (decoupled models) maps a
    response's index in its request ("0" the first) to its statistics, each with every key of
    :data:`RESPONSE_STAT_KEYS`.
    """

    name: str
    version: str
    last_inference: int
    inference_count: int
    execution_count: int
    inference_stats: dict[str, Duration]
    batch_stats: tuple[BatchStats, ...]
    memory_usage: tuple[MemoryUsage, ...] = ()
    response_stats: dict[str, dict[str, Duration]] = field(default_factory=dict)
