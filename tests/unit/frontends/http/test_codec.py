"""KServe V2 HTTP bodies with Triton's binary extension (``infermux.frontends.http.codec``).

The properties encode and decode the way a client (tritonclient, curl) does, independently of the
codec: JSON via the standard library, binary tensors little-endian, BYTES with 4-byte
little-endian length prefixes.
"""

from __future__ import annotations

import json
import struct
from typing import Any

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import numpy.typing as npt
import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from infermux.errors import ErrorCode, InvalidArgumentError
from infermux.frontends.http.codec import (
    EncodedResponse,
    array_to_json,
    decode_infer_request,
    decode_raw_request,
    dumps,
    encode_infer_response,
    error_body,
    json_to_array,
    parse_json,
    request_output_parameters,
)
from infermux.types import (
    DATATYPES,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
    Tensor,
    element_count,
    numpy_dtype,
)

PROPERTY = settings(max_examples=50, deadline=None, derandomize=True, database=None)

SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
BF16 = np.dtype(ml_dtypes.bfloat16)
_EXPONENT_BITS = 0x7F80  # bfloat16: all ones is inf/NaN


@st.composite
def arrays_for(draw: st.DrawFn, datatype: str, *, json_safe: bool) -> npt.NDArray[Any]:
    """An array of ``datatype``; ``json_safe`` keeps floats finite and BYTES valid UTF-8."""
    shape = draw(SHAPES)
    if datatype == "BYTES":
        count = element_count(shape)
        element = st.text(max_size=6).map(str.encode) if json_safe else st.binary(max_size=6)
        items = draw(st.lists(element, min_size=count, max_size=count))
        out = np.empty(count, dtype=np.object_)
        for i, item in enumerate(items):
            out[i] = item
        return out.reshape(shape)
    if datatype == "BF16":
        bits = st.integers(0, 0xFFFF)
        if json_safe:
            bits = bits.filter(lambda b: b & _EXPONENT_BITS != _EXPONENT_BITS)
        return draw(hnp.arrays(np.uint16, shape, elements=bits)).view(BF16)
    dtype = numpy_dtype(datatype)
    if dtype.kind == "f":
        elements = hnp.from_dtype(dtype, allow_nan=not json_safe, allow_infinity=not json_safe)
        return draw(hnp.arrays(dtype, shape, elements=elements))
    if dtype.kind in "iu":
        return draw(hnp.arrays(dtype, shape, elements=integers_of(dtype)))
    return draw(hnp.arrays(dtype, shape))


def integers_of(dtype: np.dtype[Any]) -> st.SearchStrategy[int]:
    """Any value of an integer dtype, often its limits and the halves of its range.

    Mixing values below and above 2**63 matters: numpy turns such a JSON list into float64.
    """
    info = np.iinfo(dtype)
    half = info.max // 2
    limits = sorted({info.min, info.min + 1, -1, 0, 1, half, half + 1, info.max - 1, info.max})
    return st.one_of(
        st.sampled_from([v for v in limits if info.min <= v <= info.max]),
        st.integers(info.min, info.max),
    )


@st.composite
def named_tensors(draw: st.DrawFn, *, json_safe: bool) -> list[tuple[str, str, npt.NDArray[Any]]]:
    """One to four tensors of mixed datatypes, as (name, datatype, array)."""
    datatypes = draw(st.lists(st.sampled_from(DATATYPES), min_size=1, max_size=4))
    return [
        (f"T{i}", datatype, draw(arrays_for(datatype, json_safe=json_safe)))
        for i, datatype in enumerate(datatypes)
    ]


def assert_same(actual: npt.NDArray[Any], expected: npt.NDArray[Any]) -> None:
    """Equal shape, dtype and elements (NaN equal to NaN); bit-exact for fixed-size datatypes."""
    assert actual.shape == expected.shape
    assert actual.dtype == expected.dtype
    if expected.dtype == BF16:
        # numpy's comparison warns on bfloat16 NaNs; float32 holds every bfloat16 exactly.
        np.testing.assert_array_equal(actual.astype(np.float32), expected.astype(np.float32))
    else:
        np.testing.assert_array_equal(actual, expected)
    if expected.dtype == np.object_:
        assert actual.tolist() == expected.tolist()
    else:
        assert np.ascontiguousarray(actual).tobytes() == np.ascontiguousarray(expected).tobytes()


# -- a client, written independently of the codec --------------------------------------------------


def client_raw(datatype: str, array: npt.NDArray[Any]) -> bytes:
    if datatype == "BYTES":
        return b"".join(struct.pack("<I", len(item)) + item for item in array.reshape(-1))
    return array.astype(array.dtype.newbyteorder("<")).tobytes()


def client_json_data(datatype: str, array: npt.NDArray[Any], *, nested: bool) -> Any:
    values = array if nested else array.reshape(-1)
    if datatype == "BYTES":
        return np.vectorize(bytes.decode, otypes=[object])(values).tolist()
    if datatype == "BF16":
        return values.astype(np.float32).tolist()
    return values.tolist()


def client_request(
    tensors: list[tuple[str, str, npt.NDArray[Any]]], binary: list[bool], *, nested: bool = False
) -> tuple[bytes, int | None]:
    """An infer request body and its Inference-Header-Content-Length (None: JSON only)."""
    inputs: list[dict[str, Any]] = []
    chunks: list[bytes] = []
    for (name, datatype, array), as_binary in zip(tensors, binary, strict=True):
        item: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
        if as_binary:
            raw = client_raw(datatype, array)
            item["parameters"] = {"binary_data_size": len(raw)}
            chunks.append(raw)
        else:
            item["data"] = client_json_data(datatype, array, nested=nested)
        inputs.append(item)
    header = json.dumps({"inputs": inputs}).encode()
    if not any(binary):
        return header, None
    return header + b"".join(chunks), len(header)


def client_parse_bytes(raw: bytes) -> list[bytes]:
    items, offset = [], 0
    while offset < len(raw):
        (length,) = struct.unpack_from("<I", raw, offset)
        items.append(raw[offset + 4 : offset + 4 + length])
        offset += 4 + length
    assert offset == len(raw)
    return items


def client_array(datatype: str, shape: list[int], raw: bytes | None, data: Any) -> npt.NDArray[Any]:
    if datatype == "BYTES":
        items = client_parse_bytes(raw) if raw is not None else [s.encode() for s in data]
        out = np.empty(len(items), dtype=np.object_)
        for i, item in enumerate(items):
            out[i] = item
        return out.reshape(shape)
    dtype = numpy_dtype(datatype)
    if raw is not None:
        return np.frombuffer(raw, dtype=dtype.newbyteorder("<")).reshape(shape)
    assert isinstance(data, list)
    if datatype == "BF16":
        return np.array(data, dtype=np.float32).astype(BF16).reshape(shape)
    return np.array(data, dtype=dtype).reshape(shape)


def client_decode(encoded: EncodedResponse) -> tuple[dict[str, Any], dict[str, npt.NDArray[Any]]]:
    """Parse a response as tritonclient does: JSON header, then binary_data_size slices."""
    body = encoded.body
    header_length = len(body) if encoded.header_length is None else encoded.header_length
    doc = json.loads(body[:header_length])
    offset = header_length
    arrays = {}
    for out in doc["outputs"]:
        size = out.get("parameters", {}).get("binary_data_size")
        if size is None:
            arrays[out["name"]] = client_array(out["datatype"], out["shape"], None, out["data"])
        else:
            assert "data" not in out
            raw = body[offset : offset + size]
            offset += size
            arrays[out["name"]] = client_array(out["datatype"], out["shape"], raw, None)
    assert offset == len(body)
    return doc, arrays


def response_of(tensors: list[tuple[str, str, npt.NDArray[Any]]]) -> InferResponse:
    return InferResponse(
        model_name="m",
        model_version="2",
        outputs=[Tensor(name, dt, array.shape, array) for name, dt, array in tensors],
        id="req-1",
        parameters={"sequence_end": True},
    )


# -- requests: properties --------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
@PROPERTY
@given(data=st.data())
def test_request_json_and_binary_decode_equal(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_for(datatype, json_safe=True))
    nested = data.draw(st.booleans())
    tensors = [("INPUT0", datatype, array)]

    body, header_length = client_request(tensors, [False], nested=nested)
    assert header_length is None
    from_json = decode_infer_request(body, None, "m", "1")

    body, header_length = client_request(tensors, [True])
    assert header_length is not None
    from_binary = decode_infer_request(body, header_length, "m", "1")

    for request in (from_json, from_binary):
        assert request.model_name == "m"
        assert request.model_version == "1"
        [tensor] = request.inputs
        assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", datatype, array.shape)
        assert tensor.parameters == {}
        assert_same(tensor.data, array)
    assert_same(from_json.inputs[0].data, from_binary.inputs[0].data)


@PROPERTY
@given(data=st.data())
def test_request_with_mixed_json_and_binary_inputs(data: st.DataObject) -> None:
    tensors = data.draw(named_tensors(json_safe=True))
    binary = data.draw(st.lists(st.booleans(), min_size=len(tensors), max_size=len(tensors)))
    body, header_length = client_request(tensors, binary)
    request = decode_infer_request(body, header_length, "m", "")
    assert [t.name for t in request.inputs] == [name for name, _, _ in tensors]
    for tensor, (_, datatype, array) in zip(request.inputs, tensors, strict=True):
        assert tensor.datatype == datatype
        assert_same(tensor.data, array)


# -- responses: properties -------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
@PROPERTY
@given(data=st.data())
def test_response_round_trips_as_json_and_binary(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_for(datatype, json_safe=True))
    response = response_of([("OUTPUT0", datatype, array)])

    as_json = encode_infer_response(response, {}, {})
    assert as_json.header_length is None
    doc, arrays = client_decode(as_json)
    assert "parameters" not in doc["outputs"][0]
    assert_same(arrays["OUTPUT0"], array)

    as_binary = encode_infer_response(response, {}, {"binary_data_output": True})
    assert as_binary.header_length is not None
    doc, arrays = client_decode(as_binary)
    assert doc["outputs"][0]["parameters"]["binary_data_size"] == len(client_raw(datatype, array))
    assert_same(arrays["OUTPUT0"], array)

    for doc in (json.loads(as_json.body), json.loads(as_binary.body[: as_binary.header_length])):
        assert doc["model_name"] == "m"
        assert doc["model_version"] == "2"
        assert doc["id"] == "req-1"
        assert doc["parameters"] == {"sequence_end": True}
        [out] = doc["outputs"]
        assert (out["name"], out["datatype"], out["shape"]) == (
            "OUTPUT0",
            datatype,
            list(array.shape),
        )


@pytest.mark.parametrize("datatype", DATATYPES)
@PROPERTY
@given(data=st.data())
def test_binary_carries_any_value(datatype: str, data: st.DataObject) -> None:
    # NaN, inf, every float bit pattern and non-UTF-8 BYTES survive the binary path, in requests
    # and responses alike (JSON cannot carry them).
    array = data.draw(arrays_for(datatype, json_safe=False))
    body, header_length = client_request([("INPUT0", datatype, array)], [True])
    [tensor] = decode_infer_request(body, header_length, "m", "").inputs
    assert_same(tensor.data, array)

    response = response_of([("OUTPUT0", datatype, array)])
    encoded = encode_infer_response(response, {"OUTPUT0": {"binary_data": True}}, {})
    assert_same(client_decode(encoded)[1]["OUTPUT0"], array)


@PROPERTY
@given(data=st.data())
def test_response_with_mixed_json_and_binary_outputs(data: st.DataObject) -> None:
    tensors = data.draw(named_tensors(json_safe=True))
    binary = data.draw(st.lists(st.booleans(), min_size=len(tensors), max_size=len(tensors)))
    default = data.draw(st.booleans())
    # Per-output binary_data overrides the request-wide binary_data_output.
    wanted: dict[str, Parameters] = {
        name: {"binary_data": b} for (name, _, _), b in zip(tensors, binary, strict=True)
    }
    encoded = encode_infer_response(response_of(tensors), wanted, {"binary_data_output": default})
    doc, arrays = client_decode(encoded)
    assert [o["name"] for o in doc["outputs"]] == [name for name, _, _ in tensors]
    assert (encoded.header_length is not None) == any(binary)
    for (name, _, array), as_binary in zip(tensors, binary, strict=True):
        [out] = [o for o in doc["outputs"] if o["name"] == name]
        assert ("data" in out) != as_binary
        assert_same(arrays[name], array)


# -- requests: details -----------------------------------------------------------------------------


def test_request_fields_are_decoded() -> None:
    body = orjson.dumps(
        {
            "id": "abc",
            "parameters": {"priority": 2, "timeout": 1.5, "flag": True, "tag": "x"},
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT32",
                    "shape": [2, 2],
                    "data": [[1, 2], [3, 4]],
                    "parameters": {"custom": "y"},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}, {"name": "O1"}],
        }
    )
    request = decode_infer_request(body, None, "model", "3")
    assert request.id == "abc"
    assert request.model_name == "model"
    assert request.model_version == "3"
    assert request.parameters == {"priority": 2, "timeout": 1.5, "flag": True, "tag": "x"}
    [tensor] = request.inputs
    assert tensor.parameters == {"custom": "y"}
    assert tensor.data.dtype == np.int32
    assert tensor.data.tolist() == [[1, 2], [3, 4]]
    assert request.outputs == [
        RequestedOutput("OUTPUT0", {"binary_data": True}),
        RequestedOutput("O1", {}),
    ]
    assert request_output_parameters(request) == {"OUTPUT0": {"binary_data": True}, "O1": {}}


def test_binary_input_keeps_other_parameters() -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "UINT8",
                    "shape": [3],
                    "parameters": {"binary_data_size": 3, "note": "kept"},
                }
            ]
        }
    )
    request = decode_infer_request(header + b"\x01\x02\x03", len(header), "m", "")
    assert request.inputs[0].parameters == {"note": "kept"}
    assert request.inputs[0].data.tolist() == [1, 2, 3]


def test_request_defaults() -> None:
    request = decode_infer_request(b'{"inputs": []}', None, "m", "")
    assert request.inputs == []
    assert request.outputs == []
    assert request.id == ""
    assert request.parameters == {}


def test_header_length_equal_to_body_means_no_binary_data() -> None:
    body = b'{"inputs": [{"name": "A", "datatype": "FP32", "shape": [1], "data": [2]}]}'
    request = decode_infer_request(body, len(body), "m", "")
    assert request.inputs[0].data.tolist() == [2.0]


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("FP32", [1, 2], [1.0, 2.0]),  # JSON integers are fine for floats
        ("FP16", 3, [3.0]),  # a scalar stands for a one-element list
        ("BF16", [0.5], [0.5]),
        ("UINT64", [0, 2**64 - 1], [0, 2**64 - 1]),
        ("UINT64", [2**63, 1], [2**63, 1]),
        ("INT64", [-(2**63), 2**63 - 1], [-(2**63), 2**63 - 1]),
        ("UINT8", [0, 255], [0, 255]),
        ("INT8", [-128, 127], [-128, 127]),
        ("BOOL", [True, False], [True, False]),
        ("BYTES", ["a", "ü"], [b"a", "ü".encode()]),
        ("BYTES", "x", [b"x"]),
    ],
)
def test_json_to_array_values(datatype: str, data: Any, expected: list[Any]) -> None:
    array = json_to_array("INPUT0", datatype, (len(expected),), data)
    assert array.dtype == numpy_dtype(datatype)
    if datatype == "BF16":
        assert array.astype(np.float32).tolist() == expected
    else:
        assert array.tolist() == expected


@pytest.mark.parametrize("datatype", DATATYPES)
@pytest.mark.parametrize(("shape", "data"), [((0,), []), ((2, 0), [[], []]), ((0, 3), [])])
def test_json_to_array_zero_size(datatype: str, shape: tuple[int, ...], data: Any) -> None:
    array = json_to_array("INPUT0", datatype, shape, data)
    assert array.shape == shape
    assert array.dtype == numpy_dtype(datatype)


def test_json_to_array_accepts_nested_data_of_another_regular_shape() -> None:
    # V2 only requires row-major order; [[1, 2, 3], [4, 5, 6]] may feed a [3, 2] tensor.
    array = json_to_array("INPUT0", "INT16", (3, 2), [[1, 2, 3], [4, 5, 6]])
    assert array.tolist() == [[1, 2], [3, 4], [5, 6]]


def test_decode_raw_request() -> None:
    request = decode_raw_request(
        b"\x00\x00\x80\x3f\x00\x00\x00\x40",
        model_name="m",
        model_version="1",
        input_name="INPUT0",
        datatype="FP32",
        shape=(1, 2),
    )
    assert request.model_name == "m"
    assert request.model_version == "1"
    assert request.parameters == {"binary_data_output": True}
    [tensor] = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("INPUT0", "FP32", (1, 2))
    assert tensor.data.tolist() == [[1.0, 2.0]]


def test_decode_raw_request_size_mismatch_names_the_input() -> None:
    with pytest.raises(InvalidArgumentError, match="INPUT0"):
        decode_raw_request(
            b"\x00" * 3,
            model_name="m",
            model_version="",
            input_name="INPUT0",
            datatype="FP32",
            shape=(1,),
        )


# -- request errors --------------------------------------------------------------------------------


def _body(*inputs: Any, **extra: Any) -> bytes:
    return json.dumps({"inputs": list(inputs), **extra}).encode()


def _input(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {"name": "INPUT0", "datatype": "INT32", "shape": [2], "data": [1, 2]}
    base.update(fields)
    return {k: v for k, v in base.items() if v is not _DROP}


_DROP = object()


@pytest.mark.parametrize(
    ("body", "match"),
    [
        (b"", "malformed JSON in the inference request"),
        (b"{", "malformed JSON in the inference request"),
        (b'{"inputs": [}', "malformed JSON in the inference request"),
        (b"\xff\xfe", "malformed JSON in the inference request"),
        (b"[]", "must be a JSON object"),
        (b'"inputs"', "must be a JSON object"),
        (b"null", "must be a JSON object"),
        (b"{}", "field 'inputs'"),
        (b'{"inputs": null}', "field 'inputs'"),
        (b'{"inputs": {"name": "INPUT0"}}', "field 'inputs'"),
        (b'{"inputs": "INPUT0"}', "field 'inputs'"),
        (b'{"inputs": [1]}', r"field 'inputs\[0\]' must be an object"),
        (_body(_input(), "x"), r"field 'inputs\[1\]' must be an object"),
        (_body(_input(name=_DROP)), r"field 'inputs\[0\].name'"),
        (_body(_input(name="")), r"field 'inputs\[0\].name'"),
        (_body(_input(name=7)), r"field 'inputs\[0\].name'"),
        (_body(_input(), _input(name=None)), r"field 'inputs\[1\].name'"),
        (_body(_input(), outputs={"name": "x"}), "field 'outputs' must be a list"),
        (_body(_input(), outputs=[1]), r"field 'outputs\[0\]' must be an object"),
        (_body(_input(), outputs=[{"nam": "x"}]), r"field 'outputs\[0\]'.*'name'"),
        (_body(_input(), outputs=[{"name": 1}]), r"field 'outputs\[0\]'.*'name'"),
        (
            _body(_input(), outputs=[{"name": "O", "parameters": []}]),
            r"field 'outputs\[0\].parameters' must be an object",
        ),
        (_body(_input(), id=5), "field 'id' must be a string"),
        (_body(_input(), parameters=[1]), "field 'parameters' must be an object"),
        (
            _body(_input(), parameters={"p": [1]}),
            "field 'parameters.p' must be a boolean, number or string",
        ),
        (
            _body(_input(), parameters={"p": None}),
            "field 'parameters.p' must be a boolean, number or string",
        ),
    ],
)
def test_malformed_requests(body: bytes, match: str) -> None:
    with pytest.raises(InvalidArgumentError, match=match) as info:
        decode_infer_request(body, None, "m", "")
    assert info.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize(
    ("fields", "match"),
    [
        ({"datatype": "FLOAT32"}, "field 'datatype' must be one of"),
        ({"datatype": "fp32"}, "'fp32'"),
        ({"datatype": _DROP}, "field 'datatype'"),
        ({"datatype": 3}, "field 'datatype'"),
        ({"shape": _DROP}, "field 'shape'"),
        ({"shape": 2}, "field 'shape'"),
        ({"shape": [-1]}, "field 'shape'"),
        ({"shape": [2.0]}, "field 'shape'"),
        ({"shape": [True, 2]}, "field 'shape'"),
        ({"shape": ["2"]}, "field 'shape'"),
        ({"data": _DROP}, "has neither 'data' nor 'binary_data_size'"),
        ({"parameters": [1]}, "input 'INPUT0' parameters"),
        ({"parameters": {"p": {"a": 1}}}, "input 'INPUT0' parameters.p"),
        ({"data": [1, 2, 3]}, "'data' has 3 elements but shape \\[2\\] needs 2"),
        ({"data": [[1], [2], [3]]}, "'data' has 3 elements"),
        ({"data": []}, "'data' has 0 elements"),
        ({"data": [[1, 2], [3]], "shape": [3]}, "ragged nested list"),
        ({"data": [[1, 2], 3], "shape": [3]}, "ragged nested list"),
        ({"data": [1.5, 2]}, "INT32"),
        ({"data": [1.0, 2.0]}, "INT32"),
        ({"data": [True, False]}, "INT32"),
        ({"data": ["1", "2"]}, "INT32"),
        ({"data": [1, None]}, "INT32"),
        ({"datatype": "FP32", "data": ["1.0", "2.0"]}, "string values.*FP32"),
        ({"datatype": "FP32", "data": [True, False]}, "boolean values.*FP32"),
        ({"datatype": "FP32", "data": [{"a": 1}, 2]}, "FP32"),
        ({"datatype": "BOOL", "data": [1, 0]}, "integer values.*BOOL"),
        ({"datatype": "BOOL", "data": ["true", "false"]}, "string values.*BOOL"),
        ({"datatype": "BOOL", "data": [0.0, 1.0]}, "floating-point values.*BOOL"),
        ({"datatype": "UINT8", "data": [300, 1]}, "out of range for datatype UINT8"),
        ({"datatype": "UINT8", "data": [1, -1]}, "out of range for datatype UINT8"),
        ({"datatype": "INT8", "data": [128, 0]}, "out of range for datatype INT8"),
        ({"datatype": "INT8", "data": [-129, 0]}, "out of range for datatype INT8"),
        ({"datatype": "UINT32", "data": [-1, 0]}, "out of range for datatype UINT32"),
        ({"datatype": "UINT32", "data": [2**32, 0]}, "out of range for datatype UINT32"),
        ({"datatype": "INT64", "data": [2**63, 0]}, "out of range for datatype INT64"),
        ({"datatype": "INT64", "data": [2**64 - 1, -1]}, "out of range for datatype INT64"),
        ({"datatype": "UINT64", "data": [-1, 2**64 - 1]}, "out of range for datatype UINT64"),
        ({"datatype": "UINT64", "data": [2**64, 0]}, "UINT64"),  # orjson reads it as a float
        ({"datatype": "BYTES", "data": ["a", 1]}, "BYTES elements must be JSON strings"),
        ({"datatype": "BYTES", "data": ["a", None]}, "BYTES elements must be JSON strings"),
        ({"datatype": "BYTES", "data": ["a"]}, "'data' has 1 elements"),
        ({"datatype": "BYTES", "data": [["a", "b"], ["c"]]}, "'data' has 3 elements"),
    ],
)
def test_bad_input_names_the_input(fields: dict[str, Any], match: str) -> None:
    body = _body(_input(**fields))
    with pytest.raises(InvalidArgumentError, match=match) as info:
        decode_infer_request(body, None, "m", "")
    assert "input 'INPUT0'" in info.value.message


@pytest.mark.parametrize(
    ("datatype", "shape", "data", "match"),
    [
        ("INT32", (2,), [1.5, 2], "floating-point|non-integer"),
        ("FP32", (1,), ["x"], "string values"),
        ("BOOL", (1,), [1], "integer values"),
        ("UINT8", (1,), [300], "out of range"),
        ("UINT32", (1,), [-1], "out of range"),
        ("UINT64", (1,), [2**64], "out of range"),  # a Python int beyond uint64
        ("INT16", (2,), [[1], [2, 3]], "ragged"),
        ("FP64", (4,), [1, 2], "has 2 elements but shape \\[4\\] needs 4"),
        ("BYTES", (2,), [b"raw", "x"], "JSON strings"),
        # Issue 23: booleans among numbers were read as 1 and 0, overflowing floats as inf.
        ("INT32", (2,), [1, True], "boolean values"),
        ("INT64", (2, 1), [[False], [2]], "boolean values"),
        ("UINT8", (1,), [True], "boolean values"),
        ("FP32", (2,), [1.5, True], "boolean values"),
        ("FP64", (2,), [[True], [0.5]], "boolean values"),
        (
            "FP32",
            (2,),
            [1, 3.5e38],
            "out of range for datatype FP32 \\(largest magnitude 3.40282e\\+38\\)",
        ),
        ("FP32", (1,), [-3.5e38], "out of range for datatype FP32"),
        ("FP16", (1,), [65520], "out of range for datatype FP16 \\(largest magnitude 65504\\)"),
        ("FP16", (1,), [2**64 - 1], "out of range for datatype FP16"),
        ("BF16", (1,), [3.5e38], "out of range for datatype BF16"),
        ("INT32", (1,), [2.0], "non-integer"),
    ],
)
def test_json_to_array_errors_name_the_input(
    datatype: str, shape: tuple[int, ...], data: Any, match: str
) -> None:
    with pytest.raises(InvalidArgumentError, match=match) as info:
        json_to_array("INPUT7", datatype, shape, data)
    assert "input 'INPUT7'" in info.value.message


@pytest.mark.parametrize(
    ("datatype", "data", "expected"),
    [
        ("FP16", [65504, -65504.0, 65519.0], [65504, -65504, 65504]),  # rounds to the largest
        ("FP32", [3.4e38, 1e-50], [np.float32(3.4e38), 0]),  # underflow rounds to 0, as a cast
        ("FP64", [1e308, 1], [1e308, 1]),  # ints and floats mix
    ],
)
def test_json_floats_within_range_are_accepted(
    datatype: str, data: list[Any], expected: list[Any]
) -> None:
    array = json_to_array("INPUT0", datatype, (len(data),), data)
    assert array.tolist() == np.asarray(expected, array.dtype).tolist()


def test_a_shape_of_more_than_64_dimensions_names_the_input() -> None:
    body = _body(_input(datatype="INT32", shape=[1] * 65, data=[1]))
    with pytest.raises(InvalidArgumentError, match="input 'INPUT0': shape has 65 dimensions"):
        decode_infer_request(body, None, "m", "")


def _binary_body(
    size: Any, payload: bytes, *, datatype: str = "FP32", shape: list[int] | None = None
) -> tuple[bytes, int]:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": datatype,
                    "shape": [2] if shape is None else shape,
                    "parameters": {"binary_data_size": size},
                }
            ]
        }
    )
    return header + payload, len(header)


@pytest.mark.parametrize(
    ("size", "payload", "kwargs", "match"),
    [
        (9, b"\x00" * 8, {}, "binary_data_size is 9 but only 8 bytes"),
        (8, b"", {}, "binary_data_size is 8 but only 0 bytes"),
        (4, b"\x00" * 4, {}, "got 4 bytes of binary data but shape \\[2\\] of FP32 needs 8"),
        (-1, b"", {}, "'binary_data_size' must be an integer >= 0"),
        (True, b"\x00", {}, "'binary_data_size' must be an integer >= 0"),
        (2.0, b"\x00\x00", {}, "'binary_data_size' must be an integer >= 0"),
        ("8", b"\x00" * 8, {}, "'binary_data_size' must be an integer >= 0"),
        (
            6,
            b"\x01\x00\x00\x00a\x00",
            {"datatype": "BYTES"},
            "fewer than the 2 elements",
        ),  # second length prefix truncated
        (
            9,
            b"\x01\x00\x00\x00a\x05\x00\x00\x00",
            {"datatype": "BYTES"},
            "declares 5 bytes but only 0 remain",
        ),
        (
            7,
            b"\x06\x00\x00\x00abc",
            {"datatype": "BYTES", "shape": [1]},
            "declares 6 bytes but only 3 remain",
        ),
        (
            6,
            b"\x01\x00\x00\x00ab",
            {"datatype": "BYTES", "shape": [1]},
            "1 bytes of BYTES data remain",
        ),
    ],
)
def test_bad_binary_input_names_the_input(
    size: Any, payload: bytes, kwargs: dict[str, Any], match: str
) -> None:
    body, header_length = _binary_body(size, payload, **kwargs)
    with pytest.raises(InvalidArgumentError, match=match) as info:
        decode_infer_request(body, header_length, "m", "")
    assert "input 'INPUT0'" in info.value.message


def test_leftover_binary_bytes_are_an_error() -> None:
    body, header_length = _binary_body(8, b"\x00" * 8 + b"extra")
    with pytest.raises(InvalidArgumentError, match="binary data size mismatch") as info:
        decode_infer_request(body, header_length, "m", "")
    assert "13 bytes" in info.value.message
    assert "binary_data_size" in info.value.message


def test_binary_bytes_without_binary_inputs_are_an_error() -> None:
    header = _body(_input())
    with pytest.raises(InvalidArgumentError, match="binary data size mismatch"):
        decode_infer_request(header + b"\x00", len(header), "m", "")


def test_second_binary_input_overruns_the_body() -> None:
    header = orjson.dumps(
        {
            "inputs": [
                {
                    "name": "A",
                    "datatype": "UINT8",
                    "shape": [2],
                    "parameters": {"binary_data_size": 2},
                },
                {
                    "name": "B",
                    "datatype": "UINT8",
                    "shape": [2],
                    "parameters": {"binary_data_size": 2},
                },
            ]
        }
    )
    with pytest.raises(InvalidArgumentError, match="input 'B': binary_data_size is 2 but only 1"):
        decode_infer_request(header + b"\x01\x02\x03", len(header), "m", "")


def test_header_length_larger_than_body() -> None:
    body = _body(_input())
    with pytest.raises(InvalidArgumentError, match="Inference-Header-Content-Length") as info:
        decode_infer_request(body, len(body) + 1, "m", "")
    assert str(len(body) + 1) in info.value.message


def test_header_length_cutting_the_json_short() -> None:
    body = _body(_input())
    with pytest.raises(InvalidArgumentError, match="malformed JSON"):
        decode_infer_request(body, len(body) - 1, "m", "")


def test_data_and_binary_data_size_together() -> None:
    body, header_length = _binary_body(8, b"\x00" * 8)
    doc = json.loads(body[:header_length])
    doc["inputs"][0]["data"] = [1.0, 2.0]
    header = json.dumps(doc).encode()
    with pytest.raises(InvalidArgumentError, match=r"input 'INPUT0'.*both 'data' and"):
        decode_infer_request(header + b"\x00" * 8, len(header), "m", "")


def test_shared_memory_inputs_are_placeholders_for_the_data_plane() -> None:
    params = {"shared_memory_region": "r0", "shared_memory_byte_size": 8}
    request = decode_infer_request(_body(_input(data=_DROP, parameters=params)), None, "m", "")
    (tensor,) = request.inputs
    assert tensor.parameters == params
    assert tensor.data.size == 0
    assert tensor.data.dtype == np.int32


def test_shared_memory_input_with_data_is_an_error() -> None:
    body = _body(_input(parameters={"shared_memory_region": "r0", "shared_memory_byte_size": 8}))
    with pytest.raises(InvalidArgumentError, match=r"input 'INPUT0'.*shared memory"):
        decode_infer_request(body, None, "m", "")


def test_shared_memory_outputs_keep_their_parameters() -> None:
    params = {"shared_memory_region": "r1", "shared_memory_byte_size": 64}
    body = _body(_input(), outputs=[{"name": "OUTPUT0", "parameters": params}])
    assert decode_infer_request(body, None, "m", "").outputs[0].parameters == params


# -- responses: details ----------------------------------------------------------------------------


def test_response_without_id_or_parameters_omits_them() -> None:
    response = InferResponse("m", "1", [Tensor("O", "INT8", (1,), np.array([1], np.int8))])
    doc = orjson.loads(encode_infer_response(response, {}, {}).body)
    assert doc == {
        "model_name": "m",
        "model_version": "1",
        "outputs": [{"name": "O", "datatype": "INT8", "shape": [1], "data": [1]}],
    }


def test_response_outputs_keep_their_order_and_binary_follows_json_header() -> None:
    a = np.array([1, 2], dtype=np.uint16)
    b = np.array([b"xy"], dtype=np.object_)
    c = np.array([[True], [False]])
    response = response_of([("A", "UINT16", a), ("B", "BYTES", b), ("C", "BOOL", c)])
    encoded = encode_infer_response(
        response, {"B": {"binary_data": False}}, {"binary_data_output": True}
    )
    assert encoded.header_length is not None
    header = json.loads(encoded.body[: encoded.header_length])
    assert [o["name"] for o in header["outputs"]] == ["A", "B", "C"]
    assert header["outputs"][1]["data"] == ["xy"]
    assert encoded.body[encoded.header_length :] == b"\x01\x00\x02\x00" + b"\x01\x00"


def test_response_binary_data_false_overrides_binary_data_output() -> None:
    response = response_of([("A", "FP32", np.array([0.5], np.float32))])
    encoded = encode_infer_response(
        response, {"A": {"binary_data": False}}, {"binary_data_output": True}
    )
    assert encoded.header_length is None
    assert orjson.loads(encoded.body)["outputs"][0]["data"] == [0.5]


def test_response_non_contiguous_output_is_row_major() -> None:
    array = np.arange(6, dtype=np.int32).reshape(2, 3).T
    response = response_of([("A", "INT32", array)])
    both: list[Parameters] = [{}, {"binary_data_output": True}]
    for params in both:
        _, arrays = client_decode(encode_infer_response(response, {}, params))
        assert arrays["A"].tolist() == array.tolist()


def test_response_json_of_non_utf8_bytes_names_the_output() -> None:
    response = response_of([("OUTPUT3", "BYTES", np.array([b"\xff"], dtype=np.object_))])
    with pytest.raises(InvalidArgumentError, match=r"output 'OUTPUT3'.*binary_data"):
        encode_infer_response(response, {}, {})
    # ... but it can be sent binary.
    encoded = encode_infer_response(response, {}, {"binary_data_output": True})
    assert client_decode(encoded)[1]["OUTPUT3"].tolist() == [b"\xff"]


def test_array_to_json() -> None:
    assert array_to_json("O", "BF16", np.array([[1.5]], dtype=BF16)).tolist() == [1.5]
    assert array_to_json("O", "BYTES", np.array([b"a", "b", 3], dtype=np.object_)) == [
        "a",
        "b",
        "3",
    ]
    assert array_to_json("O", "INT8", np.array(5, dtype=np.int8)).tolist() == [5]


def test_json_helpers() -> None:
    assert orjson.loads(error_body('bad "thing"')) == {"error": 'bad "thing"'}
    assert dumps({"a": np.array([1, 2], dtype=np.int64)}) == b'{"a":[1,2]}'
    assert parse_json(b'{"a": 1}', "x") == {"a": 1}
    with pytest.raises(InvalidArgumentError, match="malformed JSON in the thing"):
        parse_json(b"{", "the thing")


def test_request_and_response_of_the_same_tensors_agree() -> None:
    # A decoded request's inputs encode to the response a client decodes back to the same arrays.
    tensors = [
        ("A", "FP16", np.array([[0.5, -2.0]], dtype=np.float16)),
        ("B", "BYTES", np.array([b"q", b""], dtype=np.object_)),
    ]
    body, header_length = client_request(tensors, [True, False])
    request: InferRequest = decode_infer_request(body, header_length, "m", "")
    response = InferResponse("m", "1", request.inputs)
    _, arrays = client_decode(encode_infer_response(response, {}, {"binary_data_output": True}))
    for name, _, array in tensors:
        assert_same(arrays[name], array)


def test_binary_bool_must_be_zero_or_one() -> None:
    body = _body(
        _input(datatype="BOOL", shape=[1, 2], data=_DROP, parameters={"binary_data_size": 2})
    )
    with pytest.raises(InvalidArgumentError, match="BOOL bytes must be 0 or 1"):
        decode_infer_request(body + b"\x01\x02", len(body), "m", "")


@pytest.mark.parametrize(
    ("doc", "match"),
    [
        ({"parameters": {"binary_data_output": "false"}}, "'binary_data_output' must be a boolean"),
        ({"outputs": [{"name": "Y", "parameters": {"binary_data": 1}}]}, "'binary_data'"),
    ],
)
def test_binary_switches_must_be_booleans(doc: dict[str, Any], match: str) -> None:
    body = orjson.dumps(
        {"inputs": [{"name": "X", "datatype": "FP32", "shape": [1], "data": [1.0]}], **doc}
    )
    with pytest.raises(InvalidArgumentError, match=match):
        decode_infer_request(body, None, "m", "")
