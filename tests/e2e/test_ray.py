"""``infermux serve --ray``: a local Ray cluster of two nodes on this machine (``ray start --head``
plus a second node with its own resources), infermux's front ends as the ingress, black-box with
tritonclient.

``who`` answers the pid of the replica that ran it (two replicas of one CPU; two per node fit,
so that a rolling update has room for the new replicas beside the old);
``slow`` sleeps, with one replica taking one request at a time and one more queued, to see Ray's
backpressure as 503. ``repeat`` and ``ticker`` are the decoupled models of
``test_decoupled.py`` and ``test_decoupled_processes.py``, their responses streamed from their
replica. Skipped, with the reason, where Ray is not installed or cannot start.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.test_decoupled import CONFIG, NATIVE, Stream
from tests.e2e.test_decoupled_processes import TICKER, TICKER_CONFIG, Ticker, wait_for
from tests.e2e.test_generate import events
from tests.support import ServerProcess, parameter, start_server, write_model

pytest.importorskip("ray.serve", reason="Ray is an optional extra (pip install 'infermux[ray]')")

WHO_MODEL = """
import os
import time
from typing import Any

import numpy as np


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        time.sleep(float(requests[0].inputs["INPUT0"].reshape(-1)[0]))
        pid = os.getpid()
        return [{"OUTPUT0": np.full(r.inputs["INPUT0"].shape, pid, np.int64)} for r in requests]
"""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def ray_cli() -> str:
    beside = Path(sys.executable).parent / "ray"  # the venv's, even when it is not on PATH
    return str(beside) if beside.exists() else shutil.which("ray") or "ray"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    port = free_port()
    temp = tmp_path_factory.mktemp("ray")
    # A token of this test's own (Ray enables token auth when ~/.ray/auth_token exists); every
    # process of the cluster, and infermux's ingress, read it from the environment.
    auth = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": secrets.token_hex(32)}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in {**auth, "RAY_USAGE_STATS_ENABLED": "0"}.items():
            patch.setenv(name, value)
        common = ["--num-cpus=2", "--disable-usage-stats"]  # logical CPUs: room for a roll

        def start(*args: str) -> subprocess.CompletedProcess[str]:
            return subprocess.run(
                [ray_cli(), "start", *args, *common], capture_output=True, text=True,
                timeout=180, check=False,
            )  # fmt: skip

        head = start("--head", f"--port={port}", "--include-dashboard=false",
                     f"--temp-dir={temp}", '--resources={"node_a": 1}')  # fmt: skip
        if head.returncode != 0:
            pytest.skip(f"Ray cannot start here: {head.stderr[-800:]}")
        address = f"127.0.0.1:{port}"
        try:
            second = start(f"--address={address}", '--resources={"node_b": 1}')
            if second.returncode != 0:
                pytest.skip(f"a second Ray node cannot start here: {second.stderr[-800:]}")
            yield address
        finally:
            subprocess.run([ray_cli(), "stop", "--force"], capture_output=True, check=False)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("ray-repo")
    one = functools.partial(
        write_model, datatype="FP32", dims="[ 1 ]", max_batch_size=0, source=WHO_MODEL
    )
    one(repo, "who", extra=parameter("ray_num_replicas", "2") + parameter("ray_num_cpus", "1"))
    slow = parameter("ray_num_cpus", "0") + parameter("ray_max_ongoing_requests", "1")
    one(repo, "slow", extra=slow + parameter("ray_max_queued_requests", "1"))
    # Two versions, half the keys each, sticky on routing_key, on two replicas.
    policy = '{\\"weights\\": {\\"1\\": 50, \\"2\\": 50}}'
    canary = "version_policy: { all { } }\n" + parameter("traffic_policy", policy)
    canary += parameter("ray_num_replicas", "2") + parameter("ray_num_cpus", "0")
    one(repo, "canary", extra=canary, versions=(1, 2))
    no_cpu = parameter("ray_num_cpus", "0")
    for name, config, source in (
        ("repeat", CONFIG.format(name="repeat", extra=no_cpu), NATIVE),
        ("ticker", TICKER_CONFIG + no_cpu, TICKER),
    ):
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(config)
        (repo / name / "1" / "model.py").write_text(source)
    return repo


@pytest.fixture(scope="module")
def server(cluster: str, repository: Path) -> Iterator[ServerProcess]:
    with start_server(
        "--model-repository", str(repository), "--ray", cluster,
        "--model-control-mode=explicit", "--load-model=*", timeout=300,
    ) as server:  # fmt: skip
        yield server
        assert server.stop() == 0


def who(
    server: ServerProcess, key: str | None = None, sleep: float = 0.0, model: str = "who"
) -> int:
    # Closed here, on the thread that made it: left to the garbage collector, a client's gevent
    # pool is joined on whichever thread collects it, which may have no gevent hub (CI saw
    # that as an unraisable exception failing a later test).
    with httpclient.InferenceServerClient(server.url, network_timeout=120) as client:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([sleep], np.float32))
        parameters = {"routing_key": key} if key is not None else None
        result = client.infer(model, [tensor], parameters=parameters)
    return int(result.as_numpy("OUTPUT0")[0])


def test_two_replicas_on_two_nodes_both_serve(server: ServerProcess) -> None:
    with httpclient.InferenceServerClient(server.url) as client:
        assert client.is_server_ready()
        assert client.is_model_ready("who")
        assert client.get_model_metadata("who")["inputs"][0]["name"] == "INPUT0"
    with ThreadPoolExecutor(4) as pool:
        pids = set(pool.map(lambda _: who(server, sleep=0.01), range(60)))
    assert len(pids) == 2


def test_a_routing_key_sticks_to_one_replica(server: ServerProcess) -> None:
    homes = {}
    for key in (f"user-{i}" for i in range(12)):
        answers = {who(server, key) for _ in range(5)}
        assert len(answers) == 1, f"{key} was served by {answers}"
        homes[key] = answers.pop()
    assert len(set(homes.values())) == 2  # and the keys spread over both replicas


def test_a_sticky_canary_keeps_each_key_on_one_version_and_one_replica(
    server: ServerProcess,
) -> None:
    seen = {}
    with httpclient.InferenceServerClient(server.url) as client:
        for key in (f"user-{i}" for i in range(16)):
            answers = set()
            for _ in range(4):
                tensor = httpclient.InferInput("INPUT0", [1], "FP32")
                tensor.set_data_from_numpy(np.zeros(1, np.float32))
                result = client.infer("canary", [tensor], parameters={"routing_key": key})
                version = result.get_response()["model_version"]
                answers.add((version, int(result.as_numpy("OUTPUT0")[0])))
            assert len(answers) == 1, f"{key}: {answers}"
            seen[key] = answers.pop()
    assert {version for version, _ in seen.values()} == {"1", "2"}
    assert len({pid for _, pid in seen.values()}) == 2


def test_a_full_replica_queue_is_503(server: ServerProcess) -> None:
    def call(_: int) -> tuple[str, str]:
        try:
            who(server, sleep=1.0, model="slow")
        except InferenceServerException as exc:
            return str(exc.status()), str(exc.message())
        return "200", ""

    with ThreadPoolExecutor(6) as pool:
        outcomes = list(pool.map(call, range(6)))
    statuses = [status for status, _ in outcomes]
    assert "200" in statuses  # the replica's one slot (and its one queue place, when in time)
    assert "503" in statuses
    assert set(statuses) <= {"200", "503"}
    assert all("ray_max_queued_requests" in m for s, m in outcomes if s == "503")


@contextlib.contextmanager
def load(
    server: ServerProcess, clients: int, sleep: float
) -> Iterator[tuple[list[int], list[str]]]:
    """``clients`` threads sending requests to ``who`` until the block ends: the pids that
    answered, in order, and the failures ("status message")."""
    stop = threading.Event()
    ok: list[int] = []
    failed: list[str] = []

    def client() -> None:
        while not stop.is_set():
            try:
                ok.append(who(server, sleep=sleep))
            except InferenceServerException as exc:
                failed.append(f"{exc.status()} {exc.message()}")

    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    try:
        yield ok, failed
    finally:
        stop.set()
        for thread in threads:
            thread.join()


def test_killing_a_replica_mid_load_fails_at_most_its_in_flight(server: ServerProcess) -> None:
    with load(server, clients=4, sleep=0.02) as (ok, failed):
        time.sleep(2)
        victim = ok[-1]
        os.kill(victim, signal.SIGKILL)
        time.sleep(4)
    after = [pid for pid in ok[ok.index(victim) :] if pid != victim]
    assert after, "requests stopped being answered after the kill"
    # One replica holds at most max_ongoing_requests (8 by default) of the 4 clients' requests.
    assert len(failed) <= 4, failed
    assert all(f.startswith("503") for f in failed), failed


def test_a_model_update_rolls_through_replicas_without_failed_requests(
    server: ServerProcess, repository: Path
) -> None:
    before = {who(server, f"k{i}") for i in range(8)}
    with (
        httpclient.InferenceServerClient(server.url, network_timeout=300) as client,
        load(server, clients=3, sleep=0.01) as (ok, failed),
    ):
        model_py = repository / "who" / "1" / "model.py"
        model_py.write_text(model_py.read_text() + "\n# changed\n")  # a new deployment version
        client.load_model("who")  # returns once the new replicas serve
        time.sleep(1)
        index = {m["name"]: m for m in client.get_model_repository_index()}
    assert failed == []
    after = {who(server, f"k{i}") for i in range(8)}
    assert not before & after  # every replica is a new process
    assert len(ok) > 10
    assert index["who"]["state"] == "READY"
    assert json.dumps(index)  # serialisable as the HTTP API sends it


def test_a_decoupled_model_streams_in_order_with_errors_and_batches(
    server: ServerProcess,
) -> None:
    stream = Stream(server)
    try:
        stream.send("repeat", [7, -1, 9], "r")
        answers = stream.take(4)
        for request_id in ("a", "b", "c"):  # within the model's 300 ms queue delay
            stream.send("repeat", [1, 2], request_id)
        batched = stream.take(9)
    finally:
        stream.close()
    assert answers[0] == ("ok", ("r", 7, 0, 1, False))
    assert answers[1][0] == "error"
    assert "negative value at 1" in answers[1][1]
    assert answers[2:] == [("ok", ("r", 9, 2, 1, False)), ("ok", ("r", None, None, None, True))]
    assert {answer[3] for kind, answer in batched if answer[1] is not None} == {3}


def test_generate_stream_streams_a_decoupled_model(server: ServerProcess) -> None:
    with httpx.Client(base_url=f"http://{server.url}", timeout=60) as client:
        status, data = events(client, "repeat", {"IN": [4, 5, 6]})
    assert status == 200
    assert [(d["OUT"], d["IDX"]) for d in data] == [(4, 0), (5, 1), (6, 2)]


def test_a_client_that_leaves_cancels_the_request_in_the_replica(
    server: ServerProcess, repository: Path
) -> None:
    ticker = Ticker(repository)
    body = {"IN": ticker.args(100_000, delay_ms=10)}
    with (
        httpx.Client(base_url=f"http://{server.url}", timeout=60) as client,
        client.stream("POST", "/v2/models/ticker/generate_stream", json=body) as reply,
    ):
        assert next(reply.iter_lines()).startswith("data: ")
    wait_for(ticker.cancelled, "the model did not see its request cancelled")
    assert ticker.progress() < 100_000


def test_a_client_that_stops_reading_holds_the_replica_back(
    server: ServerProcess, repository: Path
) -> None:
    # As with front-end processes: the replica's response buffer, the credit window between
    # replica and ingress, and what the sockets hold; Ray's own streaming has no bound.
    ticker = Ticker(repository)
    total = 400
    body = {"IN": ticker.args(total, size=16384)}
    with (
        httpx.Client(base_url=f"http://{server.url}", timeout=120) as client,
        client.stream("POST", "/v2/models/ticker/generate_stream", json=body) as reply,
    ):
        lines = (json.loads(line.removeprefix("data: ")) for line in reply.iter_lines() if line)
        assert next(lines)["IDX"] == 0
        wait_for(lambda: ticker.progress() > 16, "the model did not run ahead at all")
        time.sleep(3)
        held = ticker.progress()
        assert held <= total // 2, f"the model ran {held} responses ahead of a stalled reader"
        indexes = [doc["IDX"] for doc in lines]
    assert indexes == list(range(1, total))
