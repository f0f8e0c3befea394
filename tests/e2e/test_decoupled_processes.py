"""Decoupled models with several processes, black-box: ``--frontends 2`` (two front-end
processes, one executor) and ``--frontends 2 --executors 2``, driven over gRPC ModelStreamInfer
(tritonclient) and HTTP ``generate_stream`` (httpx). The responses cross the channel between
front end and executor one by one (``transport/streams.py``): in order, the last one final,
errors mid-stream as error responses, a batch of streams run together, a client that stops
reading holding the model back, a client that leaves cancelling the model's request.

The repeat models are ``test_decoupled.py``'s. ``ticker`` (a Triton ``model.py`` sending from a
thread of its own) takes ``[total, delay_ms, tag, size]``: it sends ``total`` responses of
``size`` elements (``IDX`` says which), writes how many it sent to ``progress-<tag>`` and, when
it sees ``is_cancelled()``, ``cancelled-<tag>``. ``where`` (two instances: one per executor with
``--executors 2``) answers its process id three times.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm

from tests.e2e.test_decoupled import MODELS, Stream, add_model, stream_one_batch
from tests.e2e.test_generate import events
from tests.support import ServerProcess, start_server

TICKER_CONFIG = """name: "ticker"
backend: "python"
max_batch_size: 0
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 4 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ -1 ] },
         { name: "IDX", data_type: TYPE_INT32, dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
"""

TICKER = """
import threading
import time
from pathlib import Path

import numpy as np
import triton_python_backend_utils as pb_utils

HERE = Path(__file__).parent


class TritonPythonModel:
    def execute(self, requests):
        for request in requests:
            args = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()
            sender = request.get_response_sender()
            threading.Thread(target=self.tick, args=(sender, *map(int, args)), daemon=True).start()
        return None

    def tick(self, sender, total, delay_ms, tag, size):
        for i in range(total):
            if sender.is_cancelled():
                (HERE / f"cancelled-{tag}").write_text(str(i))
                break
            out = pb_utils.Tensor("OUT", np.full(size, i, np.int32))
            idx = pb_utils.Tensor("IDX", np.array([i], np.int32))
            sender.send(pb_utils.InferenceResponse([out, idx]))
            (HERE / f"progress-{tag}").write_text(str(i + 1))
            time.sleep(delay_ms / 1000)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

WHERE_CONFIG = """name: "where"
backend: "python"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 1 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
         { name: "IDX", data_type: TYPE_INT32, dims: [ 1 ] },
         { name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
instance_group [ { count: 2, kind: KIND_CPU } ]
"""

WHERE = """
import os
import time

import numpy as np


class Model:
    def execute(self, requests):
        return [self.where() for _ in requests]

    def where(self):
        for i in range(3):
            yield {"OUT": np.array([[os.getpid()]], np.int32), "IDX": np.array([[i]], np.int32),
                   "BATCH": np.array([[1]], np.int32)}
            time.sleep(0.2)
"""

MODES = {"frontends": ("--frontends", "2"), "executors": ("--frontends", "2", "--executors", "2")}
SHM = "--allow-client-shm"
_tags = itertools.count(1)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("decoupled-processes")
    for name, source in MODELS.items():
        add_model(repo, name, source)
    for name, config, source in (("ticker", TICKER_CONFIG, TICKER), ("where", WHERE_CONFIG, WHERE)):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(source)
    return repo


@pytest.fixture(scope="module", params=list(MODES))
def mode(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture(scope="module")
def server(repository: Path, mode: str) -> Iterator[ServerProcess]:
    with start_server("--model-repository", str(repository), SHM, *MODES[mode]) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.url}", timeout=60) as client:
        yield client


class Ticker:
    """One ``ticker`` request's tag and what its model wrote."""

    def __init__(self, repository: Path) -> None:
        self.tag = next(_tags)
        self.folder = repository / "ticker" / "1"

    def args(self, total: int, delay_ms: int = 0, size: int = 1) -> list[int]:
        return [total, delay_ms, self.tag, size]

    def progress(self) -> int:
        path = self.folder / f"progress-{self.tag}"
        text = path.read_text() if path.exists() else ""
        return int(text or 0)

    def cancelled(self) -> bool:
        return (self.folder / f"cancelled-{self.tag}").exists()


def wait_for(condition: Callable[[], bool], what: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def test_decoupled_models_load_with_several_processes(server: ServerProcess) -> None:
    # Before streams crossed the channel, several processes refused them at load.
    with httpclient.InferenceServerClient(server.url) as client:
        index = {row["name"]: row for row in client.get_model_repository_index()}
    for name in (*MODELS, "ticker", "where"):
        assert index[name]["state"] == "READY", index[name]


@pytest.mark.parametrize("model", list(MODELS))
def test_grpc_responses_come_in_order_with_errors_mid_stream(
    server: ServerProcess, model: str
) -> None:
    with Stream(server) as stream:
        stream.send(model, [7, -1, 9, 10], "r1")
        answers = stream.take(5)
    assert answers[0] == ("ok", ("r1", 7, 0, 1, False))
    assert answers[1][0] == "error"
    assert "negative value at 1" in answers[1][1]
    assert answers[2:] == [
        ("ok", ("r1", 9, 2, 1, False)),
        ("ok", ("r1", 10, 3, 1, False)),
        ("ok", ("r1", None, None, None, True)),  # the final flag came without outputs
    ]


@pytest.mark.parametrize("model", list(MODELS))
def test_a_batch_of_streamed_requests_runs_together(server: ServerProcess, model: str) -> None:
    with Stream(server) as stream:
        stream.send(model, [1], "warm")  # the front end learns the model is decoupled
        stream.take(2)
        stream_one_batch(stream, model)


@pytest.mark.parametrize("model", list(MODELS))
def test_generate_stream_sends_each_response_in_order_and_ends_at_an_error(
    client: httpx.Client, model: str
) -> None:
    status, data = events(client, model, {"IN": [7, 8, 9, 10]})
    assert status == 200
    assert [(d["OUT"], d["IDX"]) for d in data] == [(7, 0), (8, 1), (9, 2), (10, 3)]
    status, data = events(client, model, {"IN": [1, -1, 3]})
    assert status == 200
    assert [d.get("OUT") for d in data[:1]] == [1]
    assert "negative value at 1" in data[1]["error"]
    assert len(data) == 2


def test_a_grpc_cancel_mid_stream_reaches_the_model(
    server: ServerProcess, repository: Path
) -> None:
    ticker = Ticker(repository)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: answers.put((result, error)))
    try:
        tensor = grpcclient.InferInput("IN", [4], "INT32")
        tensor.set_data_from_numpy(np.array(ticker.args(100_000, delay_ms=10), np.int32))
        client.async_stream_infer("ticker", [tensor])
        for _ in range(3):
            _result, error = answers.get(timeout=30)
            assert error is None, error
    finally:
        client.stop_stream(cancel_requests=True)
        client.close()
    wait_for(ticker.cancelled, "the model did not see its request cancelled")
    stopped = ticker.progress()
    time.sleep(0.3)
    assert ticker.progress() == stopped < 100_000


def test_an_http_client_that_leaves_mid_stream_cancels_the_models_request(
    client: httpx.Client, repository: Path
) -> None:
    ticker = Ticker(repository)
    body = {"IN": ticker.args(100_000, delay_ms=10)}
    with client.stream("POST", "/v2/models/ticker/generate_stream", json=body) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: ")
    wait_for(ticker.cancelled, "the model did not see its request cancelled")
    assert ticker.progress() < 100_000
    status, data = events(client, "repeat", {"IN": [1]})  # the server goes on serving
    assert (status, [d["OUT"] for d in data]) == (200, [1])


def test_a_client_that_stops_reading_holds_the_model_back(
    client: httpx.Client, repository: Path
) -> None:
    # 400 responses of 16 Ki elements (~70 KB of JSON each). While the client reads nothing,
    # the model gets ahead by the executor's bound (16 in its response buffer), the channel's
    # window (16), and what the sockets hold (a few MB): far from all of them.
    ticker = Ticker(repository)
    total = 400
    body = {"IN": ticker.args(total, size=16384)}
    with client.stream("POST", "/v2/models/ticker/generate_stream", json=body) as reply:
        lines = (json.loads(line.removeprefix("data: ")) for line in reply.iter_lines() if line)
        assert next(lines)["IDX"] == 0
        wait_for(lambda: ticker.progress() > 16, "the model did not run ahead at all")
        time.sleep(3)
        held = ticker.progress()
        assert held <= total // 2, f"the model ran {held} responses ahead of a stalled reader"
        indexes = [doc["IDX"] for doc in lines]
    assert indexes == list(range(1, total))


def test_streams_stay_on_one_executor_and_spread_over_the_hosts(
    server: ServerProcess, mode: str
) -> None:
    with Stream(server) as stream:
        stream.send("where", [0], "w0")  # learnt decoupled, then four at once
        stream.take(4)
        for i in range(4):
            stream.send("where", [0], f"w{i + 1}")
        answers = stream.take(16)
    pids: dict[str, set[int]] = {}
    for kind, answer in answers:
        assert kind == "ok", answer
        if answer[1] is not None:
            pids.setdefault(answer[0], set()).add(answer[1])
    assert all(len(p) == 1 for p in pids.values()), pids  # each stream on one executor
    assert len(set().union(*pids.values())) == (2 if mode == "executors" else 1)


def test_statistics_count_each_streamed_request_once(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    before = client.get_inference_statistics("triton_repeat")["model_stats"][0]
    with Stream(server) as stream:
        for i in range(3):
            stream.send("triton_repeat", [1, 2, 3, 4], f"s{i}")
        stream.take(15)
    after = client.get_inference_statistics("triton_repeat")["model_stats"][0]
    client.close()
    succeeded = after["inference_stats"]["success"]["count"]
    assert succeeded - before["inference_stats"]["success"]["count"] == 3


def test_a_streamed_output_goes_to_the_clients_shared_memory(server: ServerProcess) -> None:
    name = f"ds_{os.getpid()}_{next(_tags)}"
    region = shm.create_shared_memory_region(name, f"/imx_{name}", 4)
    client = grpcclient.InferenceServerClient(server.grpc_url)
    answers: queue.Queue[Any] = queue.Queue()
    try:
        client.register_system_shared_memory(name, f"/imx_{name}", 4)
        client.start_stream(callback=lambda result, error: answers.put((result, error)))
        tensor = grpcclient.InferInput("IN", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[42]], np.int32))
        out = grpcclient.InferRequestedOutput("OUT")
        out.set_shared_memory(name, 4)
        outputs = [out, grpcclient.InferRequestedOutput("IDX")]
        client.async_stream_infer("repeat", [tensor], outputs=outputs)
        result, error = answers.get(timeout=30)
        client.stop_stream()
        assert error is None, error
        assert result.as_numpy("IDX").tolist() == [[0]]
        response = result.get_response()
        assert [o.name for o in response.outputs] == ["OUT", "IDX"]
        assert response.raw_output_contents[0] == b""  # written to the region instead
        assert shm.get_contents_as_numpy(region, np.int32, [1, 1]).tolist() == [[42]]
    finally:
        client.unregister_system_shared_memory(name)
        client.close()
        shm.destroy_shared_memory_region(region)
