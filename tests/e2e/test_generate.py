"""Triton's generate extension over HTTP, black-box: ``/generate`` and ``/generate_stream`` on a
plain identity model and on the decoupled repeat models of ``test_decoupled.py`` (one response
per input element, a negative element an error response), read with httpx as server-sent
events."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from tests.e2e.test_decoupled import MODELS, add_model
from tests.support import PICKY_MODEL, ServerProcess, start_server, write_model

PLAIN = ["identity", "identity_unbatched"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("generate")
    for name, source in MODELS.items():
        add_model(repo, name, source)
    write_model(repo, "identity")
    write_model(repo, "identity_unbatched", max_batch_size=0)
    write_model(repo, "picky", source=PICKY_MODEL)
    with start_server("--model-repository", str(repo)) as server:
        yield server


@pytest.fixture
def client(server: ServerProcess) -> Iterator[httpx.Client]:
    with httpx.Client(base_url=f"http://{server.url}", timeout=30) as client:
        yield client


def events(client: httpx.Client, model: str, body: dict[str, Any]) -> tuple[int, list[Any]]:
    """The status and the events' data, parsed, of one generate_stream call."""
    with client.stream("POST", f"/v2/models/{model}/generate_stream", json=body) as reply:
        assert reply.headers["content-type"] == "text/event-stream; charset=utf-8"
        lines = list(reply.iter_lines())
    assert all(line.startswith("data: ") for line in lines[::2]), lines
    assert all(line == "" for line in lines[1::2]), lines
    return reply.status_code, [json.loads(line.removeprefix("data: ")) for line in lines[::2]]


@pytest.mark.parametrize("model", PLAIN)
def test_generate_answers_the_outputs_by_name(client: httpx.Client, model: str) -> None:
    reply = client.post(f"/v2/models/{model}/generate", json={"INPUT0": [1.5, 2.5]})
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"] == "application/json"
    assert reply.json() == {"model_name": model, "model_version": "1", "OUTPUT0": [1.5, 2.5]}
    # One element is answered as a scalar; other fields are request parameters, as in Triton.
    body = {"INPUT0": 3, "temperature": 0.5, "parameters": {"stream": False}}
    reply = client.post(f"/v2/models/{model}/versions/1/generate", json=body)
    assert reply.json() == {"model_name": model, "model_version": "1", "OUTPUT0": 3.0}


@pytest.mark.parametrize("model", PLAIN)
def test_generate_stream_on_a_plain_model_sends_one_event(client: httpx.Client, model: str) -> None:
    status, data = events(client, model, {"INPUT0": [4, 5, 6]})
    assert status == 200
    assert data == [{"model_name": model, "model_version": "1", "OUTPUT0": [4.0, 5.0, 6.0]}]


@pytest.mark.parametrize("model", list(MODELS))
def test_generate_stream_on_a_decoupled_model_sends_each_response_in_order(
    client: httpx.Client, model: str
) -> None:
    status, data = events(client, model, {"IN": [7, 8, 9, 10]})
    assert status == 200
    assert [(d["OUT"], d["IDX"], d["model_name"]) for d in data] == [
        (7, 0, model),
        (8, 1, model),
        (9, 2, model),
        (10, 3, model),
    ]


@pytest.mark.parametrize("model", list(MODELS))
def test_an_error_mid_stream_is_an_error_event_that_ends_the_stream(
    client: httpx.Client, model: str
) -> None:
    status, data = events(client, model, {"IN": [1, -1, 3]})
    assert status == 200  # the first response was sent before the error
    assert len(data) == 2, data
    assert data[0]["OUT"] == 1
    assert list(data[1]) == ["error"]
    assert "negative value at 1" in data[1]["error"]


def test_a_failed_first_response_sets_the_status(client: httpx.Client) -> None:
    status, data = events(client, "repeat", {"IN": [-5, 2]})
    assert status == 500  # what the model raised is an internal error, as in Triton
    assert len(data) == 1
    assert "negative value at 0" in data[0]["error"]
    # A plain model failing is an ordinary JSON error.
    reply = client.post("/v2/models/picky/generate_stream", json={"INPUT0": [-1.0]})
    assert reply.status_code == 400
    assert "INPUT0 must not start negative" in reply.json()["error"]


@pytest.mark.parametrize("model", list(MODELS))
def test_generate_on_a_decoupled_model_needs_exactly_one_response(
    client: httpx.Client, model: str
) -> None:
    reply = client.post(f"/v2/models/{model}/generate", json={"IN": [5]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["OUT"] == 5
    for values in ([5, 6], []):
        reply = client.post(f"/v2/models/{model}/generate", json={"IN": values})
        assert reply.status_code == 400
        assert "generate expects model to produce exactly 1 response" in reply.json()["error"]


@pytest.mark.parametrize(
    ("route", "body", "named"),
    [
        ("generate", {"INPUT0": {"a": 1}}, "input 'INPUT0'"),
        ("generate", {"INPUT0": ["text"]}, "input 'INPUT0'"),
        ("generate", {"INPUT0": [True]}, "input 'INPUT0'"),
        ("generate", {}, "input 'INPUT0'"),
        ("generate", {"INPUT0": [1], "INPUT9": [2]}, "field 'INPUT9'"),
        ("generate", {"INPUT0": [1], "parameters": [1]}, "field 'parameters'"),
        ("generate_stream", {"INPUT0": ["text"]}, "input 'INPUT0'"),
        ("generate_stream", {"INPUT0": [1], "parameters": {"p": [1]}}, "field 'parameters.p'"),
    ],
)
def test_a_bad_field_is_a_400_naming_it(
    client: httpx.Client, route: str, body: dict[str, Any], named: str
) -> None:
    reply = client.post(f"/v2/models/identity/{route}", json=body)
    assert reply.status_code == 400
    assert reply.headers["content-type"] == "application/json"
    assert named in reply.json()["error"]
    assert client.post("/v2/models/identity/generate", json={"INPUT0": 1}).status_code == 200


def test_bad_json_an_unknown_model_and_a_wrong_method(client: httpx.Client) -> None:
    reply = client.post("/v2/models/identity/generate", content=b"{nope")
    assert reply.status_code == 400
    assert "malformed JSON" in reply.json()["error"]
    reply = client.post("/v2/models/nosuch/generate_stream", json={"INPUT0": 1})
    assert reply.status_code == 404
    assert client.get("/v2/models/identity/generate").status_code == 405


def test_a_client_that_leaves_mid_stream_gives_the_request_up(
    client: httpx.Client,
) -> None:
    def failures() -> int:
        stats = client.get("/v2/models/triton_repeat/stats").json()["model_stats"][0]
        return int(stats["inference_stats"]["fail"]["count"])

    before = failures()
    body = {"IN": list(range(200_000))}
    with client.stream("POST", "/v2/models/triton_repeat/generate_stream", json=body) as reply:
        lines = reply.iter_lines()
        assert next(lines).startswith("data: ")
    # The request is counted as given up once the server noticed; the server goes on serving.
    for _ in range(100):
        if failures() > before:
            break
        time.sleep(0.1)
    assert failures() == before + 1
    status, data = events(client, "repeat", {"IN": [1]})
    assert (status, [d["OUT"] for d in data]) == (200, [1])
