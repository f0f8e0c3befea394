"""Giving up across processes, black-box: with ``--frontends 2`` the clients that cancel, time out
or hang up must not leave their requests to run in the executor for nobody.

``slow`` sleeps as long as its input says and runs one request per instance at a time. Many
clients give up on a 1 s request each; a fresh request must then be answered about as soon as the
batch running when they gave up ends, not after every abandoned request ran one by one, and the
model's execution count shows the queued ones never ran. While the executor is stopped
(SIGSTOP), readiness must answer not ready within its bound, and be ready again after SIGCONT.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import SLOW_MODEL, ServerProcess, start_server, wait_for, write_model

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")

ABANDONED = 12
"""Requests given up per instance: run one by one they would keep a fresh request waiting
about 10 s; the bound below is a few times what it waits when they leave the queue."""
FRESH_BOUND_S = 6.0


def serve(root: Path, executors: int) -> ServerProcess:
    # One instance per executor (every N-th CPU instance goes to executor N).
    group = f"instance_group [ {{ count: {executors}, kind: KIND_CPU }} ]"
    write_model(root, "slow", source=SLOW_MODEL, max_batch_size=0, extra=group)
    return start_server(
        "--model-repository", str(root), "--frontends", "2", "--executors", str(executors),
        "--ipc-arena-mb", "4",
    )  # fmt: skip


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serve(tmp_path_factory.mktemp("cancel1"), executors=1) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture(scope="module")
def two(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with serve(tmp_path_factory.mktemp("cancel2"), executors=2) as server:
        yield server
        assert server.stop() == 0


def executions(server: ServerProcess) -> int:
    with httpclient.InferenceServerClient(server.url, network_timeout=60) as client:
        (stats,) = client.get_inference_statistics("slow")["model_stats"]
    return int(stats["execution_count"])


def sleep_for(seconds: float) -> list[grpcclient.InferInput]:
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.full((1,), seconds, dtype=np.float32))
    return [tensor]


def fresh_wait(server: ServerProcess) -> float:
    """Seconds a new request waits for an answer."""
    started = time.monotonic()
    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        out = client.infer("slow", sleep_for(0), client_timeout=120).as_numpy("OUTPUT0")
    assert out is not None
    assert out.tolist() == [0]
    return time.monotonic() - started


def assert_abandoned_never_ran(server: ServerProcess, before: int, instances: int) -> None:
    waited = fresh_wait(server)
    assert waited < FRESH_BOUND_S, f"a fresh request waited {waited:.1f} s"
    time.sleep(1.5)  # long enough for one more abandoned request to run, were any left
    # Per instance at most the request it was running and the one it took up just before the
    # clients gave up; then the fresh one.
    ran = executions(server) - before
    assert ran <= 2 * instances + 1, f"{ran} executions for {ABANDONED * instances} abandoned"


def give_up_over_grpc(server: ServerProcess, count: int, how: str) -> None:
    """``count`` 1 s requests, each given up after 1.5 s (a deadline, or a cancel)."""
    done = threading.Semaphore(0)
    errors: list[str] = []

    def finished(result: object, error: InferenceServerException | None) -> None:
        errors.append("" if error is None else str(error.status()))
        done.release()

    with grpcclient.InferenceServerClient(server.grpc_url) as client:
        timeout = 1.5 if how == "deadline" else None
        calls = [
            client.async_infer("slow", sleep_for(1), finished, client_timeout=timeout)
            for _ in range(count)
        ]
        if how == "cancel":
            time.sleep(1.5)
            for call in calls:
                call.cancel()
        for _ in range(count):
            assert done.acquire(timeout=60)
    gave_up = [e for e in errors if e]
    assert len(gave_up) >= count - 2, errors  # a running one may have made it


@pytest.mark.parametrize("how", ["deadline", "cancel"])
def test_grpc_calls_given_up_leave_the_executors_queue(one: ServerProcess, how: str) -> None:
    before = executions(one)
    give_up_over_grpc(one, ABANDONED, how)
    assert_abandoned_never_ran(one, before, instances=1)


def test_grpc_deadlines_reach_every_executor(two: ServerProcess) -> None:
    before = executions(two)
    give_up_over_grpc(two, 2 * ABANDONED, "deadline")
    assert_abandoned_never_ran(two, before, instances=2)


def test_http_clients_that_hang_up_leave_the_executors_queue(one: ServerProcess) -> None:
    body = json.dumps(
        {"inputs": [{"name": "INPUT0", "shape": [1], "datatype": "FP32", "data": [1.0]}]}
    ).encode()
    head = (
        f"POST /v2/models/slow/infer HTTP/1.1\r\nHost: {one.host}\r\n"
        f"Content-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    ).encode()
    before = executions(one)
    clients = [socket.create_connection((one.host, one.http_port)) for _ in range(ABANDONED)]
    for sock in clients:
        sock.sendall(head + body)
    time.sleep(0.3)  # curl --max-time 0.3
    for sock in clients:
        sock.close()
    time.sleep(0.3)  # the front ends see the hang-ups
    assert_abandoned_never_ran(one, before, instances=1)


def ready_status(server: ServerProcess) -> int:
    try:
        with urllib.request.urlopen(f"http://{server.url}/v2/health/ready", timeout=30) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def test_readiness_answers_in_time_while_the_executor_is_stopped(one: ServerProcess) -> None:
    (line,) = [line for line in one.log if "executor pid " in line]
    pid = int(line.rsplit("executor pid ", 1)[1].strip(" )"))
    assert pid in one.children()
    assert ready_status(one) == 200
    os.kill(pid, signal.SIGSTOP)
    try:
        for _ in range(3):  # each probe within its bound (1 s), not the whole stop
            started = time.monotonic()
            assert ready_status(one) == 400  # not ready, as Triton answers it
            assert time.monotonic() - started < 10
    finally:
        os.kill(pid, signal.SIGCONT)
    wait_for(lambda: ready_status(one) == 200, timeout=30)
    assert fresh_wait(one) < FRESH_BOUND_S
