"""What a decoupled model's stream means beyond its responses, black-box: a client that cancels a
gRPC stream or drops an HTTP ``generate_stream`` connection reaches the model (a native generator
is closed, a Triton model's ``is_cancelled()`` turns true; each writes a marker file the test
reads), the execution timeout bounds each gap between responses rather than the whole stream, and
the statistics extension and ``/metrics`` count every response (Triton's ``response_stats``,
``nv_inference_first_response_histogram_ms``)."""

from __future__ import annotations

import json
import queue
import re
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, parameter, start_server, wait_for

CONFIG = """name: "{name}"
backend: "python"
max_batch_size: 8
input [ {{ name: "IN", data_type: TYPE_INT32, dims: [ -1 ] }} ]
output [ {{ name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] }} ]
model_transaction_policy {{ decoupled: true }}
dynamic_batching {{ }}
{extra}
"""

# IN = [tag, count]: count responses 0, 1, ... 20 ms apart; closed early, it writes a marker
# named after its tag. ASYNC_TICKER: the same as an async generator.
TICKER = """
import time

import numpy as np


class Model:
    def initialize(self, context):
        self.path = context.model_path

    def execute(self, requests):
        return [self.tick(r) for r in requests]

    def tick(self, request):
        tag, count = (int(v) for v in request.inputs["IN"][0][:2])
        sent = 0
        try:
            for i in range(count):
                yield {"OUT": np.array([[i]], np.int32)}
                sent += 1
                time.sleep(0.02)
        except GeneratorExit:
            (self.path / f"cancelled-{tag}").write_text(f"closed after {sent}")
            raise
"""

ASYNC_TICKER = """
import asyncio

import numpy as np


class Model:
    def initialize(self, context):
        self.path = context.model_path

    def execute(self, requests):
        return [self.tick(r) for r in requests]

    async def tick(self, request):
        tag, count = (int(v) for v in request.inputs["IN"][0][:2])
        sent = 0
        try:
            for i in range(count):
                yield {"OUT": np.array([[i]], np.int32)}
                sent += 1
                await asyncio.sleep(0.02)
        finally:
            if sent < count:
                (self.path / f"cancelled-{tag}").write_text(f"closed after {sent}")
"""

# The same from a thread of its own, through Triton's response sender; it stops when
# is_cancelled() says so and writes what the sender and the request said.
TRITON_TICKER = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.path = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.tick, args=(request,), daemon=True).start()
        return None

    def tick(self, request):
        values = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
        tag, count = int(values[0]), int(values[1])
        sender = request.get_response_sender()
        for i in range(count):
            if sender.is_cancelled():
                seen = f"{sender.is_cancelled()} {request.is_cancelled()} after {i}"
                with open(os.path.join(self.path, f"cancelled-{tag}"), "w") as marker:
                    marker.write(seen)
                break
            out = pb_utils.Tensor("OUT", np.array([[i]], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
            time.sleep(0.02)
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

# IN = delays in ms: before response i the model waits IN[i] (in execute, as a generator).
STALLER = """
import time

import numpy as np


class Model:
    def execute(self, requests):
        return [self.wait(r) for r in requests]

    def wait(self, request):
        for i, delay in enumerate(request.inputs["IN"][0]):
            time.sleep(int(delay) / 1000)
            yield {"OUT": np.array([[i]], np.int32)}
"""

# The same from a thread after execute returned; a request the server ended leaves a marker.
TRITON_STALLER = """
import os
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.path = args["model_repository"]

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.wait, args=(request,), daemon=True).start()
        return None

    def wait(self, request):
        sender = request.get_response_sender()
        delays = pb_utils.get_input_tensor_by_name(request, "IN").as_numpy()[0]
        for i, delay in enumerate(delays):
            time.sleep(int(delay) / 1000)
            if sender.is_cancelled():
                with open(os.path.join(self.path, "ended"), "w") as marker:
                    marker.write(f"ended before {i}")
                break
            out = pb_utils.Tensor("OUT", np.array([[i]], np.int32))
            sender.send(pb_utils.InferenceResponse([out]))
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)
"""

TIMEOUT_MS = 1000
MODELS = {
    "ticker": (TICKER, ""),
    "async_ticker": (ASYNC_TICKER, ""),
    "triton_ticker": (TRITON_TICKER, ""),
    "staller": (STALLER, parameter("execution_timeout_ms", str(TIMEOUT_MS))),
    "triton_staller": (TRITON_STALLER, parameter("execution_timeout_ms", str(TIMEOUT_MS))),
}


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("streams")
    for name, (source, extra) in MODELS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, extra=extra))
        (repo / name / "1" / "model.py").write_text(source)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    with start_server("--model-repository", str(repository)) as server:
        yield server


def marker(path: Path) -> str:
    wait_for(lambda: path.exists() and bool(path.read_text()), timeout=20)
    return path.read_text()


class Stream:
    """One gRPC stream (tritonclient's streaming API); answers as they come."""

    def __init__(self, server: ServerProcess) -> None:
        self.client = grpcclient.InferenceServerClient(server.grpc_url)
        self.answers: queue.Queue[tuple[str, Any]] = queue.Queue()
        self.client.start_stream(callback=self._callback)

    def _callback(self, result: Any, error: InferenceServerException | None) -> None:
        if error is not None:
            self.answers.put(("error", error.message()))
        else:
            final = result.get_response().parameters["triton_final_response"].bool_param
            out = result.as_numpy("OUT")
            self.answers.put(("ok", (None if out is None else int(out[0, 0]), final)))

    def send(self, model: str, values: list[int]) -> None:
        tensor = grpcclient.InferInput("IN", [1, len(values)], "INT32")
        tensor.set_data_from_numpy(np.array([values], np.int32))
        self.client.async_stream_infer(model, [tensor], enable_empty_final_response=True)

    def take(self, count: int) -> list[tuple[str, Any]]:
        return [self.answers.get(timeout=30) for _ in range(count)]

    def close(self, *, cancel: bool = False) -> None:
        self.client.stop_stream(cancel_requests=cancel)
        self.client.close()


def statistics(server: ServerProcess, model: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"http://{server.url}/v2/models/{model}/stats") as reply:
        stats: dict[str, Any] = json.load(reply)["model_stats"][0]
    return stats


def count(stats: dict[str, Any], index: str, key: str) -> int:
    """One count of Triton's response_stats (0 where that response never came)."""
    entry = stats["response_stats"].get(index, {})
    return int(entry.get(key, {}).get("count", 0))


def scrape(server: ServerProcess, series: str) -> float:
    """The value of one series of ``/metrics`` (0 when it is absent)."""
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line.rsplit(" ", 1)[1])
    return 0.0


def labels(model: str, **extra: str) -> str:
    pairs = {"model": model, "version": "1", **extra}
    return "{" + ",".join(f'{key}="{value}"' for key, value in pairs.items()) + "}"


def timeout_restarts(model: str) -> str:
    instance = f"{model}_0_cpu_0"
    return f"infermux_instance_restarts_total{labels(model, instance=instance, reason='timeout')}"


# -- cancellation -------------------------------------------------------------------------------


@pytest.mark.parametrize("model", ["ticker", "async_ticker", "triton_ticker"])
def test_a_cancelled_grpc_stream_reaches_the_model(
    server: ServerProcess, repository: Path, model: str
) -> None:
    cancels = f"nv_inference_request_failure{labels(model, reason='CANCELED')}"
    before = scrape(server, cancels)
    stream = Stream(server)
    try:
        stream.send(model, [1, 100_000])  # would stream for half an hour
        assert [kind for kind, _ in stream.take(3)] == ["ok"] * 3
    finally:
        stream.close(cancel=True)  # tritonclient cancels the RPC: the client is gone
    seen = marker(repository / model / "cancelled-1")
    if model == "triton_ticker":
        assert seen.startswith("True True after ")  # the sender and the request both know
    else:
        assert seen.startswith("closed after ")  # GeneratorExit / aclose at its yield
    wait_for(lambda: scrape(server, cancels) == before + 1, timeout=20)


@pytest.mark.parametrize("model", ["ticker", "triton_ticker"])
def test_a_dropped_generate_stream_connection_reaches_the_model(
    server: ServerProcess, repository: Path, model: str
) -> None:
    url = f"http://{server.url}/v2/models/{model}/generate_stream"
    with (
        httpx.Client(timeout=30) as client,
        client.stream("POST", url, json={"IN": [2, 100_000]}) as reply,
    ):
        assert reply.status_code == 200
        first = next(line for line in reply.iter_lines() if line)
        assert json.loads(first.removeprefix("data: "))["OUT"] == 0
        # Leaving the block closes the connection mid-stream.
    seen = marker(repository / model / "cancelled-2")
    assert seen.startswith(("closed after ", "True True after "))
    stats = statistics(server, model)
    cancelled = sum(entry["cancel"]["count"] for entry in stats["response_stats"].values())
    assert cancelled >= 1  # Triton's response_stats count the response that never came


# -- execution timeout per response gap ---------------------------------------------------------


def test_a_model_answering_within_the_timeout_streams_longer_than_it(server: ServerProcess) -> None:
    stream = Stream(server)
    try:
        stream.send("staller", [300] * 6)  # 1.8 s in all, each gap well inside 1 s
        answers = stream.take(7)
    finally:
        stream.close()
    assert answers == [("ok", (i, False)) for i in range(6)] + [("ok", (None, True))]


def test_a_stall_inside_execute_fails_the_request_and_replaces_the_instance(
    server: ServerProcess,
) -> None:
    restarts = timeout_restarts("staller")
    before = scrape(server, restarts)
    stream = Stream(server)
    try:
        stream.send("staller", [50, 5000, 50])
        first, second = stream.take(2)
    finally:
        stream.close()
    assert first == ("ok", (0, False))
    kind, message = second
    assert kind == "error"
    assert f"execution timeout ({TIMEOUT_MS} ms, which bounds each gap" in message
    assert "the instance is replaced" in message
    wait_for(lambda: scrape(server, restarts) == before + 1, timeout=20)
    stream = Stream(server)  # the replacement answers
    try:
        stream.send("staller", [10])
        assert stream.take(2) == [("ok", (0, False)), ("ok", (None, True))]
    finally:
        stream.close()


def test_a_stall_after_execute_returned_ends_that_request_alone(
    server: ServerProcess, repository: Path
) -> None:
    url = f"http://{server.url}/v2/models/triton_staller/generate_stream"
    started = time.monotonic()
    reply = httpx.post(url, json={"IN": [50, 8000, 50]}, timeout=30)
    assert time.monotonic() - started < 6  # cut after a 1 s gap, not after the 8 s stall
    events = [json.loads(line.removeprefix("data: ")) for line in reply.text.splitlines() if line]
    assert events[0]["OUT"] == 0
    assert "got no response within the execution timeout" in events[1]["error"]
    assert marker(repository / "triton_staller" / "ended") == "ended before 1"  # it was told
    restarts = timeout_restarts("triton_staller")
    assert scrape(server, restarts) == 0  # its execute had returned: the instance is kept


# -- statistics and metrics ---------------------------------------------------------------------


def test_statistics_and_metrics_count_each_response(server: ServerProcess) -> None:
    before = statistics(server, "ticker")
    first_responses = f"nv_inference_first_response_histogram_ms_count{labels('ticker')}"
    observed = scrape(server, first_responses)
    stream = Stream(server)
    try:
        stream.send("ticker", [3, 3])  # three responses, then the final flag alone
        answers = stream.take(4)
    finally:
        stream.close()
    assert answers[-1] == ("ok", (None, True))
    after = statistics(server, "ticker")
    added = {
        index: {key: count(after, index, key) - count(before, index, key) for key in entry}
        for index, entry in after["response_stats"].items()
    }
    for index in ("0", "1", "2"):
        assert added[index]["success"] == 1
        assert added[index]["compute_infer"] == 1
        assert added[index]["compute_output"] == 1
    assert added["3"]["empty_response"] == 1  # the final flag came alone
    assert after["response_stats"]["1"]["compute_infer"]["ns"] > 0
    # The same over gRPC, with exact uint64 counts.
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        grpc_stats = client.get_inference_statistics("ticker", as_json=True)["model_stats"][0]
    empty = grpc_stats["response_stats"]["3"]["empty_response"]
    assert int(empty["count"]) == count(after, "3", "empty_response")
    # Triton's time-to-first-response histogram, and infermux's count of responses by outcome.
    assert scrape(server, first_responses) == observed + 1
    text = urllib.request.urlopen(server.metrics_url).read().decode()
    bucket = "nv_inference_first_response_histogram_ms_bucket"
    assert re.search(bucket + r'\{model="ticker",version="1",le="100"\} \d+', text)
    assert scrape(server, f"infermux_responses_total{labels('ticker', outcome='success')}") >= 3
    assert scrape(server, f"infermux_response_interval_seconds_count{labels('ticker')}") >= 3
