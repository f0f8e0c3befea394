"""Process lifecycle: flags, graceful shutdown, explicit and poll model control."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import IDENTITY_MODEL, SLOW_MODEL, start_server, write_model

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    ("args", "fragment"),
    [
        (["--no-such-flag"], "unrecognized arguments: --no-such-flag"),
        (["--http-port", "70000"], "outside 0-65535"),
        (["--model-control-mode", "sometimes"], "invalid choice"),
        (["--strict-readiness=maybe"], "expected true or false"),
        (["--load-model", "simple"], "requires --model-control-mode=explicit"),
        (["--model-repository", "/does/not/exist"], "not a directory"),
        (["--http-port", "9000", "--grpc-port", "9000"], "must differ"),
    ],
)
def test_invalid_flags_exit_2_with_one_line(args: list[str], fragment: str) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "infermux", "serve", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert fragment in lines[0]


def test_port_in_use_is_a_clear_error() -> None:
    with start_server() as first:
        done = subprocess.run(
            [sys.executable, "-m", "infermux", "serve", "--http-port", str(first.http_port)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 1
        assert f"cannot listen on 127.0.0.1:{first.http_port}" in done.stderr
        assert first.stop() == 0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_shutdown_finishes_in_flight_requests(tmp_path: Path, sig: int) -> None:
    write_model(tmp_path, "slow", source=SLOW_MODEL, max_batch_size=0)
    with start_server("--model-repository", str(tmp_path)) as server:
        url = f"http://{server.url}/v2/models/slow/infer"
        body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [1.0]}]}
        replies: list[httpx.Response] = []
        worker = threading.Thread(target=lambda: replies.append(httpx.post(url, json=body)))
        worker.start()
        time.sleep(0.4)  # the request is now executing (it sleeps one second)
        assert server.stop(sig) == 0
        worker.join(10)
        assert replies, "the in-flight request got no answer"
        assert replies[0].status_code == 200
        assert replies[0].json()["outputs"][0]["data"] == [1.0]
        assert any("shutting down" in line for line in server.log)


# Holds 256 MiB in a reference cycle, as models' objects often do: only the collector frees it.
HOG_MODEL = """
from typing import Any

import numpy as np


class Model:
    def initialize(self, context: Any) -> None:
        self.buffer = np.ones(32 * 1024 * 1024)  # 256 MiB, touched
        self.me = self

    def execute(self, requests: list[Any]) -> list[Any]:
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""


def resident_mib(pids: list[int]) -> float:
    total = 0
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                total += int(line.split()[1])
    return total / 1024


@pytest.mark.parametrize("frontends", ["1", "2"], ids=["one-process", "frontends-2"])
def test_a_model_loaded_at_start_is_freed_when_unloaded(tmp_path: Path, frontends: str) -> None:
    # Serving processes freeze what start-up built (runtime/garbage.py): the unload must still
    # reach a model loaded then.
    write_model(tmp_path, "hog", source=HOG_MODEL)
    args = ["--model-repository", str(tmp_path), "--model-control-mode", "explicit"]
    with start_server(*args, "--load-model", "hog", "--frontends", frontends) as server:
        pids = [server.process.pid, *server.children()]
        loaded = resident_mib(pids)
        client = httpclient.InferenceServerClient(server.url)
        client.unload_model("hog")
        deadline = time.monotonic() + 30
        while resident_mib(pids) > loaded - 200 and time.monotonic() < deadline:
            time.sleep(0.2)
        assert resident_mib(pids) <= loaded - 200, (loaded, resident_mib(pids))
        client.close()
        assert server.stop() == 0


def test_explicit_model_control(tmp_path: Path) -> None:
    write_model(tmp_path, "a", source=IDENTITY_MODEL)
    write_model(tmp_path, "b", source=IDENTITY_MODEL)
    args = ["--model-repository", str(tmp_path), "--model-control-mode", "explicit"]
    with start_server(*args, "--load-model", "a") as server:
        client = httpclient.InferenceServerClient(server.url)
        assert client.is_model_ready("a")
        assert not client.is_model_ready("b")
        client.load_model("b")
        assert client.is_model_ready("b")
        # A config override replaces the file's config for this load.
        override = (
            '{"name": "b", "backend": "python", "max_batch_size": 2,'
            ' "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],'
            ' "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}]}'
        )
        client.load_model("b", config=override)
        assert client.get_model_config("b")["max_batch_size"] == 2
        client.unload_model("a")
        assert not client.is_model_ready("a")
        states = {(r["name"], r.get("state")) for r in client.get_model_repository_index()}
        assert ("a", "UNAVAILABLE") in states
        assert ("b", "READY") in states
        with pytest.raises(InferenceServerException, match="no such model"):
            client.load_model("missing")
        client.close()
        assert server.stop() == 0


def test_load_api_refused_outside_explicit_mode() -> None:
    with start_server() as server:
        client = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException, match="explicit"):
            client.unload_model("simple")
        assert client.is_model_ready("simple")
        client.close()
        assert server.stop() == 0


def test_poll_mode_picks_up_new_and_changed_models(tmp_path: Path) -> None:
    write_model(tmp_path, "a", source=IDENTITY_MODEL)
    args = ["--model-repository", str(tmp_path), "--model-control-mode", "poll"]
    with start_server(*args, "--repository-poll-secs", "0.2") as server:
        client = httpclient.InferenceServerClient(server.url)
        write_model(tmp_path, "b", source=IDENTITY_MODEL)
        deadline = time.monotonic() + 20
        while not client.is_model_ready("b") and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.is_model_ready("b")
        # A new version directory is picked up and becomes the default version.
        write_model(tmp_path, "a", source=IDENTITY_MODEL, versions=(2,))
        while client.get_model_metadata("a")["versions"] != ["2"] and time.monotonic() < deadline:
            time.sleep(0.1)
        assert client.get_model_metadata("a")["versions"] == ["2"]
        client.close()
        assert server.stop() == 0
