"""Bad input gets a 4xx naming the problem, and the server keeps serving."""

from __future__ import annotations

import concurrent.futures
import gzip
import json
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess

pytestmark = pytest.mark.e2e


def post(server: ServerProcess, path: str, **kwargs: Any) -> httpx.Response:
    return httpx.post(f"http://{server.url}{path}", timeout=30, **kwargs)


def fp32_input(data: list[float], shape: list[int] | None = None) -> dict[str, Any]:
    return {"name": "INPUT0", "datatype": "FP32", "shape": shape or [1, len(data)], "data": data}


def assert_error(reply: httpx.Response, status: int, *fragments: str) -> None:
    assert reply.status_code == status, reply.text
    assert reply.headers["content-type"] == "application/json"
    message = reply.json()["error"]
    for fragment in fragments:
        assert fragment in message, message


def assert_still_serving(server: ServerProcess) -> None:
    reply = post(server, "/v2/models/identity_fp32/infer", json={"inputs": [fp32_input([1.5])]})
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [1.5]


@pytest.mark.parametrize(
    ("path", "body", "status", "fragments"),
    [
        ("/v2/models/nope/infer", {"inputs": []}, 404, ["unknown model", "nope"]),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [{**fp32_input([1.0]), "datatype": "INT32", "data": [1]}]},
            400,
            ["INPUT0", "INT32", "FP32"],
        ),
        (
            "/v2/models/fixed/infer",
            {
                "inputs": [
                    {"name": "INPUT0", "datatype": "INT32", "shape": [1, 3], "data": [1, 2, 3]}
                ]
            },
            400,
            ["shape", "INPUT0", "[-1, 2, 3]"],
        ),
        ("/v2/models/identity_fp32/infer", {"inputs": []}, 400, ["missing", "INPUT0"]),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [fp32_input([1.0] * 9, [9, 1])]},
            400,
            ["batch-size must be <= 8", "INPUT0"],
        ),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [fp32_input([1.0, 2.0], [1, 3])]},
            400,
            ["INPUT0", "2 elements", "[1, 3]"],
        ),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [fp32_input([1.0])], "outputs": [{"name": "NOPE"}]},
            400,
            ["output", "NOPE"],
        ),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [fp32_input([1.0]), fp32_input([2.0])]},
            400,
            ["INPUT0", "more than once"],
        ),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [{**fp32_input([1.0]), "name": "EXTRA"}]},
            400,
            ["EXTRA"],
        ),
        (
            "/v2/models/identity_fp32/infer",
            {"inputs": [{**fp32_input([1.0]), "data": ["x"]}]},
            400,
            ["INPUT0", "string", "FP32"],
        ),
        ("/v2/models/identity_fp32/versions/7/infer", {"inputs": []}, 404, ["version 7"]),
        (
            "/v2/models/picky/infer",
            {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [-4]}]},
            400,
            ["must not start negative"],
        ),
        (
            "/v2/models/picky/infer",
            {"inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [13]}]},
            500,
            ["picky", "unlucky batch"],
        ),
    ],
)
def test_bad_requests(
    test_server: ServerProcess, path: str, body: Any, status: int, fragments: list[str]
) -> None:
    assert_error(post(test_server, path, json=body), status, *fragments)
    assert_still_serving(test_server)


def test_malformed_json(test_server: ServerProcess) -> None:
    reply = post(test_server, "/v2/models/identity_fp32/infer", content=b'{"inputs": [')
    assert_error(reply, 400, "malformed JSON")
    assert_still_serving(test_server)


def test_binary_size_mismatch(test_server: ServerProcess) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 4],
                    "parameters": {"binary_data_size": 16},
                }
            ]
        }
    ).encode()
    for extra, fragments in (
        (b"\0" * 12, ["binary_data_size is 16", "12 bytes"]),
        (b"\0" * 20, ["binary data size mismatch", "20 bytes"]),
    ):
        reply = post(
            test_server,
            "/v2/models/identity_fp32/infer",
            content=header + extra,
            headers={"Inference-Header-Content-Length": str(len(header))},
        )
        assert_error(reply, 400, *fragments)
    reply = post(
        test_server,
        "/v2/models/identity_fp32/infer",
        content=header,
        headers={"Inference-Header-Content-Length": str(len(header) + 5)},
    )
    assert_error(reply, 400, "Inference-Header-Content-Length")
    assert_still_serving(test_server)


def test_oversize_body(test_server: ServerProcess) -> None:
    # The server was started with --http-max-input-size 1000000.
    big = {"inputs": [fp32_input([0.5] * 300_000, [1, 300_000])]}
    reply = post(test_server, "/v2/models/identity_fp32/infer", json=big)
    assert_error(reply, 413, "exceeds the limit of 1000000 bytes")
    bomb = gzip.compress(b" " * 2_000_000)
    reply = post(
        test_server,
        "/v2/models/identity_fp32/infer",
        content=bomb,
        headers={"Content-Encoding": "gzip"},
    )
    assert_error(reply, 413, "decompressed")
    assert_still_serving(test_server)


def test_unknown_paths_and_methods(test_server: ServerProcess) -> None:
    base = f"http://{test_server.url}"
    reply = httpx.get(f"{base}/v3/nothing")
    assert_error(reply, 404, "Not Found")
    reply = httpx.get(f"{base}/v2/models/identity_fp32/infer")
    assert reply.status_code == 405
    reply = httpx.delete(f"{base}/v2/health/live")
    assert reply.status_code == 405
    assert_still_serving(test_server)


def test_failed_model_is_isolated_and_reported(test_server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(test_server.url)
    assert client.is_server_live()
    # Strict readiness: a model that failed to load makes the server not ready...
    assert not client.is_server_ready()
    assert not client.is_model_ready("broken")
    # ...while every other model serves, and the index says why "broken" failed.
    assert client.is_model_ready("identity_fp32")
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert index["broken"]["state"] == "UNAVAILABLE"
    assert "config.pbtxt" in index["broken"]["reason"]
    with pytest.raises(InferenceServerException, match="broken"):
        client.get_model_metadata("broken")
    client.close()


def test_request_error_does_not_fail_its_batch_mates(test_server: ServerProcess) -> None:
    def call(value: int) -> int:
        body = {
            "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [1, 1], "data": [value]}]
        }
        return post(test_server, "/v2/models/picky/infer", json=body).status_code

    values = [-1 if i % 3 == 0 else i + 20 for i in range(30)]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        statuses = list(pool.map(call, values))
    assert statuses == [400 if v < 0 else 200 for v in values]


def test_raw_binary_request(test_server: ServerProcess) -> None:
    data = np.arange(6, dtype=np.float32)
    reply = post(
        test_server,
        "/v2/models/identity_fp32/infer",
        content=data.tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert reply.status_code == 200, reply.text
    header_length = int(reply.headers["inference-header-content-length"])
    header = json.loads(reply.content[:header_length])
    assert header["outputs"][0]["shape"] == [1, 6]
    np.testing.assert_array_equal(np.frombuffer(reply.content[header_length:], np.float32), data)
