"""Triton's gRPC messages (``inference.GRPCInferenceService``) <-> :mod:`infermux.types`.

Pure functions over the protobuf classes that tritonclient ships, so the wire format is Triton's by
construction. Tensor data travels in ``raw_input_contents``/``raw_output_contents`` (what every
Triton client sends) or, for inputs only, in the typed ``InferTensorContents`` lists. Every error
names the tensor or parameter at fault.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
from tritonclient.grpc import service_pb2

from infermux.errors import InvalidArgumentError
from infermux.model_config import ModelConfig
from infermux.tensor_bytes import check_shape_size, tensor_from_bytes, tensor_to_bytes
from infermux.types import (
    DATATYPES,
    SHM_REGION,
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    Parameter,
    Parameters,
    RepositoryIndexEntry,
    RequestedOutput,
    ServerMetadata,
    SharedMemoryRegion,
    Tensor,
    TensorMetadata,
    element_count,
    numpy_dtype,
    uses_shared_memory,
)

# protobuf messages are typed ``Any``: tritonclient's generated modules carry no type information.
Message = Any

# The typed-contents list that carries each datatype (Triton's grpc_service.proto). The narrow
# integers ride in the 32-bit lists; FP16 and BF16 have no list and must be sent raw.
CONTENTS_FIELD: dict[str, str] = {
    "BOOL": "bool_contents",
    "INT8": "int_contents",
    "INT16": "int_contents",
    "INT32": "int_contents",
    "INT64": "int64_contents",
    "UINT8": "uint_contents",
    "UINT16": "uint_contents",
    "UINT32": "uint_contents",
    "UINT64": "uint64_contents",
    "FP32": "fp32_contents",
    "FP64": "fp64_contents",
    "BYTES": "bytes_contents",
}
_ALL_CONTENTS_FIELDS = tuple(dict.fromkeys(CONTENTS_FIELD.values()))
_INT64_RANGE = (-(2**63), 2**63 - 1)
_UINT64_MAX = 2**64 - 1


# -- parameters -----------------------------------------------------------------------------------


def decode_parameters(entries: Mapping[str, Message], where: str) -> Parameters:
    """A ``map<string, InferParameter>`` as plain Python values; ``where`` names its owner."""
    out: Parameters = {}
    for key, value in entries.items():
        choice = value.WhichOneof("parameter_choice")
        if choice is None:
            raise InvalidArgumentError(f"{where}: parameter '{key}' has no value")
        out[key] = getattr(value, choice)
    return out


def encode_parameters(parameters: Parameters, target: MutableMapping[str, Message]) -> None:
    """Fill a ``map<string, InferParameter>`` field from plain Python values."""
    for key, value in parameters.items():
        _set_parameter(target[key], key, value)


def _set_parameter(message: Message, key: str, value: Parameter) -> None:
    # bool before int: bool is an int subclass, and Triton distinguishes the two.
    if isinstance(value, bool):
        message.bool_param = value
    elif isinstance(value, int):
        if _INT64_RANGE[0] <= value <= _INT64_RANGE[1]:
            message.int64_param = value
        elif 0 <= value <= _UINT64_MAX:
            message.uint64_param = value
        else:
            raise InvalidArgumentError(f"parameter '{key}': {value} does not fit in 64 bits")
    elif isinstance(value, float):
        message.double_param = value
    else:
        message.string_param = value


# -- requests -------------------------------------------------------------------------------------


def decode_infer_request(message: Message) -> InferRequest:
    """Decode a ``ModelInferRequest``.

    As in Triton, ``raw_input_contents`` holds one entry per input that is neither typed nor in
    shared memory, in input order; when it is used no input may carry typed ``contents``.
    """
    raw: Sequence[bytes] = message.raw_input_contents
    used = 0
    inputs = []
    for index, item in enumerate(message.inputs):
        name, datatype, shape = _input_header(item, index)
        where = f"input '{name}'"
        parameters = decode_parameters(item.parameters, where)
        has_contents = item.HasField("contents")
        if uses_shared_memory(parameters):
            if has_contents:
                raise InvalidArgumentError(f"{where}: has both shared memory and contents")
            # The data plane reads the region; until then an empty placeholder of the right dtype.
            data: npt.NDArray[np.generic] = np.empty(0, numpy_dtype(datatype))
        elif raw:
            if has_contents:
                raise InvalidArgumentError(
                    f"{where}: contents must not be set when raw_input_contents is used"
                )
            if used == len(raw):
                raise InvalidArgumentError(
                    f"{where}: has no data: raw_input_contents has only {len(raw)} entries"
                )
            data = tensor_from_bytes(name, datatype, shape, raw[used])
            used += 1
        else:
            data = contents_to_array(name, datatype, shape, item.contents if has_contents else None)
        inputs.append(Tensor(name, datatype, shape, data, parameters))
    if used != len(raw):
        raise InvalidArgumentError(
            f"raw_input_contents has {len(raw)} entries but only {used} inputs take raw data"
        )
    outputs = [
        RequestedOutput(o.name, decode_parameters(o.parameters, f"output '{o.name}'"))
        for o in message.outputs
    ]
    return InferRequest(
        model_name=message.model_name,
        model_version=message.model_version,
        inputs=inputs,
        outputs=outputs,
        id=message.id,
        parameters=decode_parameters(message.parameters, "request"),
    )


def _input_header(item: Message, index: int) -> tuple[str, str, tuple[int, ...]]:
    name: str = item.name
    if not name:
        raise InvalidArgumentError(f"inputs[{index}]: field 'name' must not be empty")
    datatype: str = item.datatype
    if datatype not in DATATYPES:
        raise InvalidArgumentError(
            f"input '{name}': datatype must be one of {', '.join(DATATYPES)}, got {datatype!r}"
        )
    shape = tuple(item.shape)
    if any(d < 0 for d in shape):
        raise InvalidArgumentError(f"input '{name}': shape {list(shape)} has a negative dimension")
    check_shape_size(f"input '{name}'", shape)
    return name, datatype, shape


def contents_to_array(
    name: str, datatype: str, shape: tuple[int, ...], contents: Message | None
) -> npt.NDArray[np.generic]:
    """Convert typed ``InferTensorContents`` (``None``: absent) into an array of ``shape``."""
    count = element_count(shape)
    dtype = numpy_dtype(datatype)
    if contents is None:
        if count:
            raise InvalidArgumentError(
                f"input '{name}': has no data (neither contents nor raw_input_contents)"
            )
        return np.empty(shape, dtype)
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidArgumentError(
            f"input '{name}': {datatype} data must be sent in raw_input_contents; "
            "typed contents cannot carry it"
        )
    for other in _ALL_CONTENTS_FIELDS:
        if other != field and len(getattr(contents, other)):
            raise InvalidArgumentError(
                f"input '{name}': datatype {datatype} is carried in '{field}', not '{other}'"
            )
    values = getattr(contents, field)
    if len(values) != count:
        raise InvalidArgumentError(
            f"input '{name}': '{field}' has {len(values)} elements but shape {list(shape)} "
            f"needs {count}"
        )
    if datatype == "BYTES":
        out = np.empty(count, dtype=np.object_)
        for i, value in enumerate(values):
            out[i] = value
        return out.reshape(shape)
    if dtype.itemsize < 4 and dtype.kind in "iu" and count:
        # INT8/16 and UINT8/16 arrive widened to 32 bits; refuse values the datatype cannot hold
        # rather than wrapping them silently.
        wide = np.asarray(values)
        info = np.iinfo(dtype)  # type: ignore[type-var]  # dtype.kind is 'i' or 'u' here
        if wide.min() < info.min or wide.max() > info.max:
            raise InvalidArgumentError(
                f"input '{name}': a value in '{field}' is out of range for datatype {datatype}"
            )
        return wide.astype(dtype).reshape(shape)
    return np.array(values, dtype=dtype).reshape(shape)


# -- responses ------------------------------------------------------------------------------------


def encode_infer_response(response: InferResponse, into: Message | None = None) -> Message:
    """Encode a ``ModelInferResponse`` with one ``raw_output_contents`` entry per output, into
    the empty message ``into`` where given (a stream reply's ``infer_response``: filled in place
    rather than built and copied in).

    An output written to shared memory keeps its parameters and gets an empty entry, because
    clients find an output's bytes by its index in ``outputs``.
    """
    message = service_pb2.ModelInferResponse() if into is None else into
    message.model_name = response.model_name
    message.model_version = response.model_version
    message.id = response.id
    encode_parameters(response.parameters, message.parameters)
    raw: list[bytes] = []
    for tensor in response.outputs:
        out = message.outputs.add(name=tensor.name, datatype=tensor.datatype, shape=tensor.shape)
        if SHM_REGION in tensor.parameters:
            # Written to the client's region: no parameters (as Triton answers) and an empty entry
            # so that the other outputs keep their index.
            raw.append(b"")
            continue
        encode_parameters(tensor.parameters, out.parameters)
        raw.append(tensor_to_bytes(tensor.datatype, tensor.data))
    message.raw_output_contents.extend(raw)
    return message


def server_metadata_response(meta: ServerMetadata) -> Message:
    return service_pb2.ServerMetadataResponse(
        name=meta.name, version=meta.version, extensions=meta.extensions
    )


def model_metadata_response(meta: ModelMetadata) -> Message:
    return service_pb2.ModelMetadataResponse(
        name=meta.name,
        versions=meta.versions,
        platform=meta.platform,
        inputs=[_tensor_metadata(t) for t in meta.inputs],
        outputs=[_tensor_metadata(t) for t in meta.outputs],
    )


def _tensor_metadata(tensor: TensorMetadata) -> Message:
    return service_pb2.ModelMetadataResponse.TensorMetadata(
        name=tensor.name, datatype=tensor.datatype, shape=tensor.shape
    )


def model_config_response(config: ModelConfig) -> Message:
    # The config keeps its parsed protobuf, so clients see every field Triton would send.
    return service_pb2.ModelConfigResponse(config=config.proto)


def statistics_response(stats: Sequence[ModelStats]) -> Message:
    """A ``ModelStatisticsResponse``; durations keep their exact uint64 counts and nanoseconds."""
    response = service_pb2.ModelStatisticsResponse()
    for model in stats:
        entry = response.model_stats.add(
            name=model.name,
            version=model.version,
            last_inference=model.last_inference,
            inference_count=model.inference_count,
            execution_count=model.execution_count,
        )
        for key, duration in model.inference_stats.items():
            target = getattr(entry.inference_stats, key)
            target.count, target.ns = duration.count, duration.ns
        for batch in model.batch_stats:
            row = entry.batch_stats.add(batch_size=batch.batch_size)
            for key in ("compute_input", "compute_infer", "compute_output"):
                duration = getattr(batch, key)
                target = getattr(row, key)
                target.count, target.ns = duration.count, duration.ns
        for memory in model.memory_usage:
            entry.memory_usage.add(type=memory.type, id=memory.id, byte_size=memory.byte_size)
        for index, durations in model.response_stats.items():
            stats = entry.response_stats[index]
            for key, duration in durations.items():
                target = getattr(stats, key)
                target.count, target.ns = duration.count, duration.ns
    return response


def repository_index_response(entries: Sequence[RepositoryIndexEntry]) -> Message:
    return service_pb2.RepositoryIndexResponse(
        models=[
            service_pb2.RepositoryIndexResponse.ModelIndex(
                name=e.name, version=e.version, state=e.state, reason=e.reason
            )
            for e in entries
        ]
    )


def cuda_shm_status_response(regions: Sequence[CudaSharedMemoryRegion]) -> Message:
    response = service_pb2.CudaSharedMemoryStatusResponse()
    for region in regions:
        status = response.regions[region.name]
        status.name, status.device_id, status.byte_size = (
            region.name,
            region.device_id,
            region.byte_size,
        )
    return response


def shm_status_response(regions: Sequence[SharedMemoryRegion]) -> Message:
    response = service_pb2.SystemSharedMemoryStatusResponse()
    for region in regions:
        status = response.regions[region.name]
        status.name, status.key = region.name, region.key
        status.offset, status.byte_size = region.offset, region.byte_size
    return response
