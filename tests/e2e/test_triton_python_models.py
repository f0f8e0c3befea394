"""Triton Python-backend models (``class TritonPythonModel``, ``import triton_python_backend_utils
as pb_utils``) served unchanged by the real ``infermux serve``, driven by tritonclient.

``add_sub`` has the shape of Triton's python_backend example (its config, its use of the API,
its client's checks); the others exercise an error per request, BLS (a model calling
``add_sub`` through the server, sync and async), custom metrics and ``isolation: process``.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support import ServerProcess, parameter, start_server

pytestmark = pytest.mark.e2e

ADD_SUB_CONFIG = """
name: "{name}"
backend: "python"

input [
  {{
    name: "INPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }}
]
input [
  {{
    name: "INPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }}
]
output [
  {{
    name: "OUTPUT0"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }}
]
output [
  {{
    name: "OUTPUT1"
    data_type: TYPE_FP32
    dims: [ 4 ]
  }}
]

instance_group [{{ kind: KIND_CPU }}]
{extra}
"""

ADD_SUB_MODEL = """
import json

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.model_config = model_config = json.loads(args["model_config"])
        output0_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT0")
        output1_config = pb_utils.get_output_config_by_name(model_config, "OUTPUT1")
        self.output0_dtype = pb_utils.triton_string_to_numpy(output0_config["data_type"])
        self.output1_dtype = pb_utils.triton_string_to_numpy(output1_config["data_type"])

    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            out_0, out_1 = (
                in_0.as_numpy() + in_1.as_numpy(),
                in_0.as_numpy() - in_1.as_numpy(),
            )
            out_tensor_0 = pb_utils.Tensor("OUTPUT0", out_0.astype(self.output0_dtype))
            out_tensor_1 = pb_utils.Tensor("OUTPUT1", out_1.astype(self.output1_dtype))
            response = pb_utils.InferenceResponse(output_tensors=[out_tensor_0, out_tensor_1])
            responses.append(response)
        return responses

    def finalize(self):
        print("Cleaning up...")
"""

# Fails the requests whose INPUT0 starts negative, with the code INPUT1[0] names; answers others.
PICKY_MODEL = """
import triton_python_backend_utils as pb_utils

CODES = [pb_utils.TritonError.INVALID_ARG, pb_utils.TritonError.NOT_FOUND,
         pb_utils.TritonError.UNAVAILABLE]


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            y = pb_utils.get_input_tensor_by_name(request, "INPUT1").as_numpy()
            if x[0] < 0:
                error = pb_utils.TritonError("INPUT0 must not start negative", CODES[int(y[0])])
                responses.append(pb_utils.InferenceResponse(output_tensors=[], error=error))
            else:
                responses.append(pb_utils.InferenceResponse(
                    [pb_utils.Tensor("OUTPUT0", x), pb_utils.Tensor("OUTPUT1", y)]))
        return responses
"""

# Calls the model named by its MODEL_NAME input with its two inputs (Triton's BLS example).
BLS_MODEL = """
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            infer_request = pb_utils.InferenceRequest(
                model_name=model_name.decode(),
                requested_output_names=["OUTPUT0", "OUTPUT1"],
                inputs=[in_0, in_1],
            )
            infer_response = infer_request.exec()
            if infer_response.has_error():
                raise pb_utils.TritonModelException(infer_response.error().message())
            responses.append(pb_utils.InferenceResponse(infer_response.output_tensors()))
        return responses
"""

# The same through an async execute: both calls of a request overlap, awaited together.
ASYNC_BLS_MODEL = """
import asyncio

import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    async def execute(self, requests):
        responses = []
        for request in requests:
            in_0 = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            in_1 = pb_utils.get_input_tensor_by_name(request, "INPUT1")
            model_name = pb_utils.get_input_tensor_by_name(request, "MODEL_NAME").as_numpy()[0]
            calls = [
                pb_utils.InferenceRequest(
                    model_name=model_name.decode(),
                    requested_output_names=[name],
                    inputs=[in_0, in_1],
                ).async_exec()
                for name in ("OUTPUT0", "OUTPUT1")
            ]
            first, second = await asyncio.gather(*calls)
            if first.has_error():
                error = pb_utils.TritonError(first.error().message(), first.error().code())
                responses.append(pb_utils.InferenceResponse([], error=error))
                continue
            responses.append(pb_utils.InferenceResponse(
                first.output_tensors() + second.output_tensors()))
        return responses
"""

# add_sub that counts its requests and observes INPUT0[0] in Triton's custom metrics.
METRICS_MODEL = ADD_SUB_MODEL.replace(
    "    def execute(self, requests):\n",
    """        family = pb_utils.MetricFamily(
            name="add_sub_requests", description="requests seen", kind=pb_utils.COUNTER
        )
        self.requests = family.Metric(labels={"model": args["model_name"]})
        values = pb_utils.MetricFamily(
            "add_sub_first_value", "INPUT0[0]", pb_utils.MetricFamily.HISTOGRAM
        )
        self.values = values.Metric(labels={}, buckets=[0.5, 2.0])

    def execute(self, requests):
        self.requests.increment(len(requests))
        for request in requests:
            first = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()[0]
            self.values.observe(float(first))
""",
    1,
)

# add_sub whose config says only its backend: auto_complete_config gives the rest (README's).
AUTO_MODEL = ADD_SUB_MODEL.replace(
    "class TritonPythonModel:\n",
    """class TritonPythonModel:
    @staticmethod
    def auto_complete_config(auto_complete_model_config):
        config = auto_complete_model_config.as_dict()
        names = [i["name"] for i in config["input"]]
        for name in ("INPUT0", "INPUT1"):
            if name not in names:
                tensor = {"name": name, "data_type": "TYPE_FP32", "dims": [4]}
                auto_complete_model_config.add_input(tensor)
        for name in ("OUTPUT0", "OUTPUT1"):
            tensor = {"name": name, "data_type": "TYPE_FP32", "dims": [4]}
            auto_complete_model_config.add_output(tensor)
        auto_complete_model_config.set_max_batch_size(0)
        return auto_complete_model_config

""",
    1,
)
AUTO_CONFIG = 'backend: "python"\n{extra}'

BLS_CONFIG = ADD_SUB_CONFIG.replace(
    "instance_group",
    'input [ {{ name: "MODEL_NAME", data_type: TYPE_STRING, dims: [ 1 ] }} ]\ninstance_group',
)


def add_model(
    repo: Path, name: str, source: str, config: str = ADD_SUB_CONFIG, extra: str = ""
) -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(config.format(name=name, extra=extra))
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("triton_python")
    add_model(repo, "add_sub", ADD_SUB_MODEL)
    add_model(repo, "add_sub_isolated", ADD_SUB_MODEL, extra=parameter("isolation", "process"))
    add_model(repo, "picky", PICKY_MODEL)
    add_model(repo, "bls", BLS_MODEL, BLS_CONFIG)
    add_model(repo, "async_bls", ASYNC_BLS_MODEL, BLS_CONFIG)
    add_model(repo, "counted", METRICS_MODEL)
    add_model(repo, "auto", AUTO_MODEL, AUTO_CONFIG)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(repository), "--model-control-mode", "explicit"]
    with start_server(*args, "--load-model", "*") as server:
        yield server


def http_inputs(*arrays: np.ndarray) -> list[httpclient.InferInput]:
    inputs = []
    for name, array in zip(("INPUT0", "INPUT1", "MODEL_NAME"), arrays, strict=False):
        tensor = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inputs.append(tensor.set_data_from_numpy(array))
    return inputs


def grpc_inputs(*arrays: np.ndarray) -> list[grpcclient.InferInput]:
    inputs = []
    for name, array in zip(("INPUT0", "INPUT1", "MODEL_NAME"), arrays, strict=False):
        tensor = grpcclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inputs.append(tensor.set_data_from_numpy(array))
    return inputs


@pytest.mark.parametrize("model", ["add_sub", "add_sub_isolated", "auto"])
def test_add_sub_answers_as_in_triton_over_http_and_grpc(server: ServerProcess, model: str) -> None:
    rng = np.random.default_rng(0)
    input0, input1 = rng.random(4, dtype=np.float32), rng.random(4, dtype=np.float32)
    with httpclient.InferenceServerClient(server.url) as client:
        outputs = [httpclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
        response = client.infer(model, http_inputs(input0, input1), request_id="1", outputs=outputs)
        np.testing.assert_allclose(response.as_numpy("OUTPUT0"), input0 + input1)
        np.testing.assert_allclose(response.as_numpy("OUTPUT1"), input0 - input1)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    outputs_g = [grpcclient.InferRequestedOutput(n) for n in ("OUTPUT0", "OUTPUT1")]
    answer = grpc.infer(model, grpc_inputs(input0, input1), request_id="2", outputs=outputs_g)
    np.testing.assert_allclose(answer.as_numpy("OUTPUT0"), input0 + input1)
    np.testing.assert_allclose(answer.as_numpy("OUTPUT1"), input0 - input1)
    grpc.close()


def test_auto_complete_config_completes_a_config_that_names_only_the_backend(
    server: ServerProcess,
) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        config = client.get_model_config("auto")
    assert [t["name"] for t in config["input"]] == ["INPUT0", "INPUT1"]
    assert [t["data_type"] for t in config["output"]] == ["TYPE_FP32", "TYPE_FP32"]
    assert config["max_batch_size"] == 0


@pytest.mark.parametrize(
    ("code", "status", "grpc_status"),
    [(0, "400", "StatusCode.INVALID_ARGUMENT"), (1, "404", "StatusCode.NOT_FOUND"),
     (2, "503", "StatusCode.UNAVAILABLE")],
)  # fmt: skip
def test_an_error_response_fails_only_its_request_with_its_code(
    server: ServerProcess, code: int, status: str, grpc_status: str
) -> None:
    good = np.ones(4, np.float32)
    bad = np.array([-1, 0, 0, 0], np.float32)
    which = np.full(4, code, np.float32)
    with httpclient.InferenceServerClient(server.url) as client:
        with pytest.raises(InferenceServerException, match="must not start negative") as caught:
            client.infer("picky", http_inputs(bad, which))
        assert caught.value.status() == status
        answer = client.infer("picky", http_inputs(good, which))
        np.testing.assert_array_equal(answer.as_numpy("OUTPUT0"), good)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="must not start negative") as failed:
        grpc.infer("picky", grpc_inputs(bad, which))
    assert failed.value.status() == grpc_status
    grpc.close()


@pytest.mark.parametrize("model", ["bls", "async_bls"])
def test_bls_calls_another_model_through_the_server(server: ServerProcess, model: str) -> None:
    input0, input1 = np.arange(4, dtype=np.float32), np.full(4, 0.5, np.float32)
    target = np.array([b"add_sub"], dtype=object)
    with httpclient.InferenceServerClient(server.url) as client:
        before = client.get_inference_statistics("add_sub")["model_stats"][0]
        answer = client.infer(model, http_inputs(input0, input1, target))
        np.testing.assert_allclose(answer.as_numpy("OUTPUT0"), input0 + input1)
        np.testing.assert_allclose(answer.as_numpy("OUTPUT1"), input0 - input1)
        after = client.get_inference_statistics("add_sub")["model_stats"][0]
        calls = 1 if model == "bls" else 2  # the async model asks once per output
        assert int(after["inference_count"]) - int(before["inference_count"]) == calls
        # A call to a model that is not there comes back as an error response.
        missing = np.array([b"nope"], dtype=object)
        with pytest.raises(InferenceServerException, match="nope"):
            client.infer(model, http_inputs(input0, input1, missing))


MODEL_LABELS = {("model", "counted"), ("version", "1")}


def scrape(server: ServerProcess) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_custom_metrics_are_on_metrics_until_the_model_is_unloaded(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        for value in (0.25, 1.0, 3.0):
            client.infer(
                "counted", http_inputs(np.full(4, value, np.float32), np.ones(4, np.float32))
            )
        series = scrape(server)
        # The parser names counter samples *_total; the exposition writes the name as given.
        assert series[("add_sub_requests_total", frozenset({("model", "counted")}))] == 3
        assert series[("add_sub_first_value_bucket", frozenset({("le", "0.5")}))] == 1
        assert series[("add_sub_first_value_bucket", frozenset({("le", "2")}))] == 2
        assert series[("add_sub_first_value_bucket", frozenset({("le", "+Inf")}))] == 3
        assert series[("add_sub_first_value_sum", frozenset())] == 4.25
        success = ("nv_inference_request_success_total", frozenset(MODEL_LABELS))
        assert series[success] == 3  # beside the server's own families
        client.unload_model("counted")
        names = {name for name, _ in scrape(server)}
        assert not {n for n in names if n.startswith("add_sub_")}
        client.load_model("counted")
        assert ("add_sub_requests_total", frozenset({("model", "counted")})) in scrape(server)


def test_bls_and_custom_metrics_live_in_the_executor_with_several_front_ends(
    repository: Path,
) -> None:
    args = ["--model-repository", str(repository), "--model-control-mode", "explicit"]
    models = ["--load-model", "add_sub", "--load-model", "bls", "--load-model", "counted"]
    with start_server(*args, *models, "--frontends", "2", "--ipc-arena-mb", "4") as server:
        input0, input1 = np.arange(4, dtype=np.float32), np.ones(4, np.float32)
        target = np.array([b"add_sub"], dtype=object)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        # Readiness first: CI once saw bls answer that add_sub had no ready version, which this
        # tells apart from a BLS routing fault (the failed test prints the server's log).
        assert all(grpc.is_model_ready(name) for name in ("add_sub", "bls", "counted"))
        answer = grpc.infer("bls", grpc_inputs(input0, input1, target))
        np.testing.assert_allclose(answer.as_numpy("OUTPUT0"), input0 + input1)
        grpc.infer("counted", grpc_inputs(input0, input1))
        grpc.close()
        series = scrape(server)
        assert series[("add_sub_requests_total", frozenset({("model", "counted")}))] == 1
