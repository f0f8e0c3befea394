"""KServe V2 HTTP/REST bodies <-> :mod:`infermux.types`, with Triton's binary tensor extension.

A body is a JSON header optionally followed by raw tensor bytes; ``Inference-Header-Content-Length``
gives the size of the JSON part. Every error names the field or tensor at fault.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import orjson

from infermux.errors import InvalidArgumentError
from infermux.tensor_bytes import check_shape_size, tensor_from_bytes, tensor_to_bytes
from infermux.types import (
    DATATYPES,
    SHM_REGION,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
    Tensor,
    element_count,
    numpy_dtype,
    uses_shared_memory,
)

_ORJSON_OPTS = orjson.OPT_SERIALIZE_NUMPY
# A finite JSON number can overflow these; their largest finite magnitudes (numpy's finfo).
_NARROW_FLOATS = {"FP16": 65504.0, "FP32": 3.4028234663852886e38, "BF16": 3.3895313892515355e38}
_INT_KINDS = "iu"


def dumps(value: Any) -> bytes:
    """JSON-encode a response object (numpy arrays allowed)."""
    return orjson.dumps(value, option=_ORJSON_OPTS)


def error_body(message: str) -> bytes:
    """Triton's error body."""
    return orjson.dumps({"error": message})


def parse_json(data: bytes | memoryview, what: str) -> Any:
    """Parse a JSON document; a syntax error becomes a 400 naming ``what``."""
    try:
        return orjson.loads(data)
    except orjson.JSONDecodeError as exc:
        raise InvalidArgumentError(f"malformed JSON in {what}: {exc}") from None


# -- requests -------------------------------------------------------------------------------------


def decode_infer_request(
    body: bytes, header_length: int | None, model_name: str, model_version: str
) -> InferRequest:
    """Decode an infer request body (JSON, or JSON + binary tensors)."""
    if header_length is None:
        header_length = len(body)
    elif header_length > len(body):
        raise InvalidArgumentError(
            f"Inference-Header-Content-Length is {header_length} but the body has only "
            f"{len(body)} bytes"
        )
    view = memoryview(body)
    doc = parse_json(view[:header_length], "the inference request")
    if not isinstance(doc, dict):
        raise InvalidArgumentError("the inference request must be a JSON object")
    binary = view[header_length:]
    inputs_doc = doc.get("inputs")
    if not isinstance(inputs_doc, list):
        raise InvalidArgumentError("field 'inputs' must be a list of input tensors")
    offset = 0
    inputs = []
    for i, item in enumerate(inputs_doc):
        tensor, used = _decode_input(item, i, binary[offset:])
        offset += used
        inputs.append(tensor)
    if offset != len(binary):
        raise InvalidArgumentError(
            f"binary data size mismatch: the body carries {len(binary)} bytes after the JSON "
            f"header but the inputs' binary_data_size add up to {offset}"
        )
    outputs_doc = doc.get("outputs", [])
    if not isinstance(outputs_doc, list):
        raise InvalidArgumentError("field 'outputs' must be a list")
    outputs = [_decode_requested_output(o, i) for i, o in enumerate(outputs_doc)]
    parameters = _parameters(doc.get("parameters"), "parameters")
    if not isinstance(parameters.get("binary_data_output", False), bool):
        raise InvalidArgumentError("parameter 'binary_data_output' must be a boolean")
    request_id = doc.get("id", "")
    if not isinstance(request_id, str):
        raise InvalidArgumentError("field 'id' must be a string")
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=inputs,
        outputs=outputs,
        id=request_id,
        parameters=parameters,
    )


def _decode_input(item: Any, index: int, binary: memoryview) -> tuple[Tensor, int]:
    field = f"inputs[{index}]"
    if not isinstance(item, dict):
        raise InvalidArgumentError(f"field '{field}' must be an object")
    name = item.get("name")
    if not isinstance(name, str) or not name:
        raise InvalidArgumentError(f"field '{field}.name' must be a non-empty string")
    field = f"input '{name}'"
    datatype = item.get("datatype")
    if datatype not in DATATYPES:
        raise InvalidArgumentError(
            f"{field}: field 'datatype' must be one of {', '.join(DATATYPES)}, got {datatype!r}"
        )
    shape = _shape(item.get("shape"), field)
    parameters = _parameters(item.get("parameters"), f"{field} parameters")
    if uses_shared_memory(parameters):
        if "data" in item or "binary_data_size" in parameters:
            raise InvalidArgumentError(f"{field}: has shared memory parameters and data")
        # The data plane reads the region; until then the data is an empty placeholder.
        return Tensor(name, datatype, shape, np.empty(0, numpy_dtype(datatype)), parameters), 0
    size = parameters.get("binary_data_size")
    if size is not None:
        if "data" in item:
            raise InvalidArgumentError(f"{field}: has both 'data' and 'binary_data_size'")
        if not isinstance(size, int) or isinstance(size, bool) or size < 0:
            raise InvalidArgumentError(f"{field}: 'binary_data_size' must be an integer >= 0")
        if size > len(binary):
            raise InvalidArgumentError(
                f"{field}: binary_data_size is {size} but only {len(binary)} bytes of binary "
                "data remain in the body"
            )
        array = tensor_from_bytes(name, datatype, shape, binary[:size])
        del parameters["binary_data_size"]
        return Tensor(name, datatype, shape, array, parameters), size
    if "data" not in item:
        raise InvalidArgumentError(f"{field}: has neither 'data' nor 'binary_data_size'")
    array = json_to_array(name, datatype, shape, item["data"])
    return Tensor(name, datatype, shape, array, parameters), 0


def _shape(value: Any, field: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in value
    ):
        raise InvalidArgumentError(f"{field}: field 'shape' must be a list of integers >= 0")
    check_shape_size(field, tuple(value))
    return tuple(value)


def _parameters(value: Any, field: str) -> Parameters:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise InvalidArgumentError(f"field '{field}' must be an object")
    for key, item in value.items():
        if not isinstance(item, (bool, int, float, str)):
            raise InvalidArgumentError(f"field '{field}.{key}' must be a boolean, number or string")
    return dict(value)


def _decode_requested_output(item: Any, index: int) -> RequestedOutput:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        raise InvalidArgumentError(f"field 'outputs[{index}]' must be an object with a 'name'")
    parameters = _parameters(item.get("parameters"), f"outputs[{index}].parameters")
    if not isinstance(parameters.get("binary_data", False), bool):
        raise InvalidArgumentError(
            f"output '{item['name']}': parameter 'binary_data' must be a boolean"
        )
    return RequestedOutput(item["name"], parameters)


def json_to_array(
    name: str, datatype: str, shape: tuple[int, ...], data: Any
) -> npt.NDArray[np.generic]:
    """Convert V2 JSON ``data`` (flat or nested, row-major) into an array of ``shape``."""
    count = element_count(shape)
    if datatype == "BYTES":
        flat = _flatten(data, name)
        if len(flat) != count:
            raise _count_error(name, len(flat), shape, count)
        out = np.empty(count, dtype=np.object_)
        for i, item in enumerate(flat):
            if not isinstance(item, str):
                raise InvalidArgumentError(
                    f"input '{name}': BYTES elements must be JSON strings, "
                    f"got {type(item).__name__}"
                )
            out[i] = item.encode("utf-8")
        return out.reshape(shape)
    if not isinstance(data, list):
        data = [data]
    try:
        parsed = np.asarray(data)
    except ValueError:
        raise InvalidArgumentError(
            f"input '{name}': 'data' is a ragged nested list; it must be row-major and regular"
        ) from None
    if parsed.size != count:
        raise _count_error(name, parsed.size, shape, count)
    dtype = numpy_dtype(datatype)
    kind = parsed.dtype.kind
    if dtype.kind in _INT_KINDS and kind in "fO":
        # numpy turns integers beyond int64 (UINT64's upper half) into floats or objects; keep
        # them exact when every element really is an integer.
        return _large_ints(name, datatype, dtype, data, shape)
    if parsed.size and not _json_kind_fits(datatype, kind):
        raise InvalidArgumentError(
            f"input '{name}': 'data' holds {_KIND_NAMES.get(kind, parsed.dtype.name)} values, "
            f"which are not valid for datatype {datatype}"
        )
    if not parsed.size:
        return parsed.astype(dtype, copy=False).reshape(shape)
    if kind != "b" and bool in set(map(type, _leaves(data, parsed.ndim))):
        # numpy reads [1, true] as [1, 1]: a boolean hidden among numbers is refused as
        # Triton refuses it. (One pass in C; numpy has no vectorised type test.)
        raise InvalidArgumentError(
            f"input '{name}': 'data' holds boolean values, which are not valid for datatype "
            f"{datatype}"
        )
    if dtype.kind in _INT_KINDS:
        info = np.iinfo(dtype)  # type: ignore[type-var]  # dtype.kind is 'i' or 'u' here
        if parsed.min() < info.min or parsed.max() > info.max:
            raise InvalidArgumentError(
                f"input '{name}': a value is out of range for datatype {datatype}"
            )
    if datatype not in _NARROW_FLOATS:
        return parsed.astype(dtype, copy=False).reshape(shape)
    with np.errstate(over="ignore"):
        array = parsed.astype(dtype, copy=False)
    if not np.isfinite(array).all():
        # JSON numbers are finite (orjson refuses 1e400), so infinity here is a value beyond
        # the datatype's range (FP32 past 3.4e38, FP16 past 65504, as rounded) that the cast
        # overflowed: refused rather than sent on as inf (and answered as JSON null).
        raise InvalidArgumentError(
            f"input '{name}': a value is out of range for datatype {datatype} (largest "
            f"magnitude {_NARROW_FLOATS[datatype]:.6g})"
        )
    return array.reshape(shape)


def _leaves(data: list[Any], ndim: int) -> Any:
    # The JSON values themselves (numpy's scalars would hide which were booleans); a regular
    # nest (asarray succeeded) flattens in C as an object array.
    return data if ndim == 1 else np.asarray(data, dtype=np.object_).ravel()


def _large_ints(
    name: str, datatype: str, dtype: np.dtype[np.generic], data: Any, shape: tuple[int, ...]
) -> npt.NDArray[np.generic]:
    flat = _flatten(data, name)
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in flat):
        raise InvalidArgumentError(
            f"input '{name}': 'data' holds non-integer values, which are not valid for datatype "
            f"{datatype}"
        )
    info = np.iinfo(dtype)  # type: ignore[type-var]  # an integer dtype
    if flat and (min(flat) < info.min or max(flat) > info.max):
        raise InvalidArgumentError(
            f"input '{name}': a value is out of range for datatype {datatype}"
        )
    return np.array(flat, dtype=dtype).reshape(shape)


_KIND_NAMES = {"b": "boolean", "i": "integer", "u": "integer", "f": "floating-point", "U": "string"}


def _json_kind_fits(datatype: str, kind: str) -> bool:
    if datatype == "BOOL":
        return kind == "b"
    if datatype.startswith(("INT", "UINT")):
        return kind in "iu"
    return kind in "iuf"


def _flatten(data: Any, name: str) -> list[Any]:
    if not isinstance(data, list):
        return [data]
    out: list[Any] = []
    stack = [iter(data)]
    while stack:
        for item in stack[-1]:
            if isinstance(item, list):
                stack.append(iter(item))
                break
            out.append(item)
        else:
            stack.pop()
    return out


def _count_error(name: str, got: int, shape: tuple[int, ...], count: int) -> InvalidArgumentError:
    return InvalidArgumentError(
        f"input '{name}': 'data' has {got} elements but shape {list(shape)} needs {count}"
    )


def decode_raw_request(
    body: bytes,
    *,
    model_name: str,
    model_version: str,
    input_name: str,
    datatype: str,
    shape: tuple[int, ...],
) -> InferRequest:
    """``Inference-Header-Content-Length: 0``: the body is the only input; outputs go binary."""
    array = tensor_from_bytes(input_name, datatype, shape, body)
    return InferRequest(
        model_name=model_name,
        model_version=model_version,
        inputs=[Tensor(input_name, datatype, shape, array)],
        parameters={"binary_data_output": True},
    )


# -- responses ------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class EncodedResponse:
    """A response body; ``header_length`` is set when binary tensors follow the JSON header."""

    body: bytes
    header_length: int | None


def encode_infer_response(
    response: InferResponse,
    request_outputs: Mapping[str, Parameters],
    request_parameters: Parameters,
) -> EncodedResponse:
    """Encode a response; outputs go binary per Triton's ``binary_data``/``binary_data_output``."""
    binary_default = bool(request_parameters.get("binary_data_output", False))
    outputs_doc = []
    chunks: list[bytes] = []
    for tensor in response.outputs:
        wanted = request_outputs.get(tensor.name, {})
        binary = bool(wanted.get("binary_data", binary_default))
        out: dict[str, Any] = {
            "name": tensor.name,
            "datatype": tensor.datatype,
            "shape": list(tensor.shape),
        }
        if SHM_REGION in tensor.parameters:
            # Written to the client's region: neither data nor parameters, as Triton answers
            # (perf_analyzer's C++ client rejects output parameters without binary_data_size).
            pass
        elif binary:
            raw = tensor_to_bytes(tensor.datatype, tensor.data)
            out["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            out["data"] = array_to_json(tensor.name, tensor.datatype, tensor.data)
        outputs_doc.append(out)
    doc: dict[str, Any] = {
        "model_name": response.model_name,
        "model_version": response.model_version,
    }
    if response.id:
        doc["id"] = response.id
    if response.parameters:
        doc["parameters"] = response.parameters
    doc["outputs"] = outputs_doc
    header = dumps(doc)
    if not chunks:
        return EncodedResponse(header, None)
    return EncodedResponse(b"".join([header, *chunks]), len(header))


def array_to_json(name: str, datatype: str, array: npt.NDArray[np.generic]) -> Any:
    """The flat, row-major JSON ``data`` of an output tensor."""
    flat = array.reshape(-1)
    if datatype == "BYTES":
        try:
            return [item.decode("utf-8") if isinstance(item, bytes) else str(item) for item in flat]
        except UnicodeDecodeError:
            raise InvalidArgumentError(
                f"output '{name}' holds bytes that are not UTF-8 and cannot be sent as JSON; "
                "request it with binary_data: true"
            ) from None
    if flat.dtype == ml_dtypes.bfloat16:
        return flat.astype(np.float32)
    return np.ascontiguousarray(flat)


def request_output_parameters(request: InferRequest) -> dict[str, Parameters]:
    """Per requested output, its parameters (what the encoder needs after inference)."""
    return {o.name: o.parameters for o in request.outputs}
