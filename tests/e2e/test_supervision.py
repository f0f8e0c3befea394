"""What the supervisor restores and watches (``infermux serve --frontends 2``), black-box.

An executor killed outright comes back with what clients changed (explicit-mode loads and
unloads, shared-memory registrations), and the server is not ready until it has; a front end
that stops answering (SIGSTOP) is killed and replaced, so that ``SO_REUSEPORT`` stops handing
it new gRPC connections.
"""

from __future__ import annotations

import http.client
import os
import shutil
import signal
import threading
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from infermux.settings import builtin_repository
from tests.support import IDENTITY_MODEL, ServerProcess, start_server, wait_for, write_model

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")

SMALL_ARENAS = ("--ipc-arena-mb", "4")
A = np.arange(16, dtype=np.int32).reshape(1, 16)


def executor_pid(server: ServerProcess) -> int:
    for line in server.log:
        if "executor pid" in line:
            return int(line.rsplit("executor pid", 1)[1].strip(" )"))
    raise AssertionError("no executor pid in the log")


def status(url: str) -> int:
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            return int(response.status)
    except urllib.error.HTTPError as exc:
        return exc.code


def shm_status(server: ServerProcess) -> list[dict[str, object]] | None:
    """The system shared-memory regions, or None while the front end asked is not attached."""
    with httpclient.InferenceServerClient(server.url) as client:
        try:
            regions: list[dict[str, object]] = client.get_system_shared_memory_status()
        except InferenceServerException as exc:
            if exc.status() != "503":
                raise
            return None
    return regions


class ReadinessWatch:
    """Polls ``/v2/health/ready`` in a thread, keeping the statuses; each time the server says
    ready, asks whether ``model`` is (it must be: it was loaded before, never unloaded). Both
    questions go over one connection, so to one front end (another may be re-attached a moment
    later, and would answer for itself)."""

    def __init__(self, server: ServerProcess, model: str) -> None:
        self._host, self._port = server.host, server.http_port
        self._model = model
        self._stop = threading.Event()
        self.statuses: set[int] = set()
        self.ready_without_model = 0
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _ask(self, connection: http.client.HTTPConnection, path: str) -> int:
        connection.request("GET", path)
        response = connection.getresponse()
        response.read()
        return response.status

    def _run(self) -> None:
        while not self._stop.is_set():
            connection = http.client.HTTPConnection(self._host, self._port, timeout=10)
            try:
                ready = self._ask(connection, "/v2/health/ready")
                self.statuses.add(ready)
                # Counted once the restart showed (a not-ready answer): a pair of questions
                # straddling the kill itself may see the server ready, then the model gone.
                restarting = bool(self.statuses - {200})
                model = f"/v2/models/{self._model}/ready"
                if ready == 200 and restarting and self._ask(connection, model) != 200:
                    self.ready_without_model += 1
            except (OSError, http.client.HTTPException):  # reset while front ends reconnect
                pass
            finally:
                connection.close()
            time.sleep(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)


@contextmanager
def system_region(size: int) -> Iterator[tuple[str, str, object]]:
    tag = uuid.uuid4().hex[:8]
    name, key = f"kept_{tag}", f"/infermux_kept_{tag}"
    handle = shm.create_shared_memory_region(name, key, size)
    try:
        yield name, key, handle
    finally:
        shm.destroy_shared_memory_region(handle)


def test_a_restarted_executor_gets_back_what_clients_changed() -> None:
    with (
        start_server(
            "--frontends", "2", "--model-control-mode", "explicit",
            "--load-model", "simple", "--load-model", "simple_string",
            "--allow-client-shm", *SMALL_ARENAS,
        ) as server,
        system_region(128) as (region, key, handle),
    ):  # fmt: skip
        with httpclient.InferenceServerClient(server.url) as client:
            client.load_model("identity_fp32")  # not in the startup set
            client.unload_model("simple_string")  # in it
            client.register_system_shared_memory(region, key, 128)
            assert client.is_server_ready()
        watch = ReadinessWatch(server, "identity_fp32")
        try:
            os.kill(executor_pid(server), signal.SIGKILL)
            wait_for(lambda: any("executor ready again" in line for line in server.log), 120)
            wait_for(lambda: status(f"http://{server.url}/v2/health/ready") == 200, 60)
        finally:
            watch.stop()
        # Not ready (400, as Triton answers) while it was restarting, and never ready before
        # the model was back.
        assert watch.statuses - {200}, watch.statuses
        assert watch.ready_without_model == 0
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            index = {m.name: m.state for m in client.get_model_repository_index().models}
            assert index["identity_fp32"] == "READY", index
            assert index["simple"] == "READY", index
            assert index["simple_string"] != "READY", index
            assert not client.is_model_ready("simple_string")
            regions = client.get_system_shared_memory_status(as_json=True)["regions"]
            assert [r["name"] for r in regions.values()] == [region]
            # And the region still works: inputs read from it, outputs written into it.
            shm.set_shared_memory_region(handle, [A])
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_shared_memory(region, 64)
            output = grpcclient.InferRequestedOutput("OUTPUT0")
            output.set_shared_memory(region, 64, offset=64)
            client.infer("simple", inputs, outputs=[output])
        result = shm.get_contents_as_numpy(handle, np.int32, [1, 32])
        np.testing.assert_array_equal(result[0, 16:], 2 * A[0])
        assert server.stop() == 0


def test_a_region_that_cannot_be_restored_is_dropped_with_a_warning() -> None:
    with start_server("--frontends", "2", "--allow-client-shm", *SMALL_ARENAS) as server:
        with (
            system_region(64) as (region, key, _),
            httpclient.InferenceServerClient(server.url) as client,
        ):
            client.register_system_shared_memory(region, key, 64)
        # The object is gone (destroyed by its owner); the executor still maps it, until it dies.
        os.kill(executor_pid(server), signal.SIGKILL)
        wait_for(lambda: any("executor ready again" in line for line in server.log), 120)
        # Ready says one front end is re-attached; the other (the kernel picks which one a new
        # connection reaches) may answer 503 a moment longer, so ask until a front end answers.
        wait_for(lambda: shm_status(server) is not None, 60)
        assert shm_status(server) == []
        warning = [line for line in server.log if f"region '{region}' could not be" in line]
        assert warning, "\n".join(server.log[-20:])
        assert server.stop() == 0


# Loads in a few seconds: the window in which a restarted executor is not attached yet.
SLOW_LOADING_MODEL = "import time\n\ntime.sleep(4)\n\n" + IDENTITY_MODEL


def test_with_two_executors_changes_made_while_one_restarts_reach_it(tmp_path: Path) -> None:
    for name in ("simple", "identity_fp32"):
        shutil.copytree(builtin_repository() / name, tmp_path / name)
    # One instance each: executor 0 alone hosts them (placement: every N-th CPU instance).
    write_model(tmp_path, "slow_loading", source=SLOW_LOADING_MODEL)
    with start_server(
        "--model-repository", str(tmp_path), "--executors", "2", "--frontends", "1",
        "--model-control-mode", "explicit", "--load-model", "simple",
        "--load-model", "slow_loading", *SMALL_ARENAS,
    ) as server:  # fmt: skip
        zero, one = executor_pids(server)
        with httpclient.InferenceServerClient(server.url) as client:
            client.unload_model("simple")
        os.kill(zero, signal.SIGKILL)
        # Its successor is running (and loading slowly): what changes now reaches executor 1 alone.
        wait_for(lambda: len(server.children()) == 3 and zero not in server.children(), 60)
        # ... and the front end has heard that executor 0 is gone (until then a change may still
        # be sent to it, and fail 503 when the front end hears: CI saw that once).
        wait_for(lambda: status(f"http://{server.url}/v2/health/ready") != 200, 60)
        with httpclient.InferenceServerClient(server.url) as client:
            client.load_model("identity_fp32")
        wait_for(lambda: any("executor-0 ready again" in line for line in server.log), 120)
        wait_for(lambda: status(f"http://{server.url}/v2/health/ready") == 200, 60)
        with httpclient.InferenceServerClient(server.url) as client:
            index = {m["name"]: m.get("state", "") for m in client.get_model_repository_index()}
            assert index["identity_fp32"] == "READY", index  # loaded on executor 0 by the restore
            assert index["slow_loading"] == "READY", index
            assert index["simple"] != "READY", index  # unloaded before the restart: not reloaded
            tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
            tensor.set_data_from_numpy(np.ones((1, 3), np.float32))
            assert client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0").shape == (1, 3)
        assert any("executor-0 ready; restoring" in line for line in server.log)
        assert one in server.children()  # the other executor was never touched
        assert server.stop() == 0


def executor_pids(server: ServerProcess) -> list[int]:
    for line in server.log:
        if "executor pids" in line:
            return [int(p) for p in line.rsplit("executor pids", 1)[1].strip(" )").split(",")]
    raise AssertionError("no executor pids in the log")


def fresh_infer(url: str) -> None:
    """One inference over a new channel (a new TCP connection the kernel places)."""
    with grpcclient.InferenceServerClient(url) as client:
        inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
        for tensor in inputs:
            tensor.set_data_from_numpy(A)
        result = client.infer("simple", inputs, client_timeout=15)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), 2 * A)


def test_a_stopped_frontend_is_killed_and_new_connections_all_succeed() -> None:
    timeout = 2.0
    with start_server(
        "--frontends", "2", "--frontend-heartbeat-timeout-secs", str(timeout), *SMALL_ARENAS
    ) as server:  # fmt: skip
        executor = executor_pid(server)
        victim = next(p for p in server.children() if p != executor)
        stopped = time.monotonic()
        os.kill(victim, signal.SIGSTOP)
        try:
            # Heartbeat timeout, then the restart: generous bounds for a slow machine.
            wait_for(lambda: victim not in server.children(), 30 + timeout)
            wait_for(lambda: any("started again" in line for line in server.log), 60)
        finally:
            if victim in server.children():
                os.kill(victim, signal.SIGCONT)
        assert time.monotonic() - stopped < 90
        assert len(server.children()) == 3  # two front ends and the executor
        assert any("has not answered the supervisor" in line for line in server.log)
        for _ in range(20):
            fresh_infer(server.grpc_url)
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.is_server_ready()
        assert executor in server.children()  # the executor was never touched
        assert server.stop() == 0
