"""The statistics extension over HTTP and gRPC, with the fields perf_analyzer reads strictly."""

from __future__ import annotations

import concurrent.futures

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import start_server

pytestmark = pytest.mark.e2e

DURATIONS = (
    "success",
    "fail",
    "queue",
    "compute_input",
    "compute_infer",
    "compute_output",
    "cache_hit",
    "cache_miss",
)


def _infer(url: str, rows: int) -> None:
    client = httpclient.InferenceServerClient(url)
    inputs = [httpclient.InferInput(n, [rows, 16], "INT32") for n in ("INPUT0", "INPUT1")]
    for infer_input in inputs:
        infer_input.set_data_from_numpy(np.ones((rows, 16), np.int32))
    client.infer("simple", inputs)
    client.close()


def test_statistics_count_what_happened() -> None:
    with start_server() as server:
        base = f"http://{server.url}"
        rows = [1, 2, 3] * 10
        with concurrent.futures.ThreadPoolExecutor(6) as pool:
            list(pool.map(lambda r: _infer(server.url, r), rows))
        bad = httpx.post(f"{base}/v2/models/simple/infer", json={"inputs": []})
        assert bad.status_code == 400
        doc = httpx.get(f"{base}/v2/models/simple/stats").json()
        (stats,) = doc["model_stats"]
        assert stats["name"] == "simple"
        assert stats["version"] == "1"
        assert stats["inference_count"] == sum(rows)
        assert 1 <= stats["execution_count"] <= len(rows)
        assert stats["last_inference"] > 0
        inference = stats["inference_stats"]
        assert set(inference) == set(DURATIONS)
        for key in DURATIONS:
            assert isinstance(inference[key]["count"], int)
            assert isinstance(inference[key]["ns"], int)
        assert inference["success"]["count"] == len(rows)
        assert inference["fail"]["count"] == 1
        assert inference["queue"]["count"] == len(rows)
        assert inference["compute_infer"]["ns"] > 0
        assert inference["success"]["ns"] >= inference["compute_infer"]["ns"]
        batches = stats["batch_stats"]
        assert sum(b["compute_infer"]["count"] for b in batches) == stats["execution_count"]
        assert {b["batch_size"] for b in batches} <= set(range(1, 9))
        # Every model, one model, one version; gRPC reports the same counters.
        everything = httpx.get(f"{base}/v2/models/stats").json()["model_stats"]
        assert {s["name"] for s in everything} == {
            "simple",
            "simple_string",
            "simple_identity",
            "identity_fp32",
        }
        one = httpx.get(f"{base}/v2/models/simple/versions/1/stats").json()["model_stats"]
        assert one[0]["inference_count"] == sum(rows)
        client = grpcclient.InferenceServerClient(server.grpc_url)
        grpc_stats = client.get_inference_statistics("simple", as_json=True)["model_stats"][0]
        assert int(grpc_stats["inference_count"]) == sum(rows)
        assert int(grpc_stats["inference_stats"]["success"]["count"]) == len(rows)
        with pytest.raises(InferenceServerException, match="nope"):
            client.get_inference_statistics("nope")
        client.close()
        assert httpx.get(f"{base}/v2/models/nope/stats").status_code == 404
        assert server.stop() == 0
