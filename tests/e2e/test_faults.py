"""Fault isolation, black-box: a model that raises, hangs or crashes fails only its own requests.

``faulty`` runs in a worker process (``isolation: process``); ``stuck`` runs in the server's
process. Both take one INT64 ``INPUT0`` whose value says what to do (0: answer, 1: ``os._exit``,
2: SIGSEGV, 3: hang, 4: fail this request) and answer who answered (the worker's pid, or the
instance object's id), so that a test can see an instance being replaced.
"""

from __future__ import annotations

import functools
import os
import threading
import time
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.support import IDENTITY_MODEL, ServerProcess, parameter, start_server, write_model

pytestmark = pytest.mark.skipif(os.name != "posix", reason="signals and fork-free spawn: POSIX")

FAULTY_MODEL = """
import os
import signal
import time
from typing import Any

import numpy as np


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        results: list[Any] = []
        for request in requests:
            mode = int(request.inputs["INPUT0"].reshape(-1)[0])
            if mode == 1:
                os._exit(3)
            if mode == 2:
                os.kill(os.getpid(), signal.SIGSEGV)
            if mode == 3:
                time.sleep(3600)
            if mode == 4:
                results.append(ValueError("mode 4 fails this request"))
                continue
            shape = request.inputs["INPUT0"].shape
            results.append({"OUTPUT0": np.full(shape, WHO, dtype=np.int64)})
        return results
"""


def faulty(who: str) -> str:
    """The model answering ``who`` (``os.getpid()`` or ``id(self)``)."""
    return FAULTY_MODEL.replace("WHO", who)


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("faults")
    one = functools.partial(write_model, datatype="INT64", dims="[ 1 ]", max_batch_size=0)
    isolated = parameter("isolation", "process") + parameter("execution_timeout_ms", "1500")
    one(repo, "faulty", source=faulty("os.getpid()"), extra=isolated)
    one(repo, "stuck", source=faulty("id(self)"), extra=parameter("execution_timeout_ms", "500"))
    # Four requests of one batch, one of which fails: the other three must not.
    write_model(repo, "batched", datatype="INT64", dims="[ 1 ]", max_batch_size=4,
                source=faulty("id(self)"),
                extra="dynamic_batching { max_queue_delay_microseconds: 200000 }")  # fmt: skip
    one(repo, "healthy", source=IDENTITY_MODEL)
    return repo


@pytest.fixture(scope="module")
def server(repository: Path) -> Iterator[ServerProcess]:
    with start_server("--model-repository", str(repository)) as server:
        index = client(server).get_model_repository_index()
        unready = {m["name"]: m.get("reason", "") for m in index if m.get("state") != "READY"}
        assert not unready, f"{unready}\n" + "\n".join(server.log[-30:])
        yield server
        assert server.stop() == 0  # an abandoned, still-hanging instance thread must not block exit


def client(server: ServerProcess) -> httpclient.InferenceServerClient:
    return httpclient.InferenceServerClient(server.url, network_timeout=60)


def ask(server: ServerProcess, model: str, mode: int, shape: tuple[int, ...] = (1,)) -> int:
    tensor = httpclient.InferInput("INPUT0", list(shape), "INT64")
    tensor.set_data_from_numpy(np.full(shape, mode, dtype=np.int64))
    result = client(server).infer(model, [tensor])
    return int(result.as_numpy("OUTPUT0").reshape(-1)[0])


def failure(server: ServerProcess, model: str, mode: int) -> InferenceServerException:
    with pytest.raises(InferenceServerException) as caught:
        ask(server, model, mode)
    return caught.value


def restarts(server: ServerProcess, model: str) -> dict[str, float]:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    counts: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "infermux_instance_restarts_total" and (
                sample.labels["model"] == model
            ):
                reason = sample.labels["reason"]
                counts[reason] = counts.get(reason, 0) + sample.value
    return counts


def test_a_request_the_model_fails_fails_alone_in_its_batch(server: ServerProcess) -> None:
    with ThreadPoolExecutor(4) as pool:
        calls = [pool.submit(ask, server, "batched", mode, (1, 1)) for mode in (0, 4, 0, 0)]
        outcomes = []
        for call in calls:
            try:
                outcomes.append(call.result())
            except InferenceServerException as exc:
                outcomes.append(exc)
    failed = [o for o in outcomes if isinstance(o, InferenceServerException)]
    assert len(failed) == 1
    assert failed[0].status() == "500"
    assert "ValueError: mode 4 fails this request" in str(failed[0].message())
    assert ask(server, "batched", 0, (1, 1))  # the instance is fine


def test_a_hanging_in_process_model_is_cut_and_its_instance_replaced(
    server: ServerProcess,
) -> None:
    before = ask(server, "stuck", 0)
    start = time.monotonic()
    error = failure(server, "stuck", 3)
    waited = time.monotonic() - start
    assert error.status() == "503"
    assert "execution timeout (500 ms)" in str(error.message())
    assert "model 'stuck' version 1 instance 'stuck_0_cpu_0'" in str(error.message())
    assert waited < 30  # cut, not left to sleep its hour
    after = ask(server, "stuck", 0)
    assert after != before  # a new instance object answers
    assert restarts(server, "stuck") == {"timeout": 1, "crash": 0}
    assert client(server).is_model_ready("stuck")


@pytest.mark.parametrize(("mode", "how"), [(1, "exited with code 3"), (2, "killed by SIGSEGV")])
def test_a_crashing_isolated_model_restarts_and_fails_only_its_in_flight_request(
    server: ServerProcess, mode: int, how: str
) -> None:
    pid = ask(server, "faulty", 0)
    crashes = restarts(server, "faulty").get("crash", 0)
    stop = threading.Event()
    healthy: list[int] = []

    def other_model() -> None:  # meanwhile, another model keeps answering, every time
        while not stop.is_set():
            healthy.append(ask(server, "healthy", 7))

    hammer = threading.Thread(target=other_model)
    hammer.start()
    try:
        with ThreadPoolExecutor(4) as pool:
            crash = pool.submit(failure, server, "faulty", mode)
            time.sleep(0.05)
            # Queued behind the crash: served by the restarted worker, none lost.
            queued = [pool.submit(ask, server, "faulty", 0) for _ in range(3)]
            error = crash.result()
            answers = [q.result() for q in queued]
    finally:
        stop.set()
        hammer.join()
    assert error.status() == "503"
    assert how in str(error.message())
    assert "restarted" in str(error.message())
    assert len(set(answers)) == 1  # one new worker answered them all
    assert answers[0] != pid
    assert healthy
    assert set(healthy) == {7}
    assert restarts(server, "faulty")["crash"] == crashes + 1
    assert any(f"worker restarted (pid {answers[0]})" in line for line in server.log)


def test_a_hanging_isolated_model_is_killed_and_restarted(server: ServerProcess) -> None:
    pid = ask(server, "faulty", 0)
    timeouts = restarts(server, "faulty").get("timeout", 0)
    error = failure(server, "faulty", 3)
    assert error.status() == "503"
    assert "execution timeout (1500 ms)" in str(error.message())
    assert ask(server, "faulty", 0) != pid
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # the stuck worker is gone, not left behind
    assert restarts(server, "faulty")["timeout"] == timeouts + 1


def test_a_bad_isolation_or_timeout_parameter_fails_the_load_naming_it(tmp_path: Path) -> None:
    write_model(tmp_path, "odd", extra=parameter("isolation", "vm"))
    write_model(tmp_path, "late", extra=parameter("execution_timeout_ms", "soon"))
    write_model(tmp_path, "fine")
    with start_server("--model-repository", str(tmp_path), "--strict-readiness=false") as server:
        index = {m["name"]: m for m in client(server).get_model_repository_index()}
        assert "parameters.isolation must be one of thread, process" in index["odd"]["reason"]
        assert "parameters.execution_timeout_ms must be a whole number" in index["late"]["reason"]
        assert index["fine"]["state"] == "READY"
        assert server.stop() == 0
