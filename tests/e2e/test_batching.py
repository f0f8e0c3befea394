"""Dynamic batching, backpressure and cancellation against the real server."""

from __future__ import annotations

import asyncio
import concurrent.futures
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.support import SLOW_MODEL, start_server, write_model

pytestmark = pytest.mark.e2e

MLP = """
from typing import Any

import numpy as np

WEIGHTS = np.random.default_rng(7).standard_normal((8, 4)).astype(np.float32)


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        x = np.concatenate([r.inputs["INPUT0"] for r in requests])
        y = x @ WEIGHTS
        out, start = [], 0
        for r in requests:
            out.append({"OUTPUT0": y[start : start + r.batch_size]})
            start += r.batch_size
        return out
"""


def test_sixty_four_concurrent_requests_are_batched(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "mlp", source=MLP)
    (model_dir / "config.pbtxt").write_text(
        'name: "mlp"\nbackend: "python"\nmax_batch_size: 32\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 8 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        "dynamic_batching { max_queue_delay_microseconds: 3000 }\n"
    )
    weights = np.random.default_rng(7).standard_normal((8, 4)).astype(np.float32)
    with start_server("--model-repository", str(tmp_path)) as server:
        url = f"http://{server.url}/v2/models/mlp/infer"
        xs = np.random.default_rng(1).standard_normal((64, 1, 8)).astype(np.float32)

        async def call_all() -> list[list[float]]:
            limits = httpx.Limits(max_connections=64)
            async with httpx.AsyncClient(limits=limits, timeout=60) as client:

                async def call(x: np.ndarray[Any, Any]) -> list[float]:
                    item = {"name": "INPUT0", "datatype": "FP32", "shape": [1, 8]}
                    body = {"inputs": [{**item, "data": x.reshape(-1).tolist()}]}
                    reply = await client.post(url, json=body)
                    assert reply.status_code == 200, reply.text
                    data: list[float] = reply.json()["outputs"][0]["data"]
                    return data

                return await asyncio.gather(*(call(x) for x in xs))

        answers = asyncio.run(call_all())
        for x, answer in zip(xs, answers, strict=True):
            np.testing.assert_allclose(answer, (x @ weights).reshape(-1), rtol=1e-5, atol=1e-5)
        stats = httpx.get(f"http://{server.url}/v2/models/mlp/stats").json()["model_stats"][0]
        assert stats["inference_count"] == 64
        assert stats["inference_count"] / stats["execution_count"] >= 4, stats
        assert server.stop() == 0


def test_overload_rejects_the_excess_quickly(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "slow",
        source=SLOW_MODEL,
        max_batch_size=1,
        extra="dynamic_batching { default_queue_policy { max_queue_size: 4 } }",
    )
    with start_server("--model-repository", str(tmp_path)) as server:
        url = f"http://{server.url}/v2/models/slow/infer"
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [0.3]}]}

        http = httpx.Client(limits=httpx.Limits(max_connections=20), timeout=60)

        def call(_: int) -> tuple[int, float, str]:
            started = time.monotonic()
            reply = http.post(url, json=body)
            return reply.status_code, time.monotonic() - started, reply.text

        call(0)  # connect once, so that the burst measures the server, not client set-up
        with concurrent.futures.ThreadPoolExecutor(20) as pool:
            results = list(pool.map(call, range(20)))
        ok = [r for r in results if r[0] == 200]
        rejected = [r for r in results if r[0] == 503]
        assert len(ok) + len(rejected) == 20
        # One executing + four queued, plus any that arrived after a slot freed up.
        assert 5 <= len(ok) <= 8
        assert all("Exceeds maximum queue size" in text for _, _, text in rejected)
        # Rejected at once, not after waiting for a slot (each admitted request takes 0.3 s).
        latencies = sorted(seconds for _, seconds, _ in rejected)
        assert latencies[len(latencies) // 2] < 0.3
        assert httpx.get(f"http://{server.url}/v2/health/ready").status_code == 200
        assert call(0)[0] == 200
        http.close()
        assert server.stop() == 0


def test_cancelled_clients_leave_the_queue(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "slow",
        source=SLOW_MODEL,
        max_batch_size=1,
        extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    )
    with start_server("--model-repository", str(tmp_path)) as server:
        url = f"http://{server.url}/v2/models/slow/infer"

        def body(seconds: float) -> dict[str, Any]:
            return {
                "inputs": [
                    {"name": "INPUT0", "datatype": "FP32", "shape": [1, 1], "data": [seconds]}
                ]
            }

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            busy = pool.submit(httpx.post, url, json=body(1.5), timeout=60)
            time.sleep(0.3)  # the instance is busy for 1.5 s
            # An HTTP client that gives up disconnects; its queued request must leave the queue.
            with pytest.raises(httpx.ReadTimeout):
                httpx.post(url, json=body(0.0), timeout=0.3)
            time.sleep(0.1)
            # A gRPC client whose deadline passes cancels; its request leaves the queue too.
            client = grpcclient.InferenceServerClient(server.grpc_url)
            item = grpcclient.InferInput("INPUT0", [1, 1], "FP32")
            item.set_data_from_numpy(np.zeros((1, 1), np.float32))
            with pytest.raises(InferenceServerException, match="Deadline"):
                client.infer("slow", [item], client_timeout=0.3)
            time.sleep(0.1)
            # The queue's single slot is free again: this request is admitted, not rejected.
            kept = httpx.post(url, json=body(0.0), timeout=60)
            assert kept.status_code == 200, kept.text
            assert busy.result().status_code == 200
            client.close()
        stats = httpx.get(f"http://{server.url}/v2/models/slow/stats").json()["model_stats"][0]
        assert stats["execution_count"] == 2  # the cancelled requests never ran
        assert server.stop() == 0
