"""``infermux serve --executors 2``: two executor processes behind the front ends.

Black-box: the real server, driven by tritonclient. ``simple`` has two CPU instances (one on each
executor), ``simple_string`` one (executor 0 alone). Requests reach both executors, statistics
and metrics add up over them exactly, and an executor that dies costs only what it hosts alone
until its replacement is ready.
"""

from __future__ import annotations

import os
import shutil
import signal
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from infermux.settings import builtin_repository
from tests.support import ServerProcess, failures_until_answered, start_server, wait_for

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("executors")
    for name in ("simple", "simple_string"):
        shutil.copytree(builtin_repository() / name, root / name)
    config = root / "simple" / "config.pbtxt"
    config.write_text(
        config.read_text().replace("count: 1, kind: KIND_CPU", "count: 2, kind: KIND_CPU")
    )
    return root


def serve(repository: Path, frontends: int = 2) -> ServerProcess:
    return start_server(
        "--model-repository", str(repository), "--frontends", str(frontends),
        "--executors", "2", "--ipc-arena-mb", "4",
    )  # fmt: skip


def simple_inputs(i: int) -> list[httpclient.InferInput]:
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = httpclient.InferInput(name, [1, 16], "INT32")
        tensor.set_data_from_numpy(np.full((1, 16), i, dtype=np.int32))
        tensors.append(tensor)
    return tensors


def string_inputs() -> list[grpcclient.InferInput]:
    data = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    tensors = []
    for name in ("INPUT0", "INPUT1"):
        tensor = grpcclient.InferInput(name, [1, 16], "BYTES")
        tensor.set_data_from_numpy(data)
        tensors.append(tensor)
    return tensors


def scrape(server: ServerProcess) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def executor_pids(server: ServerProcess) -> list[int]:
    for line in server.log:
        if "executor pids" in line:
            return [int(p) for p in line.rsplit("executor pids", 1)[1].strip(" )").split(",")]
    raise AssertionError("no executor pids in the log")


@pytest.fixture(scope="module")
def two(repository: Path) -> Iterator[ServerProcess]:
    with serve(repository) as server:
        yield server
        assert server.stop() == 0


def test_both_executors_serve_and_the_counts_add_up(two: ServerProcess) -> None:
    assert len(executor_pids(two)) == 2
    with httpclient.InferenceServerClient(two.url, concurrency=8) as client:
        pending = [client.async_infer("simple", simple_inputs(i)) for i in range(40)]
        for i, handle in enumerate(pending):
            result = handle.get_result().as_numpy("OUTPUT0")
            np.testing.assert_array_equal(result, np.full((1, 16), 2 * i, dtype=np.int32))
        stats = client.get_inference_statistics("simple")["model_stats"]
        index = client.get_model_repository_index()
    with grpcclient.InferenceServerClient(two.grpc_url) as client:
        for _ in range(3):
            out = client.infer("simple_string", string_inputs()).as_numpy("OUTPUT0")
            assert out[0, 3] == b"6"
        with pytest.raises(InferenceServerException, match="unknown model"):
            client.infer("nope", string_inputs())
    (simple,) = stats
    assert simple["inference_count"] == 40
    assert simple["inference_stats"]["success"]["count"] == 40
    assert [(e["name"], e["state"]) for e in index] == [
        ("simple", "READY"),
        ("simple_string", "READY"),
    ]
    samples = scrape(two)
    success = {k[1]: v for k, v in samples.items() if k[0] == "nv_inference_request_success_total"}
    assert success[(("model", "simple"), ("version", "1"))] == 40
    assert success[(("model", "simple_string"), ("version", "1"))] == 3
    busy = {
        dict(k[1])["instance"] for k in samples if k[0] == "infermux_instance_busy_seconds_total"
    }
    assert {"simple_0_cpu_0", "simple_0_cpu_1"} <= busy  # one instance on each executor
    # Both executors ran requests: each instance has busy time.
    for instance in ("simple_0_cpu_0", "simple_0_cpu_1"):
        key = ("infermux_instance_busy_seconds_total",
               (("instance", instance), ("model", "simple"), ("version", "1")))  # fmt: skip
        assert samples[key] > 0, instance


def test_a_dead_executor_costs_only_what_it_alone_hosts(repository: Path) -> None:
    with serve(repository, frontends=1) as server:
        zero, one = executor_pids(server)
        os.kill(zero, signal.SIGKILL)  # the one that alone hosts simple_string
        wait_for(lambda: any("executor-0 exited" in line for line in server.log))
        with httpclient.InferenceServerClient(server.url) as client:
            # simple has a copy on executor 1: every request is answered.
            for i in range(10):
                out = client.infer("simple", simple_inputs(i)).as_numpy("OUTPUT1")
                np.testing.assert_array_equal(out, np.zeros((1, 16), dtype=np.int32))
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            statuses = failures_until_answered(
                lambda: client.infer("simple_string", string_inputs()), "executor-0"
            )
            assert client.is_server_ready()
        assert statuses <= {"StatusCode.UNAVAILABLE"}, statuses
        assert one in server.children()  # the other executor was never touched
        assert any("executor-0 ready again" in line for line in server.log)
        assert server.stop() == 0
