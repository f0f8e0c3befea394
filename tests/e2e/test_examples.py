"""The built-in examples answer exactly as Triton's quick-start models do, through tritonclient."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.http as httpclient
import tritonclient.http.aio as aiohttpclient

from tests.support import ServerProcess

pytestmark = pytest.mark.e2e

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.ones((1, 16), dtype=np.int32)


def _simple_inputs(binary: bool, module: object = httpclient) -> list[httpclient.InferInput]:
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "INT32"),
        httpclient.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_data_from_numpy(A, binary_data=binary)
    inputs[1].set_data_from_numpy(B, binary_data=binary)
    return inputs


@pytest.mark.parametrize("binary", [False, True])
def test_simple_sync(examples_server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("simple")
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple", _simple_inputs(binary), outputs=outputs, request_id="42")
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    response = result.get_response()
    assert response["model_name"] == "simple"
    assert response["model_version"] == "1"
    assert response["id"] == "42"
    client.close()


def test_simple_default_outputs(examples_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    result = client.infer("simple", _simple_inputs(True))  # no outputs: all, binary
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), A - B)
    client.close()


@pytest.mark.parametrize("binary", [False, True])
async def test_simple_aio(examples_server: ServerProcess, binary: bool) -> None:
    client = aiohttpclient.InferenceServerClient(examples_server.url)
    try:
        assert await client.is_server_ready()
        outputs = [aiohttpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
        result = await client.infer("simple", _simple_inputs(binary), outputs=outputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
        assert result.as_numpy("OUTPUT1") is None  # not requested
        metadata = await client.get_model_metadata("simple")
        assert metadata["inputs"][0] == {"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}
    finally:
        await client.close()


@pytest.mark.parametrize("binary", [False, True])
def test_simple_string(examples_server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    b = np.array([[b"1"] * 16], dtype=np.object_)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "BYTES"),
        httpclient.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(a, binary_data=binary)
    inputs[1].set_data_from_numpy(b, binary_data=binary)
    outputs = [
        httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary),
        httpclient.InferRequestedOutput("OUTPUT1", binary_data=binary),
    ]
    result = client.infer("simple_string", inputs, outputs=outputs)
    sums = result.as_numpy("OUTPUT0")
    diffs = result.as_numpy("OUTPUT1")
    assert sums is not None
    assert diffs is not None
    assert [int(x) for x in sums.reshape(-1)] == [i + 1 for i in range(16)]
    assert [int(x) for x in diffs.reshape(-1)] == [i - 1 for i in range(16)]
    client.close()


def test_simple_string_bad_number_fails_alone(examples_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    bad = np.array([[b"x"] * 16], dtype=np.object_)
    inputs = [
        httpclient.InferInput("INPUT0", [1, 16], "BYTES"),
        httpclient.InferInput("INPUT1", [1, 16], "BYTES"),
    ]
    inputs[0].set_data_from_numpy(bad)
    inputs[1].set_data_from_numpy(bad)
    with pytest.raises(Exception, match="must hold decimal integers"):
        client.infer("simple_string", inputs)
    assert client.is_model_ready("simple_string")
    client.close()


@pytest.mark.parametrize("binary", [False, True])
def test_simple_identity(examples_server: ServerProcess, binary: bool) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    data = np.array([[b"hello", "wörld".encode(), b""]], dtype=np.object_)
    inputs = [httpclient.InferInput("INPUT0", [1, 3], "BYTES")]
    inputs[0].set_data_from_numpy(data, binary_data=binary)
    outputs = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)]
    result = client.infer("simple_identity", inputs, outputs=outputs)
    got = result.as_numpy("OUTPUT0")
    assert got is not None
    # tritonclient hands BYTES outputs sent as JSON back as str, as it does with Triton.
    expected = data if binary else np.vectorize(lambda b: b.decode(), otypes=[object])(data)
    np.testing.assert_array_equal(got, expected)
    client.close()


def test_identity_fp32_batch(examples_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    data = np.random.default_rng(0).standard_normal((5, 7)).astype(np.float32)
    inputs = [httpclient.InferInput("INPUT0", [5, 7], "FP32")]
    inputs[0].set_data_from_numpy(data)
    result = client.infer("identity_fp32", inputs)
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    client.close()


def test_server_and_model_metadata(examples_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    server = client.get_server_metadata()
    assert server["name"] == "infermux"
    assert "binary_tensor_data" in server["extensions"]
    config = client.get_model_config("simple")
    assert config["max_batch_size"] == 8
    assert config["input"][0]["dims"] == [16]
    assert config["input"][0]["data_type"] == "TYPE_INT32"
    index = client.get_model_repository_index()
    assert {(m["name"], m["state"]) for m in index} >= {
        ("simple", "READY"),
        ("simple_string", "READY"),
        ("simple_identity", "READY"),
        ("identity_fp32", "READY"),
    }
    client.close()


def test_compressed_request_and_response(examples_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(examples_server.url)
    for algorithm in ("gzip", "deflate"):
        result = client.infer(
            "simple",
            _simple_inputs(True),
            request_compression_algorithm=algorithm,
            response_compression_algorithm=algorithm,
        )
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), A + B)
    client.close()
