"""ONNX models served by the real server, answered over HTTP and gRPC by ``tritonclient``."""

from __future__ import annotations

import concurrent.futures
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.onnx_models import (
    ADD_SUB_CONFIG,
    MLP_CONFIG,
    add_sub_model,
    direct,
    identity_config,
    identity_model,
    mlp_model,
    write_onnx_model,
)
from tests.support import ServerProcess, start_server

onnx = pytest.importorskip("onnx")

pytestmark = pytest.mark.e2e

BATCHING = "dynamic_batching { max_queue_delay_microseconds: 2000 }\n"
Client = Any  # tritonclient.http or tritonclient.grpc InferenceServerClient


@pytest.fixture(scope="module")
def onnx_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("onnx_repo")
    write_onnx_model(repo, "mlp", mlp_model(), MLP_CONFIG + BATCHING)
    write_onnx_model(repo, "simple", add_sub_model(), ADD_SUB_CONFIG + BATCHING)
    echo = identity_model(onnx.TensorProto.STRING)
    write_onnx_model(repo, "echo", echo, identity_config("TYPE_STRING") + BATCHING)
    corrupt = write_onnx_model(repo, "corrupt", None, MLP_CONFIG)
    (corrupt / "1" / "model.onnx").write_bytes(b"\x08\x07 not an onnx model")
    with start_server("--model-repository", str(repo)) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture(params=["http", "grpc"])
def client(request: pytest.FixtureRequest, onnx_server: ServerProcess) -> Iterator[Client]:
    if request.param == "http":
        http = httpclient.InferenceServerClient(onnx_server.url)
        yield http
        http.close()
    else:
        grpc = grpcclient.InferenceServerClient(onnx_server.grpc_url)
        yield grpc
        grpc.close()


def infer(
    client: Client, model: str, inputs: dict[str, npt.NDArray[Any]], outputs: list[str]
) -> dict[str, npt.NDArray[Any]]:
    module = httpclient if isinstance(client, httpclient.InferenceServerClient) else grpcclient
    items = []
    for name, array in inputs.items():
        datatype = "BYTES" if array.dtype == np.object_ else "FP32"
        datatype = "INT32" if array.dtype == np.int32 else datatype
        item = module.InferInput(name, list(array.shape), datatype)
        item.set_data_from_numpy(array)
        items.append(item)
    wanted = [module.InferRequestedOutput(name) for name in outputs]
    result = client.infer(model, items, outputs=wanted)
    return {name: result.as_numpy(name) for name in outputs}


def test_mlp_answers_equal_onnxruntime(client: Client) -> None:
    x = np.random.default_rng(10).standard_normal((3, 4)).astype(np.float32)
    (expected,) = direct(mlp_model(), {"X": x})
    got = infer(client, "mlp", {"X": x}, ["Y"])["Y"]
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)


def test_two_inputs_two_outputs(client: Client) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    got = infer(client, "simple", {"INPUT0": a, "INPUT1": b}, ["OUTPUT0", "OUTPUT1"])
    np.testing.assert_array_equal(got["OUTPUT0"], a + b)
    np.testing.assert_array_equal(got["OUTPUT1"], a - b)


def test_string_tensors(client: Client) -> None:
    words = np.array([[b"onnx", "grüße".encode(), b""]], dtype=np.object_)
    got = infer(client, "echo", {"INPUT0": words}, ["OUTPUT0"])["OUTPUT0"]
    assert got.tolist() == words.tolist()


def test_sixteen_concurrent_requests(onnx_server: ServerProcess) -> None:
    rng = np.random.default_rng(11)
    xs = [rng.standard_normal((1 + i % 3, 4)).astype(np.float32) for i in range(16)]
    start = threading.Barrier(16)

    def call(i: int) -> npt.NDArray[Any]:
        # Alternate transports; each thread has its own client, so they really overlap.
        client: Client
        if i % 2:
            client = grpcclient.InferenceServerClient(onnx_server.grpc_url)
        else:
            client = httpclient.InferenceServerClient(onnx_server.url)
        start.wait(10)
        try:
            return infer(client, "mlp", {"X": xs[i]}, ["Y"])["Y"]
        finally:
            client.close()

    with concurrent.futures.ThreadPoolExecutor(16) as pool:
        results = list(pool.map(call, range(16)))
    for x, got in zip(xs, results, strict=True):
        np.testing.assert_allclose(got, direct(mlp_model(), {"X": x})[0], rtol=1e-5, atol=1e-6)


def test_metadata_reports_the_onnx_platform(onnx_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(onnx_server.url)
    metadata = client.get_model_metadata("mlp")
    assert metadata["platform"] == "onnxruntime_onnx"
    assert metadata["inputs"] == [{"name": "X", "datatype": "FP32", "shape": [-1, 4]}]
    client.close()


def test_corrupt_model_fails_to_load_with_its_reason(onnx_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(onnx_server.url)
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["corrupt"]["state"] == "UNAVAILABLE"
    assert "cannot load" in index["corrupt"]["reason"]
    assert str(Path("corrupt") / "1" / "model.onnx") in index["corrupt"]["reason"]
    assert index["mlp"]["state"] == "READY"
    assert client.is_model_ready("mlp")
    assert not client.is_model_ready("corrupt")
    client.close()
