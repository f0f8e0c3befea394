"""Traffic policies on the real ``infermux serve`` (one process and several): the HTTP admin
API, canary weights, sticky routing keys from a header, shadow figures in the report and the
metrics, promote and rollback."""

from __future__ import annotations

import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import IDENTITY_MODEL, ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e

PLUS_ONE = IDENTITY_MODEL.replace('r.inputs["INPUT0"]}', 'r.inputs["INPUT0"] + 1}')


@pytest.fixture(scope="module", params=[1, 2])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("traffic")
    model = write_model(
        repo, "m", versions=(1, 2, 3), extra="version_policy: { all { } }\ndynamic_batching { }"
    )
    (model / "3" / "model.py").write_text(PLUS_ONE)
    with start_server(
        "--model-repository", str(repo), "--frontends", str(request.param), "--ipc-arena-mb", "4"
    ) as server:
        yield server


def infer(client: httpclient.InferenceServerClient, value: float = 1.0, **kw: Any) -> Any:
    x = np.full((1, 2), value, dtype=np.float32)
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(x)
    return client.infer("m", [tensor], **kw)


def traffic(server: ServerProcess, method: str = "GET", path: str = "", **kw: Any) -> Any:
    reply = httpx.request(method, f"http://{server.url}/v2/models/m/traffic{path}", **kw)
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_admin_api_canary_sticky_promote_rollback(server: ServerProcess) -> None:
    traffic(server, "DELETE")  # whatever an earlier test left
    report = traffic(server)
    assert report["served_versions"] == [1, 2, 3]
    client = httpclient.InferenceServerClient(server.url)
    assert infer(client).get_response()["model_version"] == "3"  # no policy: the highest
    report = traffic(server, "POST", json={"weights": {"1": 50, "2": 50}})
    assert (report["source"], report["policy"]["weights"]) == ("admin", {"1": 50.0, "2": 50.0})
    versions = Counter(infer(client).get_response()["model_version"] for _ in range(400))
    assert set(versions) == {"1", "2"}
    assert abs(versions["1"] - 200) < 60
    # A routing key (header) keeps a client on one version, over HTTP and gRPC alike.
    for key in ("alice", "bob", "carol"):
        # (tritonclient's HTTP client adds its own headers to the dict it is given)
        seen = {
            infer(client, headers={"infermux-routing-key": key}).get_response()["model_version"]
            for _ in range(20)
        }
        assert len(seen) == 1
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        x = np.ones((1, 2), dtype=np.float32)
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(x)
        answer = grpc.infer("m", [tensor], headers={"infermux-routing-key": key}).get_response()
        assert {answer.model_version} == seen
        grpc.close()
    # Promote: everything to version 2 from the next request; rollback: the 50/50 split again.
    report = traffic(server, "POST", "/promote", json={"version": 2})
    assert report["policy"]["weights"] == {"2": 1.0}
    assert {infer(client).get_response()["model_version"] for _ in range(30)} == {"2"}
    traffic(server, "POST", "/rollback")
    assert {infer(client).get_response()["model_version"] for _ in range(100)} == {"1", "2"}
    # A pinned version is always honoured.
    pinned = client.infer(
        "m",
        [
            httpclient.InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(
                np.ones((1, 2), np.float32)
            )
        ],
        model_version="3",
    )
    assert pinned.get_response()["model_version"] == "3"
    client.close()


def test_shadow_figures_in_the_report_and_the_metrics(server: ServerProcess) -> None:
    traffic(server, "POST", json={"weights": {"1": 1}, "shadow": {"version": 3}})
    client = httpclient.InferenceServerClient(server.url)
    for i in range(25):
        result = infer(client, float(i))
        assert result.get_response()["model_version"] == "1"
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), np.full((1, 2), float(i)))
    client.close()
    for _ in range(50):  # shadow runs finish in the background
        shadow = traffic(server)["shadow"]
        if shadow["compared"] == 25:
            break
    assert shadow["version"] == 3
    assert (shadow["mirrored"], shadow["disagreed"], shadow["agreed"]) == (25, 25, 0)
    assert shadow["max_abs_diff"] == {"OUTPUT0": 1.0}
    assert shadow["agreement_rate"] == 0.0
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    line = 'infermux_shadow_requests_total{model="m",version="3",outcome="disagreed"} 25'
    assert line in text
    assert 'infermux_shadow_max_abs_diff{model="m",version="3",output="OUTPUT0"} 1.0' in text


def test_bad_admin_requests_are_400_naming_the_field(server: ServerProcess) -> None:
    base = f"http://{server.url}/v2/models"
    reply = httpx.post(f"{base}/m/traffic", json={"weights": {"1": -5}})
    assert reply.status_code == 400
    assert "weights.1" in reply.json()["error"]
    reply = httpx.post(f"{base}/m/traffic", json={"weights": {"9": 1}})
    assert reply.status_code == 400
    assert "not served: 9" in reply.json()["error"]
    # "¹" passes str.isdigit() but int() refuses it: once a 500 found by schemathesis.
    for version in ("two", "\u00b9"):
        reply = httpx.post(f"{base}/m/traffic/promote", json={"version": version})
        assert reply.status_code == 400, reply.text
        assert "field 'version'" in reply.json()["error"]
    assert httpx.get(f"{base}/nope/traffic").status_code == 404
    assert httpx.put(f"{base}/m/traffic").status_code == 405
    assert httpx.get(f"{base}/m/traffic/rollback").status_code == 405
    # The server keeps serving.
    client = httpclient.InferenceServerClient(server.url)
    assert client.is_server_ready()
    client.close()


def test_policy_in_the_config_file(tmp_path: Path) -> None:
    policy = '{\\"weights\\": {\\"1\\": 1}}'
    extra = (
        "version_policy: { all { } }\n"
        f'parameters {{ key: "traffic_policy" value: {{ string_value: "{policy}" }} }}'
    )
    write_model(tmp_path, "m", versions=(1, 2), extra=extra)
    with start_server("--model-repository", str(tmp_path)) as server:
        assert traffic(server)["source"] == "config"
        client = httpclient.InferenceServerClient(server.url)
        assert {infer(client).get_response()["model_version"] for _ in range(20)} == {"1"}
        client.close()
