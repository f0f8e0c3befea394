"""Every extension ``GET /v2`` lists answers (so that the list in ``dataplane/assembly.py``
cannot claim what is not served): one probe per extension, through the HTTP app over the data
plane that the server's settings build. A new extension needs its probe here."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Awaitable, Callable
from multiprocessing import shared_memory
from pathlib import Path

import httpx
import numpy as np
import pytest

from infermux.dataplane.assembly import build_dataplane, build_repository, extensions
from infermux.frontends.http import HttpApp
from infermux.settings import ServerSettings
from tests.support import write_model

Probe = Callable[[httpx.AsyncClient], Awaitable[None]]
INFER = "/v2/models/ident/infer"


def tensor(values: list[float], **parameters: object) -> dict[str, object]:
    return {
        "name": "INPUT0",
        "datatype": "FP32",
        "shape": [1, len(values)],
        "data": values,
        **({"parameters": parameters} if parameters else {}),
    }


async def binary_tensor_data(http: httpx.AsyncClient) -> None:
    header = json.dumps(
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "FP32",
                    "shape": [1, 2],
                    "parameters": {"binary_data_size": 8},
                }
            ],
            "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}],
        }
    ).encode()
    body = header + np.array([1.5, 2.5], dtype="<f4").tobytes()
    reply = await http.post(
        INFER, content=body, headers={"Inference-Header-Content-Length": str(len(header))}
    )
    assert reply.status_code == 200, reply.text
    length = int(reply.headers["Inference-Header-Content-Length"])
    assert np.frombuffer(reply.content[length:], "<f4").tolist() == [1.5, 2.5]


async def classification(http: httpx.AsyncClient) -> None:
    body = {
        "inputs": [tensor([0.5, 2.0, 1.0])],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}],
    }
    reply = await http.post(INFER, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == ["2.000000:1", "1.000000:2"]


async def model_configuration(http: httpx.AsyncClient) -> None:
    reply = await http.get("/v2/models/ident/config")
    assert reply.status_code == 200
    assert reply.json()["name"] == "ident"


async def model_repository(http: httpx.AsyncClient) -> None:
    index = await http.post("/v2/repository/index", json={})
    assert index.status_code == 200
    assert {"name": "spare", "version": "1", "state": "READY"} in index.json()
    assert (await http.post("/v2/repository/models/spare/unload")).status_code == 200
    assert (await http.post("/v2/repository/models/spare/load")).status_code == 200


async def parameters(http: httpx.AsyncClient) -> None:
    body = {"parameters": {"custom": "x"}, "inputs": [tensor([1.0], note=3)]}
    reply = await http.post(INFER, json=body)
    assert reply.status_code == 200, reply.text


async def schedule_policy(http: httpx.AsyncClient) -> None:
    body = {"parameters": {"priority": 1, "timeout": 10_000_000}, "inputs": [tensor([2.0])]}
    reply = await http.post(INFER, json=body)
    assert reply.status_code == 200, reply.text
    assert reply.json()["outputs"][0]["data"] == [2.0]


async def statistics(http: httpx.AsyncClient) -> None:
    reply = await http.get("/v2/models/ident/stats")
    assert reply.status_code == 200
    assert reply.json()["model_stats"][0]["name"] == "ident"


async def system_shared_memory(http: httpx.AsyncClient) -> None:
    segment = shared_memory.SharedMemory(create=True, size=64)
    try:
        region = "/v2/systemsharedmemory/region/probe"
        body = {"key": segment.name, "offset": 0, "byte_size": 64}
        assert (await http.post(f"{region}/register", json=body)).status_code == 200
        status = await http.get(f"{region}/status")
        assert status.json() == [{"name": "probe", **body}]
        assert (await http.post(f"{region}/unregister")).status_code == 200
    finally:
        segment.close()
        segment.unlink()


async def cuda_shared_memory(http: httpx.AsyncClient) -> None:
    # Registering needs a GPU; the status endpoint answers on any host.
    reply = await http.get("/v2/cudasharedmemory/status")
    assert reply.status_code == 200
    assert reply.json() == []


async def logging(http: httpx.AsyncClient) -> None:
    before = (await http.get("/v2/logging")).json()
    assert {"log_info", "log_warning", "log_error", "log_verbose_level"} <= set(before)
    try:
        changed = await http.post("/v2/logging", json={"log_verbose_level": 1})
        assert changed.status_code == 200, changed.text
        assert (await http.get("/v2/logging")).json()["log_verbose_level"] == 1
    finally:  # the settings are the process's: leave them as they were
        await http.post("/v2/logging", json={"log_verbose_level": before["log_verbose_level"]})


async def trace(http: httpx.AsyncClient) -> None:
    assert (await http.get("/v2/trace/setting")).json()["trace_level"] == ["OFF"]
    try:
        changed = await http.post("/v2/models/ident/trace/setting", json={"trace_rate": "3"})
        assert changed.status_code == 200, changed.text
        assert (await http.get("/v2/models/ident/trace/setting")).json()["trace_rate"] == "3"
        assert (await http.get("/v2/trace/setting")).json()["trace_rate"] == "1000"
    finally:  # the settings are the process's: leave them as they were
        await http.post("/v2/models/ident/trace/setting", json={"trace_rate": None})


PROBES: dict[str, Probe] = {
    probe.__name__: probe
    for probe in (
        binary_tensor_data,
        classification,
        model_configuration,
        model_repository,
        parameters,
        schedule_policy,
        statistics,
        system_shared_memory,
        cuda_shared_memory,
        logging,
        trace,
    )
}


@pytest.fixture
async def http(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    write_model(tmp_path, "ident")
    write_model(tmp_path, "spare")
    settings = ServerSettings(
        model_repositories=(tmp_path,),
        model_control_mode="explicit",
        load_models=("*",),
        allow_client_shm=True,
    )
    repository = build_repository(settings)
    await repository.start()
    plane = build_dataplane(settings, repository)
    transport = httpx.ASGITransport(app=HttpApp(plane))
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        yield client
    await repository.close()
    plane.close()


async def test_every_listed_extension_has_a_probe() -> None:
    listed = extensions(ServerSettings(allow_client_shm=True))
    assert sorted(listed) == sorted(PROBES), "a listed extension needs its probe here"
    assert "system_shared_memory" not in extensions(ServerSettings(allow_client_shm=False))


@pytest.mark.parametrize("name", sorted(PROBES))
async def test_each_listed_extension_answers(http: httpx.AsyncClient, name: str) -> None:
    metadata = (await http.get("/v2")).json()
    assert name in metadata["extensions"]
    await PROBES[name](http)
