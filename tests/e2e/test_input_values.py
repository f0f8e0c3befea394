"""Input values and shapes the codecs refuse over both transports, black-box (issue 23): more
than numpy's 64 dimensions (a 500 / INTERNAL before), and in JSON data booleans among numbers
(read as 1 and 0 before) and numbers past FP16/FP32 range (sent on as inf and answered as
null before). Each is a 400 / INVALID_ARGUMENT naming the input; the server keeps serving."""

from __future__ import annotations

from typing import Any

import grpc
import httpx
import pytest
from tritonclient.grpc import service_pb2

from tests.support import ServerProcess

pytestmark = pytest.mark.e2e


def infer_json(server: ServerProcess, model: str, item: dict[str, Any]) -> httpx.Response:
    return httpx.post(
        f"http://{server.url}/v2/models/{model}/infer", json={"inputs": [item]}, timeout=30
    )


def test_more_than_64_dimensions_is_400_over_http(test_server: ServerProcess) -> None:
    item = {"name": "INPUT0", "datatype": "FP32", "shape": [1] * 65, "data": [1.0]}
    response = infer_json(test_server, "identity_fp32", item)
    assert response.status_code == 400, response.text
    assert "input 'INPUT0': shape has 65 dimensions; at most 64" in response.json()["error"]


def test_more_than_64_dimensions_is_invalid_argument_over_grpc(
    test_server: ServerProcess,
) -> None:
    request = service_pb2.ModelInferRequest(model_name="identity_fp32")
    item = request.inputs.add(name="INPUT0", datatype="FP32", shape=[1] * 65)
    item.contents.fp32_contents.append(1.0)
    raw = service_pb2.ModelInferRequest(model_name="identity_fp32")
    raw.inputs.add(name="INPUT0", datatype="FP32", shape=[1] * 70)
    raw.raw_input_contents.append(b"\0\0\0\0")
    with grpc.insecure_channel(test_server.grpc_url) as channel:
        call = channel.unary_unary("/inference.GRPCInferenceService/ModelInfer")
        for message, rank in ((request, 65), (raw, 70)):
            with pytest.raises(grpc.RpcError) as info:
                call(message.SerializeToString(), timeout=30)
            assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
            assert f"input 'INPUT0': shape has {rank} dimensions" in str(info.value.details())


@pytest.mark.parametrize(
    ("datatype", "data", "match"),
    [
        ("INT32", [[1, True]], "'data' holds boolean values, which are not valid for datatype"),
        ("INT64", [[False, 0]], "'data' holds boolean values"),
        ("FP32", [[0.5, True]], "'data' holds boolean values"),
        ("FP32", [[1.0, 3.5e38]], "a value is out of range for datatype FP32"),
        ("FP16", [[1.0, 70000.0]], "a value is out of range for datatype FP16"),
        ("INT32", [[1.0, 2.5]], "non-integer values"),
        ("INT8", [[1, 300]], "out of range for datatype INT8"),
    ],
)
def test_json_values_the_datatype_cannot_hold_are_400(
    test_server: ServerProcess, datatype: str, data: list[Any], match: str
) -> None:
    item = {"name": "INPUT0", "datatype": datatype, "shape": [1, 2], "data": data}
    response = infer_json(test_server, f"identity_{datatype.lower()}", item)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert "input 'INPUT0'" in error, error
    assert match in error, error
    good = {"name": "INPUT0", "datatype": datatype, "shape": [1, 2], "data": [[1, 0]]}
    response = infer_json(test_server, f"identity_{datatype.lower()}", good)
    assert response.status_code == 200, response.text
    assert response.json()["outputs"][0]["data"] == [1, 0]
