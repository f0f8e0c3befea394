"""Triton's decoupled examples served unchanged by the real ``infermux serve``, driven as
Triton's own clients drive them: python_backend's ``examples/decoupled`` (``repeat_int32``,
``square_int32``) over a tritonclient gRPC stream, the client repo's
``simple_grpc_custom_repeat.py``, and ``examples/bls_decoupled`` (a model reading
``square_int32`` through ``exec(decoupled=True)``, sync and async) over HTTP.

The repository, ``tests/data/triton_decoupled``, is a plain Triton repository of equivalents
of those examples (see its README). Pointing ``INFERMUX_COMPARE_TRITON`` at a real
``tritonserver`` serving that folder (``HTTP_HOST:PORT,GRPC_HOST:PORT``) runs these tests
against it instead (docs/python-models.md says how); they passed on tritonserver 2.51.
"""

from __future__ import annotations

import json
import os
import queue
import time
from collections.abc import Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException, np_to_triton_dtype

from tests.support import start_server

pytestmark = pytest.mark.e2e

REPOSITORY = Path(__file__).parents[1] / "data" / "triton_decoupled"
TRITON = os.environ.get("INFERMUX_COMPARE_TRITON", "")


@dataclass
class Endpoints:
    url: str
    grpc_url: str


@pytest.fixture(scope="module")
def server() -> Iterator[Endpoints]:
    if TRITON:
        http, grpc = TRITON.split(",")
        yield Endpoints(http, grpc)
        return
    with start_server("--model-repository", str(REPOSITORY)) as served:
        yield Endpoints(served.url, served.grpc_url)
        assert served.stop() == 0


class UserData:
    """What Triton's example clients collect their stream's results in."""

    def __init__(self) -> None:
        self._completed_requests: queue.Queue[Any] = queue.Queue()


def callback(user_data: UserData, result: Any, error: InferenceServerException | None) -> None:
    user_data._completed_requests.put(error if error else result)


def repeat_inputs(values: list[int], delays: list[int], wait: int) -> list[grpcclient.InferInput]:
    inputs = [
        grpcclient.InferInput("IN", [len(values)], "INT32"),
        grpcclient.InferInput("DELAY", [len(delays)], "UINT32"),
        grpcclient.InferInput("WAIT", [1], "UINT32"),
    ]
    inputs[0].set_data_from_numpy(np.array(values, dtype=np.int32))
    inputs[1].set_data_from_numpy(np.array(delays, dtype=np.uint32))
    inputs[2].set_data_from_numpy(np.array([wait], dtype=np.uint32))
    return inputs


def take(user_data: UserData, count: int) -> list[Any]:
    """``count`` results, failing on an error as the example clients do."""
    results = []
    for _ in range(count):
        item = user_data._completed_requests.get(timeout=30)
        if isinstance(item, InferenceServerException):
            raise item
        results.append(item)
    return results


def nothing_more(user_data: UserData, seconds: float = 0.5) -> bool:
    time.sleep(seconds)
    return user_data._completed_requests.empty()


def test_simple_grpc_custom_repeat(server: Endpoints) -> None:
    # The client repo's simple_grpc_custom_repeat.py, with 100 ms between responses, not 1 s.
    repeat_count, data_offset, delay_time, wait_time = 10, 100, 100, 1000
    input_data = np.arange(data_offset, data_offset + repeat_count, dtype=np.int32)
    delays = [delay_time] * repeat_count
    inputs = repeat_inputs(input_data.tolist(), delays, wait_time)
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        sent = time.monotonic()
        triton_client.async_stream_infer(model_name="repeat_int32", inputs=inputs, outputs=outputs)
        results = take(user_data, repeat_count)
        elapsed = time.monotonic() - sent
        assert nothing_more(user_data)  # the final flag came alone: not sent to this client
    assert [r.as_numpy("OUT").tolist() for r in results] == [[v] for v in input_data]
    assert all(r.as_numpy("IDX") is None for r in results)  # only OUT was asked for
    assert elapsed >= repeat_count * delay_time / 1000 * 0.9  # each response after its DELAY


def test_repeat_client(server: Endpoints) -> None:
    # python_backend's examples/decoupled/repeat_client.py: one request, four responses.
    in_value, delay_value, wait_value = [4, 2, 0, 1], [1, 2, 3, 4], 5
    outputs = [grpcclient.InferRequestedOutput("OUT"), grpcclient.InferRequestedOutput("IDX")]
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        triton_client.async_stream_infer(
            model_name="repeat_int32",
            inputs=repeat_inputs(in_value, delay_value, wait_value),
            request_id="0",
            outputs=outputs,
        )
        results = take(user_data, len(in_value))
        assert nothing_more(user_data)
    assert {r.get_response().id for r in results} == {"0"}
    assert [r.as_numpy("OUT").tolist() for r in results] == [[v] for v in in_value]
    assert [r.as_numpy("IDX").tolist() for r in results] == [[0], [1], [2], [3]]
    first = results[0]
    assert first.as_numpy("OUT").dtype == np.int32
    assert first.as_numpy("IDX").dtype == np.uint32


def test_square_client(server: Endpoints) -> None:
    # python_backend's examples/decoupled/square_client.py: IN = [n] gets n responses of [n],
    # so the request with [0] gets none; four requests in flight on one stream.
    in_values = [4, 2, 0, 1]
    inputs = [grpcclient.InferInput("IN", [1], np_to_triton_dtype(np.int32))]
    outputs = [grpcclient.InferRequestedOutput("OUT")]
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        for i, value in enumerate(in_values):
            inputs[0].set_data_from_numpy(np.array([value], dtype=np.int32))
            triton_client.async_stream_infer(
                model_name="square_int32", inputs=inputs, request_id=str(i), outputs=outputs
            )
        results = take(user_data, sum(in_values))
        assert nothing_more(user_data)
    by_id: dict[str, list[list[int]]] = {}
    for result in results:
        by_id.setdefault(result.get_response().id, []).append(result.as_numpy("OUT").tolist())
    assert by_id == {str(i): [[v]] * v for i, v in enumerate(in_values) if v}


def test_square_with_empty_final_responses(server: Endpoints) -> None:
    # Asking for them, every request ends with one response holding only the final flag.
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        for i, value in enumerate([2, 0]):
            tensor = grpcclient.InferInput("IN", [1], "INT32")
            tensor.set_data_from_numpy(np.array([value], dtype=np.int32))
            triton_client.async_stream_infer(
                "square_int32", [tensor], request_id=str(i), enable_empty_final_response=True
            )
        results = take(user_data, 4)
        assert nothing_more(user_data)
    seen: dict[str, list[tuple[bool, bool]]] = {}
    for result in results:
        response = result.get_response()
        final = response.parameters["triton_final_response"].bool_param
        seen.setdefault(response.id, []).append((bool(response.outputs), final))
    assert seen == {"0": [(True, False), (True, False), (False, True)], "1": [(False, True)]}


def test_repeat_wait_below_the_delays_lets_the_next_request_run_meanwhile(
    server: Endpoints,
) -> None:
    # One instance (the config names none): execute returns after WAIT, so a second request
    # runs while the first still streams and answers first.
    with httpclient.InferenceServerClient(server.url) as client:
        groups = client.get_model_config("repeat_int32").get("instance_group", [])
    assert sum(group.get("count", 1) for group in groups) <= 1
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        triton_client.async_stream_infer(
            "repeat_int32", repeat_inputs([10, 11], [1500, 0], 0), request_id="slow"
        )
        triton_client.async_stream_infer(
            "repeat_int32", repeat_inputs([20], [0], 0), request_id="quick"
        )
        results = take(user_data, 3)
    order = [(r.get_response().id, int(r.as_numpy("OUT")[0])) for r in results]
    assert order == [("quick", 20), ("slow", 10), ("slow", 11)]


def test_repeat_wait_holds_the_instance_until_execute_returns(server: Endpoints) -> None:
    user_data = UserData()
    with grpcclient.InferenceServerClient(url=server.grpc_url) as triton_client:
        triton_client.start_stream(callback=partial(callback, user_data))
        sent = time.monotonic()
        triton_client.async_stream_infer(
            "repeat_int32", repeat_inputs([10], [0], 1000), request_id="waits"
        )
        triton_client.async_stream_infer(
            "repeat_int32", repeat_inputs([20], [0], 0), request_id="next"
        )
        first, second = take(user_data, 2)
        elapsed = time.monotonic() - sent
    assert (first.get_response().id, second.get_response().id) == ("waits", "next")
    assert elapsed >= 0.9  # the second request ran only once the first's execute returned


@pytest.mark.parametrize(
    ("model", "factor"), [("bls_decoupled_sync", 1), ("bls_decoupled_async", 2)]
)
def test_bls_decoupled_clients(server: Endpoints, model: str, factor: int) -> None:
    # examples/bls_decoupled's sync_client.py and async_client.py: SUM of square_int32's
    # responses read through BLS: n * n, or twice that from two calls in flight at once.
    with httpclient.InferenceServerClient(server.url) as client:
        for in_value in [4, 2, 0, 1]:
            input_data = np.array([in_value], dtype=np.int32)
            inputs = [
                httpclient.InferInput("IN", input_data.shape, np_to_triton_dtype(input_data.dtype))
            ]
            inputs[0].set_data_from_numpy(input_data)
            outputs = [httpclient.InferRequestedOutput("SUM")]
            response = client.infer(model, inputs, request_id=str(1), outputs=outputs)
            output_data = response.as_numpy("SUM")
            assert np.allclose(factor * input_data * input_data, output_data)


# What bls_probe reported on tritonserver 2.51 (PyTriton 0.7.0's), for IN = [3] and, through
# async_exec in an async execute, IN = [-1]. Codes are TritonError's (1 INTERNAL, 3 INVALID_ARG,
# 5 UNSUPPORTED).
SQUARE_3 = [{"error": None, "outputs": {"OUT": [3]}}] * 3 + [{"error": None, "outputs": {}}]
ERRORS_2_51 = [
    {"error": None, "outputs": {"OUT": [0]}},
    {"error": None, "outputs": {"OUT": [1]}},
    {"error": None, "outputs": {}},
]
TRITON_2_51 = {
    3: {
        "type": "ResponseIterator",
        "square": SQUARE_3,
        "square_again": SQUARE_3,
        "square_single": {"error": 1, "names_decoupled": True, "outputs": {}},
        "once": [{"error": None, "outputs": {"SUM": [9]}}],
        "errors": ERRORS_2_51,
        "missing": [True],
        "from_thread": SQUARE_3,
    },
    -1: {
        "type": "ResponseIterator",
        "square": SQUARE_3,
        "errors": ERRORS_2_51,
        "square_single": {"error": 1, "names_decoupled": True, "outputs": {}},
    },
}


def infermux_expected(triton: dict[str, Any]) -> dict[str, Any]:
    """Where infermux answers otherwise than tritonserver 2.51, on purpose: a failed response
    mid-stream reaches the BLS caller (the README's loop checks ``has_error()`` on each; 2.51
    drops it), and exec() without decoupled=True on a decoupled model fails UNSUPPORTED, the
    code infermux gives that refusal everywhere, where Triton's BLS path says INTERNAL."""
    expected = dict(triton)
    expected["errors"] = [*ERRORS_2_51[:1], {"error": 3, "outputs": {}}, *ERRORS_2_51[1:]]
    expected["square_single"] = {**triton["square_single"], "error": 5}
    return expected


@pytest.mark.parametrize("in_value", [3, -1])
def test_bls_responses_are_read_as_in_triton(server: Endpoints, in_value: int) -> None:
    tensor = httpclient.InferInput("IN", [1], "INT32")
    tensor.set_data_from_numpy(np.array([in_value], dtype=np.int32))
    with httpclient.InferenceServerClient(server.url) as client:
        report = json.loads(client.infer("bls_probe", [tensor]).as_numpy("REPORT")[0])
    triton = TRITON_2_51[in_value]
    assert report == (triton if TRITON else infermux_expected(triton))
