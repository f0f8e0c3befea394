"""The generate extension's JSON <-> InferRequest/InferResponse mapping."""

from __future__ import annotations

import json

import numpy as np
import pytest
from google.protobuf import json_format

from infermux.errors import InternalError, InvalidArgumentError
from infermux.frontends.http import generate
from infermux.model_config import ModelConfig, pb
from infermux.types import InferResponse, Tensor


def config(max_batch_size: int = 8) -> ModelConfig:
    doc = {
        "name": "m",
        "backend": "python",
        "max_batch_size": max_batch_size,
        "input": [
            {"name": "TEXT", "data_type": "TYPE_STRING", "dims": [1]},
            {"name": "IDS", "data_type": "TYPE_INT32", "dims": [2, -1]},
            {"name": "OPT", "data_type": "TYPE_BOOL", "dims": [1], "optional": True},
        ],
        "output": [{"name": "OUT", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
    return ModelConfig.from_proto(json_format.ParseDict(doc, pb.ModelConfig()))


def test_inputs_take_the_config_datatype_and_shape_and_other_scalars_are_parameters() -> None:
    doc = {"TEXT": "hi", "IDS": [1, 2, 3, 4], "temperature": 0.5, "parameters": {"k": 3}}
    request = generate.decode_request(doc, config(), "2")
    assert (request.model_name, request.model_version) == ("m", "2")
    text, ids = request.inputs
    assert (text.datatype, text.shape, text.data.tolist()) == ("BYTES", (1, 1), [[b"hi"]])
    assert (ids.datatype, ids.shape) == ("INT32", (1, 2, 2))
    assert ids.data.dtype == np.int32
    assert request.parameters == {"k": 3, "temperature": 0.5}
    unbatched = generate.decode_request(doc, config(max_batch_size=0), "")
    assert unbatched.inputs[1].shape == (2, 2)


@pytest.mark.parametrize(
    ("doc", "named"),
    [
        ([1], "JSON object"),
        ({"IDS": [1, 2]}, "input 'TEXT'"),
        ({"TEXT": "a", "IDS": [1, 2, 3]}, "input 'IDS'"),
        ({"TEXT": "a", "IDS": ["x", "y"]}, "input 'IDS'"),
        ({"TEXT": {"a": 1}, "IDS": [1, 2]}, "input 'TEXT'"),
        ({"TEXT": "a", "IDS": [1, 2], "EXTRA": [1]}, "field 'EXTRA'"),
        ({"TEXT": "a", "IDS": [1, 2], "parameters": "p"}, "field 'parameters'"),
        ({"TEXT": "a", "IDS": [1, 2], "parameters": {"p": None}}, "field 'parameters.p'"),
    ],
)
def test_a_bad_request_names_the_field(doc: object, named: str) -> None:
    with pytest.raises(InvalidArgumentError, match=named):
        generate.decode_request(doc, config(), "")


def test_a_response_is_flat_scalars_for_one_element_lists_otherwise() -> None:
    response = InferResponse(
        "m",
        "1",
        [
            Tensor("ONE", "FP32", (1, 1), np.array([[2.5]], np.float32)),
            Tensor("MANY", "INT64", (1, 3), np.array([[1, 2, 3]], np.int64)),
            Tensor("TEXT", "BYTES", (1,), np.array([b"out"], np.object_)),
        ],
    )
    doc = json.loads(generate.encode_response(response))
    assert doc == {
        "model_name": "m",
        "model_version": "1",
        "ONE": 2.5,
        "MANY": [1, 2, 3],
        "TEXT": "out",
    }


def test_events_are_sse_data_lines_and_a_failed_response_is_an_error_object() -> None:
    ok = InferResponse("m", "1", [Tensor("O", "INT32", (1,), np.array([7], np.int32))])
    assert generate.event(ok) == b'data: {"model_name":"m","model_version":"1","O":7}\n\n'
    failed = InferResponse("m", "1", [], error=InternalError("boom"))
    assert generate.event(failed) == b'data: {"error":"boom"}\n\n'
