"""An inference request for a model that does not exist is answered "unknown model", whatever
is wrong with its body (Triton checks the model first), over HTTP and gRPC."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess

pytestmark = pytest.mark.e2e

UNKNOWN = "Request for unknown model: 'nope' is not found"


def short_http_input() -> httpclient.InferInput:
    """INPUT0 declared [1, 4] but carrying three elements: a body fault."""
    tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3), np.float32))
    tensor.set_shape([1, 4])
    return tensor


def short_grpc_input() -> grpcclient.InferInput:
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.zeros((1, 3), np.float32))
    tensor.set_shape([1, 4])
    return tensor


def test_http_unknown_model_comes_before_the_body(test_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(test_server.url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("nope", [short_http_input()])
    assert caught.value.message() == UNKNOWN
    assert caught.value.status() == "404"
    with pytest.raises(InferenceServerException, match="INPUT0") as known:
        client.infer("identity_fp32", [short_http_input()])
    assert known.value.status() == "400"
    client.close()


def test_grpc_unknown_model_comes_before_the_body(test_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(test_server.grpc_url)
    with pytest.raises(InferenceServerException) as caught:
        client.infer("nope", [short_grpc_input()])
    assert caught.value.message() == UNKNOWN
    assert caught.value.status() == "StatusCode.NOT_FOUND"
    with pytest.raises(InferenceServerException, match="INPUT0") as known:
        client.infer("identity_fp32", [short_grpc_input()])
    assert known.value.status() == "StatusCode.INVALID_ARGUMENT"
    client.close()
