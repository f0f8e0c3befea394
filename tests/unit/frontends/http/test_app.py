"""The HTTP app in-process (ASGI transport): routing, status mapping, encodings."""

from __future__ import annotations

import gzip
import json
import zlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.frontends.http import HttpApp
from infermux.repository import ControlMode, ModelRepository
from tests.support import write_model

BINARY_OUT = """
from typing import Any


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        return [{"OUTPUT0": [[b"\\xff\\xfe"]]} for r in requests]
"""


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    write_model(tmp_path, "ident")
    write_model(tmp_path, "words", datatype="BYTES")
    write_model(tmp_path, "rawbytes", datatype="BYTES", dims="[ 1 ]", source=BINARY_OUT)
    write_model(tmp_path, "fixed", dims="[ 2, 2 ]", max_batch_size=0)
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    plane = DataPlane(repository, version="9.9", extensions=("x",))
    app = HttpApp(plane, max_body=10_000)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as http:
        yield http
    await repository.close()


def infer_body(values: list[float]) -> dict[str, object]:
    return {
        "inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}
        ]
    }


async def test_health_and_server_metadata(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/health/live")).status_code == 200
    ready = await client.get("/v2/health/ready")
    assert ready.status_code == 200
    assert ready.content == b""
    assert (await client.get("/v2")).json() == {
        "name": "infermux",
        "version": "9.9",
        "extensions": ["x"],
    }


async def test_model_endpoints_with_and_without_version(client: httpx.AsyncClient) -> None:
    for prefix in ("/v2/models/ident", "/v2/models/ident/versions/1"):
        meta = (await client.get(prefix)).json()
        assert meta["versions"] == ["1"]
        assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, -1]}]
        assert (await client.get(f"{prefix}/ready")).status_code == 200
        config = (await client.get(f"{prefix}/config")).json()
        assert config["max_batch_size"] == 8
        reply = await client.post(f"{prefix}/infer", json=infer_body([1.0, 2.0]))
        assert reply.json()["outputs"][0]["data"] == [1.0, 2.0]
    not_ready = await client.get("/v2/models/ident/versions/3/ready")
    assert not_ready.status_code == 400
    assert not_ready.json() == {"error": "Model version not ready"}


async def test_binary_output_and_request_id(client: httpx.AsyncClient) -> None:
    body = {**infer_body([3.0]), "id": "abc", "parameters": {"binary_data_output": True}}
    reply = await client.post("/v2/models/ident/infer", json=body)
    assert reply.headers["content-type"] == "application/octet-stream"
    length = int(reply.headers["inference-header-content-length"])
    header = json.loads(reply.content[:length])
    assert header["id"] == "abc"
    assert header["outputs"][0]["parameters"] == {"binary_data_size": 4}
    assert np.frombuffer(reply.content[length:], np.float32).tolist() == [3.0]


async def test_compression_both_ways(client: httpx.AsyncClient) -> None:
    raw = json.dumps(infer_body([5.0])).encode()
    for encoding, packed in (("gzip", gzip.compress(raw)), ("deflate", zlib.compress(raw))):
        reply = await client.post(
            "/v2/models/ident/infer",
            content=packed,
            headers={"Content-Encoding": encoding, "Accept-Encoding": encoding},
        )
        assert reply.status_code == 200, reply.text
        assert reply.headers["content-encoding"] == encoding
        assert reply.json()["outputs"][0]["data"] == [5.0]  # httpx decompresses
    reply = await client.post(
        "/v2/models/ident/infer", content=raw, headers={"Content-Encoding": "br"}
    )
    assert reply.status_code == 415
    reply = await client.post(
        "/v2/models/ident/infer", content=b"not gzip", headers={"Content-Encoding": "gzip"}
    )
    assert reply.status_code == 400
    assert "not valid gzip" in reply.json()["error"]
    reply = await client.post(
        "/v2/models/ident/infer",
        content=gzip.compress(raw)[:-12],
        headers={"Content-Encoding": "gzip"},
    )
    assert reply.status_code == 400
    assert "truncated" in reply.json()["error"]


async def test_metadata_is_never_compressed(client: httpx.AsyncClient) -> None:
    reply = await client.get("/v2/models/ident", headers={"Accept-Encoding": "gzip"})
    assert "content-encoding" not in reply.headers


async def test_non_utf8_bytes_cannot_go_as_json(client: httpx.AsyncClient) -> None:
    body = {
        "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [1, 1], "data": ["a"]}],
        "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": False}}],
    }
    reply = await client.post("/v2/models/rawbytes/infer", json=body)
    assert reply.status_code == 400
    assert "binary_data: true" in reply.json()["error"]


async def test_raw_binary_bytes_and_fixed_shapes(client: httpx.AsyncClient) -> None:
    payload = b"".join(len(w).to_bytes(4, "little") + w for w in (b"ab", b"", b"xyz"))
    reply = await client.post(
        "/v2/models/words/infer",
        content=payload,
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["inference-header-content-length"])
    assert json.loads(reply.content[:length])["outputs"][0]["shape"] == [1, 3]
    reply = await client.post(
        "/v2/models/fixed/infer",
        content=np.zeros(4, np.float32).tobytes(),
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert reply.status_code == 200, reply.text
    reply = await client.post(
        "/v2/models/fixed/infer",
        content=b"\0" * 3,
        headers={"Inference-Header-Content-Length": "0"},
    )
    assert reply.status_code == 400
    assert "INPUT0" in reply.json()["error"]


async def test_bad_header_and_limits(client: httpx.AsyncClient) -> None:
    # b"\xb9" is latin-1 "¹", which str.isdigit() accepts and int() refuses.
    for value in (b"x", b"\xb9"):
        reply = await client.post(
            "/v2/models/ident/infer",
            content=b"{}",
            headers={b"Inference-Header-Content-Length": value},
        )
        assert reply.status_code == 400, reply.text
        assert "Inference-Header-Content-Length" in reply.json()["error"]
    reply = await client.post("/v2/models/ident/infer", content=b"[" * 20_000)
    assert reply.status_code == 413


async def test_repository_api(client: httpx.AsyncClient) -> None:
    index = (await client.post("/v2/repository/index", json={"ready": True})).json()
    assert {row["name"] for row in index} == {"ident", "words", "rawbytes", "fixed"}
    assert (await client.post("/v2/repository/index", json={"ready": 3})).status_code == 400
    assert (await client.post("/v2/repository/index", content=b"[1]")).status_code == 400
    assert (await client.post("/v2/repository/models/ident/unload")).status_code == 200
    assert (await client.get("/v2/models/ident/ready")).status_code == 400
    reply = await client.post("/v2/repository/models/ident/load", json={})
    assert reply.status_code == 200
    reply = await client.post(
        "/v2/repository/models/ident/load", json={"parameters": {"file:1/model.py": "eA=="}}
    )
    assert reply.status_code == 400  # Triton: override files need the config
    assert "failed to load 'ident': override files need the 'config'" in reply.json()["error"]
    reply = await client.post(
        "/v2/repository/models/ident/load",
        json={"parameters": {"config": "{}", "file:1/model.py": "not base64!"}},
    )
    assert reply.status_code == 400
    assert "'file:1/model.py' must be the file's content in base64" in reply.json()["error"]
    reply = await client.post(
        "/v2/repository/models/ident/load", json={"parameters": {"config": 5}}
    )
    assert reply.status_code == 400
    reply = await client.post("/v2/repository/models/ident/load", json={"parameters": []})
    assert reply.status_code == 400


async def test_unknown_routes(client: httpx.AsyncClient) -> None:
    assert (await client.get("/v2/models/ident/bogus")).status_code == 404
    assert (await client.put("/v2")).status_code == 405
    assert (await client.post("/v2/models/ident")).status_code == 405


async def test_cuda_shared_memory_is_off_by_default(client: httpx.AsyncClient) -> None:
    reply = await client.get("/v2/cudasharedmemory/status")
    assert reply.status_code == 501
    assert "--allow-client-shm" in reply.json()["error"]
    assert (await client.post("/v2/cudasharedmemory/register")).status_code == 404


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ({"device_id": 0, "byte_size": 8}, "field 'raw_handle' must be an object"),
        ({"raw_handle": "abc", "byte_size": 8}, "field 'raw_handle' must be an object"),
        ({"raw_handle": {"b64": "!!"}, "byte_size": 8}, "'raw_handle.b64' is not valid base64"),
        ({"raw_handle": {"b64": "\u00e9"}, "byte_size": 8}, "'raw_handle.b64' is not valid base64"),
        ({"raw_handle": {"b64": "AAAA"}, "device_id": "0", "byte_size": 8}, "'device_id'"),
        ({"raw_handle": {"b64": "AAAA"}}, "field 'byte_size' must be an integer"),
    ],
)
async def test_cuda_register_body_errors_name_the_field(
    client: httpx.AsyncClient, body: dict[str, object], message: str
) -> None:
    reply = await client.post("/v2/cudasharedmemory/region/c/register", json=body)
    assert reply.status_code == 400
    assert message in reply.json()["error"]


async def test_system_shared_memory_is_off_by_default(client: httpx.AsyncClient) -> None:
    reply = await client.get("/v2/systemsharedmemory/status")
    assert reply.status_code == 501
    assert "--allow-client-shm" in reply.json()["error"]
    assert (await client.post("/v2/systemsharedmemory/register")).status_code == 404


async def test_statistics_routes(client: httpx.AsyncClient) -> None:
    await client.post("/v2/models/ident/infer", json=infer_body([1.0]))
    every = (await client.get("/v2/models/stats")).json()["model_stats"]
    assert {s["name"] for s in every} == {"ident", "words", "rawbytes", "fixed"}
    one = (await client.get("/v2/models/ident/versions/1/stats")).json()["model_stats"]
    assert one[0]["inference_count"] == 1
    assert (await client.get("/v2/models/ghost/stats")).status_code == 404
    assert (await client.get("/v2/models/ident/versions/9/stats")).status_code == 404
    await client.post("/v2/repository/models/ident/unload")
    assert (await client.get("/v2/models/ident/stats")).status_code == 503


async def test_unknown_model_is_answered_before_a_malformed_body(client: httpx.AsyncClient) -> None:
    for body in (b"{not json", b'{"inputs": 3}'):
        reply = await client.post("/v2/models/nobody/infer", content=body)
        assert reply.status_code == 404
        assert reply.json() == {"error": "Request for unknown model: 'nobody' is not found"}
        known = await client.post("/v2/models/ident/infer", content=body)
        assert known.status_code == 400
    bad_header = {"inference-header-content-length": "x"}
    reply = await client.post("/v2/models/nobody/infer", content=b"{}", headers=bad_header)
    assert reply.status_code == 404
    reply = await client.post("/v2/models/ident/versions/7/infer", content=b"{")
    assert reply.status_code == 404
    assert "version" in reply.json()["error"]


async def test_logging_get_and_post(client: httpx.AsyncClient) -> None:
    from infermux.observability import logs

    before = (await client.get("/v2/logging")).json()
    assert set(before) == {
        "log_file", "log_info", "log_warning", "log_error", "log_verbose_level", "log_format"
    }  # fmt: skip
    try:
        reply = await client.post("/v2/logging", json={"log_warning": False})
        assert reply.status_code == 200
        assert reply.json() == {**before, "log_warning": False}
        refused = await client.post("/v2/logging", json={"log_nonsense": 1})
        assert refused.status_code == 400
        assert "log_nonsense" in refused.json()["error"]
        assert (await client.put("/v2/logging")).status_code == 405
    finally:
        logs.update_log_settings(before)
