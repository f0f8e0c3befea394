"""Zero-downtime model lifecycle on the real ``infermux serve``: under continuous load from
several clients, new versions swapped in by poll mode, forced reloads in explicit mode, canary
weight changes and a corrupt new version all cost zero failed requests, and answers switch to
the new version. (How p99 fares during swaps is measured by benchmarks/lifecycle/swap.py.)"""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient

from tests.support import IDENTITY_MODEL, ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e


def times(n: int) -> str:
    """A model whose answer says which version it is: input x n."""
    return IDENTITY_MODEL.replace('r.inputs["INPUT0"]}', f'r.inputs["INPUT0"] * {n}}}')


class Load:
    """Clients sending requests without pause; every answer's multiplier is recorded."""

    def __init__(self, server: ServerProcess, clients: int = 4) -> None:
        self.url = server.url
        self.stop = threading.Event()
        self.failures: list[str] = []
        self.seen: list[float] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._run) for _ in range(clients)]

    def _run(self) -> None:
        client = httpclient.InferenceServerClient(self.url, network_timeout=30)
        x = np.ones((1, 4), dtype=np.float32)
        tensor = httpclient.InferInput("INPUT0", [1, 4], "FP32").set_data_from_numpy(x)
        while not self.stop.is_set():
            try:
                value = float(client.infer("m", [tensor]).as_numpy("OUTPUT0")[0, 0])
                with self.lock:
                    self.seen.append(value)
            except Exception as exc:
                with self.lock:
                    self.failures.append(repr(exc))
        client.close()

    def latest(self) -> float:
        with self.lock:
            return self.seen[-1] if self.seen else 0.0

    def wait_for(self, value: float, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.latest() == value and not self.failures:
                return
            time.sleep(0.05)
        raise AssertionError(f"answers did not switch to {value}: last {self.latest()}")


@contextmanager
def load(server: ServerProcess) -> Iterator[Load]:
    running = Load(server)
    for thread in running.threads:
        thread.start()
    try:
        yield running
    finally:
        running.stop.set()
        for thread in running.threads:
            thread.join(30)
    assert running.failures == [], running.failures[:5]
    assert len(running.seen) > 100


@pytest.mark.parametrize("frontends", [1, 2])
def test_poll_mode_swaps_and_a_corrupt_version(tmp_path: Path, frontends: int) -> None:
    model = write_model(tmp_path, "m", source=times(1), dims="[ 4 ]")
    args = ("--model-control-mode", "poll", "--repository-poll-secs", "0.2")
    with (
        start_server(
            "--model-repository", str(tmp_path), "--frontends", str(frontends), *args
        ) as server,
        load(server) as running,
    ):
        running.wait_for(1.0)
        for version in (2, 3, 4):
            (model / str(version)).mkdir()
            (model / str(version) / "model.py").write_text(times(version))
            running.wait_for(float(version))
        # A corrupt version: the old one keeps serving, the reason is in the index.
        (model / "5").mkdir()
        (model / "5" / "model.py").write_text("def broken(:\n")
        deadline = time.monotonic() + 30
        rows: list[dict[str, str]] = []
        while time.monotonic() < deadline:
            reply = httpx.post(f"http://{server.url}/v2/repository/index", json={})
            rows = [r for r in reply.json() if r.get("version") == "5"]
            if rows and rows[0].get("state") == "UNAVAILABLE":
                break
            time.sleep(0.1)
        assert rows, "version 5 never reported"
        assert rows[0]["state"] == "UNAVAILABLE", rows
        assert "import failed: SyntaxError" in rows[0]["reason"]
        time.sleep(0.5)
        assert running.latest() == 4.0
        assert httpx.get(f"http://{server.url}/v2/health/ready").status_code == 200
        with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
            metrics = response.read().decode()
        assert 'infermux_model_load_failures_total{model="m"} 1' in metrics


def test_explicit_reloads_and_canary_changes_under_load(tmp_path: Path) -> None:
    model = write_model(
        tmp_path,
        "m",
        source=times(1),
        dims="[ 4 ]",
        versions=(1, 2),
        extra="version_policy: { all { } }",
    )
    (model / "2" / "model.py").write_text(times(2))
    args = ("--model-control-mode", "explicit", "--load-model", "m")
    with (
        start_server("--model-repository", str(tmp_path), *args) as server,
        load(server) as running,
    ):
        base = f"http://{server.url}/v2"
        running.wait_for(2.0)
        for _ in range(3):  # forced reloads of an unchanged model: new instances, same answers
            assert httpx.post(f"{base}/repository/models/m/load", json={}).status_code == 200

        def step(answer: float, weights: dict[str, int]) -> None:
            reply = httpx.post(f"{base}/models/m/traffic", json={"weights": weights})
            assert reply.status_code == 200, reply.text
            running.wait_for(answer)

        step(1.0, {"1": 1})
        step(2.0, {"2": 1})
        httpx.post(f"{base}/models/m/traffic", json={"weights": {"1": 50, "2": 50}})
        time.sleep(0.5)
        with running.lock:
            recent = set(running.seen[-200:])
        assert recent == {1.0, 2.0}
        assert httpx.post(f"{base}/models/m/traffic/promote", json={"version": 1}).is_success
        running.wait_for(1.0)
