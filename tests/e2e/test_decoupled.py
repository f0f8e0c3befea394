"""Decoupled models over gRPC ModelStreamInfer, driven by tritonclient's streaming API: an
infermux ``Model`` whose ``execute`` returns a generator per request, and a Triton
``TritonPythonModel`` answering through its response sender from a thread of its own. Each
repeats its input: one response per element, a negative element an error response mid-stream."""

from __future__ import annotations

import json
import queue
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ -1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }},
         {{ name: "IDX", data_type: TYPE_INT32, dims: [ 1 ] }},
         {{ name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
dynamic_batching {{ max_queue_delay_microseconds: 300000 }}
{extra}
"""

NATIVE = """
import numpy as np


class Model:
    def execute(self, requests):
        return [self.repeat(r, len(requests)) for r in requests]

    def repeat(self, request, batch):
        for i, value in enumerate(request.inputs["IN"][0]):
            if value < 0:
                yield ValueError(f"negative value at {i}")
                continue
            yield {
                "OUT": np.array([[value]], np.int32),
                "IDX": np.array([[i]], np.int32),
                "BATCH": np.array([[batch]], np.int32),
            }
"""

TRITON = """
import threading

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
            sender = request.get_response_sender()
            threading.Thread(target=self.send, args=(sender, values, len(requests))).start()
        return None  # the responses follow from the threads, after execute returned

    def send(self, sender, values, batch):
        for i, value in enumerate(values):
            if value < 0:
                error = pb_utils.TritonError(f"negative value at {i}")
                sender.send(pb_utils.InferenceResponse(error=error))
                continue
            tensors = [
                pb_utils.Tensor("OUT", np.array([[value]], np.int32)),
                pb_utils.Tensor("IDX", np.array([[i]], np.int32)),
                pb_utils.Tensor("BATCH", np.array([[batch]], np.int32)),
            ]
            sender.send(pb_utils.InferenceResponse(tensors))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

MODELS = {"repeat": NATIVE, "triton_repeat": TRITON}


def add_model(repo: Path, name: str, source: str, extra: str = "") -> None:
    (repo / name / "1").mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
    (repo / name / "1" / "model.py").write_text(source)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("decoupled")
    for name, source in MODELS.items():
        add_model(repo, name, source)
    # A backend that does not answer decoupled refuses such a model at load.
    (repo / "onnx_decoupled" / "1").mkdir(parents=True)
    (repo / "onnx_decoupled" / "config.pbtxt").write_text(
        CONFIG.format(name="onnx_decoupled", extra="").replace('"python"', '"onnxruntime"')
    )
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    with start_server("--model-repository", str(repository)) as server:
        yield server


Answer = tuple[str, Any]  # ("ok", (OUT, IDX, BATCH, final)) or ("error", message)


class Stream:
    """One gRPC stream; answers as they come, in arrival order."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.answers: queue.Queue[Answer] = queue.Queue()
        self.client.start_stream(callback=self._callback)

    def _callback(self, result: Any, error: InferenceServerException | None) -> None:
        if error is not None:
            self.answers.put(("error", error.message()))
            return
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        if not response.outputs:
            self.answers.put(("ok", (response.id, None, None, None, final)))
            return
        values = [int(result.as_numpy(n)[0, 0]) for n in ("OUT", "IDX", "BATCH")]
        self.answers.put(("ok", (response.id, *values, final)))

    def send(self, model: str, values: list[int], request_id: str) -> None:
        tensor = grpcclient.InferInput("IN", [1, len(values)], "INT32")
        tensor.set_data_from_numpy(np.array([values], np.int32))
        self.client.async_stream_infer(
            model, [tensor], request_id=request_id, enable_empty_final_response=True
        )

    def take(self, count: int) -> list[Answer]:
        return [self.answers.get(timeout=20) for _ in range(count)]

    def close(self) -> None:
        self.client.stop_stream()
        self.client.close()

    def __enter__(self) -> Stream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@pytest.mark.parametrize("model", list(MODELS))
def test_responses_come_in_order_then_an_empty_final_response(
    server: ServerProcess, model: str
) -> None:
    with Stream(server) as stream:
        stream.send(model, [7, 8, 9], "r1")
        answers = stream.take(4)
    assert answers == [
        ("ok", ("r1", 7, 0, 1, False)),
        ("ok", ("r1", 8, 1, 1, False)),
        ("ok", ("r1", 9, 2, 1, False)),
        ("ok", ("r1", None, None, None, True)),  # the final flag came without outputs
    ]


@pytest.mark.parametrize("model", list(MODELS))
def test_an_error_mid_stream_is_one_response_and_the_stream_goes_on(
    server: ServerProcess, model: str
) -> None:
    with Stream(server) as stream:
        stream.send(model, [1, -1, 3], "r2")
        answers = stream.take(4)
    assert answers[0] == ("ok", ("r2", 1, 0, 1, False))
    assert answers[1][0] == "error"
    assert "negative value at 1" in answers[1][1]
    assert answers[2:] == [("ok", ("r2", 3, 2, 1, False)), ("ok", ("r2", None, None, None, True))]


def stream_one_batch(stream: Stream, model: str) -> None:
    """Three requests sent within the models' 300 ms queue delay: each streams its own answers,
    in order, and all ran as one batch of three."""
    wanted = {"a": [10, 11], "b": [20, 21, 22], "c": [30]}
    for request_id, values in wanted.items():
        stream.send(model, values, request_id)
    answers = stream.take(sum(len(v) + 1 for v in wanted.values()))
    by_request: dict[str, list[tuple[Any, ...]]] = {}
    for kind, answer in answers:
        assert kind == "ok", answer
        by_request.setdefault(answer[0], []).append(answer[1:])
    for request_id, values in wanted.items():
        got = by_request[request_id]
        assert [a[0] for a in got[:-1]] == values  # in order within its request
        assert {a[2] for a in got[:-1]} == {3}  # the three requests ran as one batch
        assert [a[3] for a in got] == [False] * len(values) + [True]


@pytest.mark.parametrize("model", list(MODELS))
def test_a_batch_of_requests_each_streams_its_own_answers(
    server: ServerProcess, model: str
) -> None:
    with Stream(server) as stream:
        stream_one_batch(stream, model)


def test_without_enable_empty_final_response_the_flag_alone_sends_nothing(
    server: ServerProcess,
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        for request_id in ("x", "y"):
            tensor = grpcclient.InferInput("IN", [1, 2], "INT32")
            tensor.set_data_from_numpy(np.array([[5, 6]], np.int32))
            client.async_stream_infer("repeat", [tensor], request_id=request_id)
        got = [answers.get(timeout=20) for _ in range(4)]
    finally:
        client.stop_stream()
        client.close()
    assert answers.empty()
    for result, error in got:
        assert error is None
        # The model's final flag came alone and is not sent: no response sent was the last.
        assert result.get_response().parameters["triton_final_response"].bool_param is False
    assert sorted(int(r.as_numpy("OUT")[0, 0]) for r, _ in got) == [5, 5, 6, 6]


def test_a_decoupled_model_refuses_a_single_response_call(server: ServerProcess) -> None:
    tensor = httpclient.InferInput("IN", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    with (
        httpclient.InferenceServerClient(server.url) as client,
        pytest.raises(InferenceServerException, match="decoupled") as caught,
    ):
        client.infer("repeat", [tensor])
    assert caught.value.status() == "501"


def test_statistics_count_each_streamed_request_once(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("triton_repeat")["model_stats"][0]
    with Stream(server) as stream:
        stream.send("triton_repeat", [1, 2, 3, 4], "s")
        stream.take(5)
    after = client.get_inference_statistics("triton_repeat")["model_stats"][0]
    succeeded = after["inference_stats"]["success"]["count"]
    assert succeeded - before["inference_stats"]["success"]["count"] == 1
    client.close()


def test_a_backend_that_does_not_answer_decoupled_refuses_the_model(
    server: ServerProcess,
) -> None:
    with urllib.request.urlopen(
        urllib.request.Request(f"http://{server.url}/v2/repository/index", method="POST")
    ) as reply:
        index = {row["name"]: row for row in json.load(reply)}
    reason = index["onnx_decoupled"]["reason"]
    assert "model_transaction_policy.decoupled is not supported by the 'onnxruntime'" in reason
    assert index["repeat"]["state"] == "READY"
