"""Triton gRPC messages <-> infermux types (``infermux.frontends.grpc.codec``).

Requests are built the way clients build them: tritonclient's own ``InferInput`` for raw contents,
and the typed ``InferTensorContents`` lists filled directly. Responses are read back with
tritonclient's ``InferResult`` after a trip through the protobuf wire format.
"""

from __future__ import annotations

from typing import Any

import hypothesis.extra.numpy as hnp
import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tritonclient.grpc import InferInput, InferResult, model_config_pb2, service_pb2

from infermux.errors import InvalidArgumentError
from infermux.frontends.grpc import codec
from infermux.model_config import ModelConfig
from infermux.types import (
    DATATYPES,
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    BatchStats,
    Duration,
    InferResponse,
    ModelMetadata,
    ModelStats,
    Parameters,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
    Tensor,
    TensorMetadata,
    element_count,
    numpy_dtype,
)

PROPERTY = settings(max_examples=20, deadline=None, derandomize=True, database=None)
SHAPES = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=4)
BF16 = np.dtype(ml_dtypes.bfloat16)


@st.composite
def arrays_for(draw: st.DrawFn, datatype: str) -> npt.NDArray[Any]:
    """Any array of ``datatype``: NaNs and infinities included, BYTES arbitrary binary."""
    shape = draw(SHAPES)
    if datatype == "BYTES":
        count = element_count(shape)
        items = draw(st.lists(st.binary(max_size=6), min_size=count, max_size=count))
        out = np.empty(count, dtype=np.object_)
        for i, item in enumerate(items):
            out[i] = item
        return out.reshape(shape)
    if datatype == "BF16":
        return draw(hnp.arrays(np.uint16, shape)).view(BF16)
    return draw(hnp.arrays(numpy_dtype(datatype), shape))


def assert_same(got: npt.NDArray[Any], want: npt.NDArray[Any]) -> None:
    assert got.shape == want.shape
    assert got.dtype == want.dtype
    if want.dtype == np.object_:
        assert got.tolist() == want.tolist()
    else:  # bit-exact, so NaN payloads and -0.0 count too
        assert got.tobytes() == want.tobytes()


def raw_request(*inputs: InferInput) -> Any:
    """A request laid out exactly as tritonclient lays it out (``_get_inference_request``)."""
    message = service_pb2.ModelInferRequest(model_name="m", model_version="2", id="r1")
    for item in inputs:
        message.inputs.append(item._get_tensor())
        if item._get_content() is not None:
            message.raw_input_contents.append(item._get_content())
    return service_pb2.ModelInferRequest.FromString(message.SerializeToString())


def typed_input(name: str, datatype: str, shape: list[int], **contents: Any) -> Any:
    return service_pb2.ModelInferRequest.InferInputTensor(
        name=name,
        datatype=datatype,
        shape=shape,
        contents=service_pb2.InferTensorContents(**contents),
    )


# -- requests -------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
@PROPERTY
@given(data=st.data())
def test_raw_inputs_from_tritonclient_decode_exactly(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_for(datatype))
    item = InferInput("x", list(array.shape), datatype).set_data_from_numpy(array)
    request = codec.decode_infer_request(raw_request(item))
    assert (request.model_name, request.model_version, request.id) == ("m", "2", "r1")
    (tensor,) = request.inputs
    assert (tensor.name, tensor.datatype, tensor.shape) == ("x", datatype, array.shape)
    assert_same(tensor.data, array)


@pytest.mark.parametrize("datatype", sorted(codec.CONTENTS_FIELD))
@PROPERTY
@given(data=st.data())
def test_typed_contents_decode_exactly(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_for(datatype))
    field = codec.CONTENTS_FIELD[datatype]
    message = service_pb2.ModelInferRequest(
        model_name="m",
        inputs=[
            typed_input("x", datatype, list(array.shape), **{field: array.reshape(-1).tolist()})
        ],
    )
    (tensor,) = codec.decode_infer_request(message).inputs
    if array.dtype.kind == "f":  # floats go through Python floats: values, not bits, survive
        np.testing.assert_array_equal(tensor.data, array)
        assert tensor.data.dtype == array.dtype
    else:
        assert_same(tensor.data, array)


def test_inputs_outputs_and_parameters_decode() -> None:
    a = InferInput("a", [2], "INT32").set_data_from_numpy(np.array([1, 2], np.int32))
    a._get_tensor().parameters["note"].string_param = "hi"
    message = raw_request(a)
    message.parameters["priority"].uint64_param = 2
    message.parameters["flag"].bool_param = True
    message.parameters["ratio"].double_param = 0.5
    message.outputs.add(name="y").parameters["k"].int64_param = -3
    message.outputs.add(name="z")
    request = codec.decode_infer_request(message)
    assert request.parameters == {"priority": 2, "flag": True, "ratio": 0.5}
    assert request.inputs[0].parameters == {"note": "hi"}
    assert [(o.name, o.parameters) for o in request.outputs] == [("y", {"k": -3}), ("z", {})]


def test_shared_memory_inputs_get_a_placeholder_and_take_no_raw_entry() -> None:
    shm = InferInput("s", [2, 2], "FP16").set_shared_memory("region", 8, offset=4)
    raw = InferInput("r", [1], "FP32").set_data_from_numpy(np.array([7], np.float32))
    request = codec.decode_infer_request(raw_request(shm, raw))
    placeholder, data = request.inputs
    assert placeholder.parameters == {SHM_REGION: "region", SHM_BYTE_SIZE: 8, SHM_OFFSET: 4}
    assert placeholder.shape == (2, 2)
    assert placeholder.data.size == 0
    assert placeholder.data.dtype == np.float16
    assert data.data.tolist() == [7.0]


def test_empty_tensor_needs_no_data() -> None:
    message = service_pb2.ModelInferRequest(
        inputs=[
            service_pb2.ModelInferRequest.InferInputTensor(name="e", datatype="FP16", shape=[0, 3])
        ]
    )
    (tensor,) = codec.decode_infer_request(message).inputs
    assert tensor.data.shape == (0, 3)


def _request(*inputs: Any, raw: list[bytes] | None = None) -> Any:
    return service_pb2.ModelInferRequest(
        model_name="m", inputs=inputs, raw_input_contents=raw or []
    )


def _header(name: str, datatype: str, shape: list[int]) -> Any:
    return service_pb2.ModelInferRequest.InferInputTensor(name=name, datatype=datatype, shape=shape)


def _no_value_parameter() -> Any:
    message = _request(_header("a", "INT32", [0]))
    message.parameters["p"].SetInParent()  # an entry whose oneof is unset
    return message


def _shm_with_contents() -> Any:
    item = typed_input("a", "INT32", [1], int_contents=[1])
    item.parameters[SHM_REGION].string_param = "r"
    return _request(item)


BAD_REQUESTS = [
    pytest.param(
        _request(_header("a", "INT32", [1]), _header("b", "INT32", [1]), raw=[b"\0" * 4]),
        "input 'b': has no data: raw_input_contents has only 1 entries",
        id="too-few-raw",
    ),
    pytest.param(
        _request(_header("a", "INT32", [1]), raw=[b"\0" * 4, b""]),
        "raw_input_contents has 2 entries but only 1 inputs take raw data",
        id="too-many-raw",
    ),
    pytest.param(
        _request(typed_input("a", "INT32", [1], int_contents=[1]), raw=[b"\0" * 4]),
        "input 'a': contents must not be set when raw_input_contents is used",
        id="contents-and-raw",
    ),
    pytest.param(
        _request(_header("a", "INT32", [2]), raw=[b"\0" * 4]),
        "input 'a': got 4 bytes",
        id="raw-size",
    ),
    pytest.param(
        _request(typed_input("h", "FP16", [1], fp32_contents=[1.0])),
        "input 'h': FP16 data must be sent in raw_input_contents",
        id="fp16-typed",
    ),
    pytest.param(
        _request(typed_input("a", "INT32", [1], fp32_contents=[1.0])),
        "input 'a': datatype INT32 is carried in 'int_contents', not 'fp32_contents'",
        id="wrong-list",
    ),
    pytest.param(
        _request(typed_input("a", "INT64", [2, 2], int64_contents=[1, 2, 3])),
        "input 'a': 'int64_contents' has 3 elements but shape [2, 2] needs 4",
        id="typed-count",
    ),
    pytest.param(
        _request(typed_input("a", "UINT8", [2], uint_contents=[1, 256])),
        "input 'a': a value in 'uint_contents' is out of range for datatype UINT8",
        id="narrow-range",
    ),
    pytest.param(
        _request(_header("a", "FP32", [3])),
        "input 'a': has no data (neither contents nor raw_input_contents)",
        id="no-data",
    ),
    pytest.param(
        _request(_header("a", "FP8", [1])),
        "input 'a': datatype must be one of",
        id="datatype",
    ),
    pytest.param(_request(_header("", "FP32", [1])), "inputs[0]: field 'name'", id="no-name"),
    pytest.param(
        _request(_header("a", "FP32", [-1])), "input 'a': shape [-1] has a negative", id="shape"
    ),
    pytest.param(_no_value_parameter(), "request: parameter 'p' has no value", id="parameter"),
    pytest.param(
        _shm_with_contents(), "input 'a': has both shared memory and contents", id="shm-contents"
    ),
]


@pytest.mark.parametrize(("message", "expected"), BAD_REQUESTS)
def test_bad_requests_name_what_is_wrong(message: Any, expected: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        codec.decode_infer_request(message)
    assert expected in caught.value.message


# -- parameters -----------------------------------------------------------------------------------

PARAMETER_VALUES = st.one_of(
    st.booleans(),
    st.integers(-(2**63), 2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=8),
)


@PROPERTY
@given(st.dictionaries(st.text(max_size=8), PARAMETER_VALUES, max_size=6))
def test_parameters_round_trip_with_their_types(parameters: Parameters) -> None:
    message = service_pb2.ModelInferResponse()
    codec.encode_parameters(parameters, message.parameters)
    wire = service_pb2.ModelInferResponse.FromString(message.SerializeToString())
    decoded = codec.decode_parameters(wire.parameters, "test")
    assert decoded == parameters
    assert {k: type(v) for k, v in decoded.items()} == {k: type(v) for k, v in parameters.items()}


def test_parameters_beyond_64_bits_are_refused() -> None:
    message = service_pb2.ModelInferResponse()
    with pytest.raises(InvalidArgumentError, match="parameter 'big'"):
        codec.encode_parameters({"big": 2**64}, message.parameters)


# -- responses ------------------------------------------------------------------------------------


@pytest.mark.parametrize("datatype", DATATYPES)
@PROPERTY
@given(data=st.data())
def test_responses_read_back_with_tritonclient(datatype: str, data: st.DataObject) -> None:
    array = data.draw(arrays_for(datatype))
    other = np.arange(3, dtype=np.int32)
    response = InferResponse(
        model_name="m",
        model_version="1",
        id="abc",
        outputs=[
            Tensor("y", datatype, array.shape, array, {"note": "x"}),
            Tensor("z", "INT32", (3,), other),
        ],
    )
    wire = codec.encode_infer_response(response).SerializeToString()
    result = InferResult(service_pb2.ModelInferResponse.FromString(wire))
    assert_same(result.as_numpy("y"), array)
    assert_same(result.as_numpy("z"), other)
    raw = result.get_response()
    assert (raw.model_name, raw.model_version, raw.id) == ("m", "1", "abc")
    assert raw.outputs[0].parameters["note"].string_param == "x"


def test_shared_memory_outputs_keep_their_place() -> None:
    shm: Parameters = {SHM_REGION: "out", SHM_BYTE_SIZE: 16}
    response = InferResponse(
        model_name="m",
        model_version="1",
        parameters={"sequence_end": True},
        outputs=[
            Tensor("in_shm", "FP32", (2, 2), np.empty(0, np.float32), shm),
            Tensor("inline", "FP32", (1,), np.array([2.5], np.float32)),
        ],
    )
    message = codec.encode_infer_response(response)
    assert list(message.raw_output_contents) == [b"", np.float32(2.5).tobytes()]
    assert list(message.outputs[0].shape) == [2, 2]
    assert not message.outputs[0].parameters  # as Triton: the region is not echoed
    assert codec.decode_parameters(message.parameters, "r") == {"sequence_end": True}
    assert InferResult(message).as_numpy("inline").tolist() == [2.5]


def test_statistics_keep_exact_counts() -> None:
    big = 2**63 + 5  # beyond int64: statistics are uint64 on the wire
    stats = ModelStats(
        name="m",
        version="3",
        last_inference=1_700_000_000_000,
        inference_count=big,
        execution_count=7,
        inference_stats={"success": Duration(4, 1000), "fail": Duration(1, 50)},
        batch_stats=(BatchStats(2, Duration(1, 10), Duration(1, 20), Duration(1, 30)),),
        response_stats={
            "0": {"compute_infer": Duration(3, 300), "success": Duration(3, big)},
            "1": {"cancel": Duration(1, 9)},
        },
    )
    message = codec.statistics_response([stats])
    (entry,) = message.model_stats
    assert (entry.name, entry.version, entry.inference_count) == ("m", "3", big)
    assert (entry.last_inference, entry.execution_count) == (1_700_000_000_000, 7)
    assert (entry.inference_stats.success.count, entry.inference_stats.success.ns) == (4, 1000)
    assert entry.inference_stats.fail.count == 1
    assert entry.inference_stats.queue.count == 0
    (batch,) = entry.batch_stats
    assert batch.batch_size == 2
    assert [batch.compute_input.ns, batch.compute_infer.ns, batch.compute_output.ns] == [10, 20, 30]
    # Triton's per-response statistics of a decoupled model, keyed by the response's index.
    assert sorted(entry.response_stats) == ["0", "1"]
    first = entry.response_stats["0"]
    assert (first.compute_infer.count, first.compute_infer.ns) == (3, 300)
    assert (first.success.count, first.success.ns) == (3, big)
    assert entry.response_stats["1"].cancel.ns == 9
    assert entry.response_stats["1"].fail.count == 0


def test_metadata_index_shm_and_config_responses() -> None:
    server = codec.server_metadata_response(ServerMetadata("infermux", "1.0", ("a", "b")))
    assert (server.name, server.version, list(server.extensions)) == ("infermux", "1.0", ["a", "b"])
    meta = ModelMetadata("m", ("1", "2"), "python", (TensorMetadata("x", "FP32", (-1, 3)),), ())
    model = codec.model_metadata_response(meta)
    assert (model.name, list(model.versions), model.platform) == ("m", ["1", "2"], "python")
    assert [(t.name, t.datatype, list(t.shape)) for t in model.inputs] == [("x", "FP32", [-1, 3])]
    index = codec.repository_index_response([RepositoryIndexEntry("m", "1", "READY", "")])
    assert [(e.name, e.version, e.state) for e in index.models] == [("m", "1", "READY")]
    shm = codec.shm_status_response([SharedMemoryRegion("r", "/key", 8, 64)])
    region = shm.regions["r"]
    assert (region.name, region.key, region.offset, region.byte_size) == ("r", "/key", 8, 64)
    config = ModelConfig.from_proto(
        model_config_pb2.ModelConfig(
            name="m",
            backend="python",
            max_batch_size=4,
            input=[
                model_config_pb2.ModelInput(
                    name="x", data_type=model_config_pb2.TYPE_FP32, dims=[3]
                )
            ],
            output=[
                model_config_pb2.ModelOutput(
                    name="y", data_type=model_config_pb2.TYPE_FP32, dims=[3]
                )
            ],
        )
    )
    reply = codec.model_config_response(config)
    assert reply.config.name == "m"
    assert reply.config.max_batch_size == 4
    assert reply.config.input[0].dims == [3]


def test_a_shape_of_more_than_64_dimensions_names_the_input() -> None:
    """Issue 23: numpy holds 64 dimensions; 65 was an INTERNAL error."""
    request = service_pb2.ModelInferRequest(model_name="m")
    item = request.inputs.add(name="INPUT0", datatype="INT32", shape=[1] * 65)
    item.contents.int_contents.append(1)
    with pytest.raises(InvalidArgumentError, match="input 'INPUT0': shape has 65 dimensions"):
        codec.decode_infer_request(request)
