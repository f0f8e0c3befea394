"""``infermux serve --frontends N``: several front-end processes over one executor.

Black-box: the real server, driven by tritonclient. The same requests get the same answers with
one process and with several; a front end that dies is replaced and costs only its own requests;
an executor that dies makes the front ends answer 503 until its replacement is ready.
"""

from __future__ import annotations

import gc
import os
import signal
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from infermux.settings import builtin_repository
from tests.support import (
    SLOW_MODEL,
    ServerProcess,
    failures_until_answered,
    start_server,
    wait_for,
    write_model,
)

pytestmark = pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="needs Linux /proc")

# Small transfer arenas, so that a /dev/shm as small as Docker's default (64 MiB) holds three
# front ends' channels (the server refuses to start when it cannot).
SMALL_ARENAS = ("--ipc-arena-mb", "4")


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("frontends")
    write_model(repo, "slow", datatype="FP32", source=SLOW_MODEL, max_batch_size=0)
    return repo


def serve(repository: Path, frontends: int) -> ServerProcess:
    return start_server(
        "--model-repository",
        str(builtin_repository()),
        "--model-repository",
        str(repository),
        "--frontends",
        str(frontends),
        "--allow-client-shm",
        *SMALL_ARENAS,
    )


@pytest.fixture(scope="module")
def single(repository: Path) -> Iterator[ServerProcess]:
    with serve(repository, 1) as server:
        yield server
        assert server.stop() == 0


@pytest.fixture(scope="module")
def multi(repository: Path) -> Iterator[ServerProcess]:
    with serve(repository, 2) as server:
        yield server
        assert server.stop() == 0


def http_inputs(
    model: str, binary: bool
) -> tuple[list[httpclient.InferInput], list[httpclient.InferRequestedOutput]]:
    rng = np.random.default_rng(7)
    a: np.ndarray[Any, Any]
    if model == "simple_string":
        a = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
        arrays = {"INPUT0": ("BYTES", a), "INPUT1": ("BYTES", a)}
        outputs = ["OUTPUT0", "OUTPUT1"]
    elif model == "identity_fp32":
        arrays = {"INPUT0": ("FP32", rng.standard_normal((3, 5)).astype(np.float32))}
        outputs = ["OUTPUT0"]
    else:
        a = rng.integers(-100, 100, (1, 16), dtype=np.int32)
        arrays = {"INPUT0": ("INT32", a), "INPUT1": ("INT32", a[:, ::-1].copy())}
        outputs = ["OUTPUT0", "OUTPUT1"]
    inputs = []
    for name, (datatype, array) in arrays.items():
        tensor = httpclient.InferInput(name, list(array.shape), datatype)
        tensor.set_data_from_numpy(array, binary_data=binary)
        inputs.append(tensor)
    return inputs, [httpclient.InferRequestedOutput(o, binary_data=binary) for o in outputs]


MODELS = ("simple", "simple_string", "identity_fp32")


@pytest.mark.parametrize("binary", [False, True], ids=["json", "binary"])
@pytest.mark.parametrize("model", MODELS)
def test_http_answers_are_identical_with_one_and_two_frontends(
    single: ServerProcess, multi: ServerProcess, model: str, binary: bool
) -> None:
    answers = []
    for server in (single, multi):
        with httpclient.InferenceServerClient(server.url) as client:
            inputs, outputs = http_inputs(model, binary)
            result = client.infer(model, inputs, outputs=outputs, request_id="same")
            answers.append(result.get_response())
            arrays = {o["name"]: result.as_numpy(o["name"]) for o in answers[-1]["outputs"]}
            answers[-1]["arrays"] = arrays
    one, two = answers
    assert [o["name"] for o in one["outputs"]] == [o["name"] for o in two["outputs"]]
    assert (one["model_name"], one["model_version"], one["id"]) == (
        two["model_name"],
        two["model_version"],
        two["id"],
    )
    for name, array in one["arrays"].items():
        np.testing.assert_array_equal(array, two["arrays"][name])


def test_grpc_answers_statistics_and_metadata_match(
    single: ServerProcess, multi: ServerProcess
) -> None:
    seen = []
    for server in (single, multi):
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            result = client.infer("simple", inputs)
            meta = client.get_model_metadata("simple", as_json=True)
            config = client.get_model_config("simple", as_json=True)
            seen.append((result.as_numpy("OUTPUT0"), result.as_numpy("OUTPUT1"), meta, config))
            assert client.is_server_ready()
    (a0, a1, meta1, config1), (b0, b1, meta2, config2) = seen
    np.testing.assert_array_equal(a0, b0)
    np.testing.assert_array_equal(a1, b1)
    assert meta1 == meta2
    assert config1 == config2


def test_statistics_count_requests_from_every_frontend(multi: ServerProcess) -> None:
    def count() -> int:
        with httpclient.InferenceServerClient(multi.url) as client:
            stats = client.get_inference_statistics("identity_fp32")
        return int(stats["model_stats"][0]["inference_stats"]["success"]["count"])

    before = count()
    # Fresh connections each time, so that both front ends take some.
    for _ in range(20):
        with httpclient.InferenceServerClient(multi.url) as client:
            inputs, outputs = http_inputs("identity_fp32", True)
            client.infer("identity_fp32", inputs, outputs=outputs)
    with grpcclient.InferenceServerClient(multi.grpc_url) as client:
        tensor = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
        tensor.set_data_from_numpy(np.ones((1, 2), np.float32))
        for _ in range(10):
            client.infer("identity_fp32", [tensor])
    assert count() - before == 30


def test_system_shared_memory_goes_through_the_executor(multi: ServerProcess) -> None:
    import tritonclient.utils.shared_memory as shm

    handle = shm.create_shared_memory_region("fe_in", "/infermux_fe_test", 128)
    try:
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        shm.set_shared_memory_region(handle, [a])
        with httpclient.InferenceServerClient(multi.url) as client:
            client.register_system_shared_memory("fe_in", "/infermux_fe_test", 128)
            inputs = [httpclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_shared_memory("fe_in", 64)
            output = httpclient.InferRequestedOutput("OUTPUT0", binary_data=True)
            output.set_shared_memory("fe_in", 64, offset=64)
            client.infer("simple", inputs, outputs=[output])
            # Another connection (maybe another front end) sees the same registration.
        with grpcclient.InferenceServerClient(multi.grpc_url) as client:
            status = client.get_system_shared_memory_status(as_json=True)
            assert [r["name"] for r in status["regions"].values()] == ["fe_in"]
            client.unregister_system_shared_memory("fe_in")
        result = shm.get_contents_as_numpy(handle, np.int32, [1, 32])
        np.testing.assert_array_equal(result[0, 16:], 2 * a[0])
    finally:
        shm.destroy_shared_memory_region(handle)


# -- faults -------------------------------------------------------------------------------------


def executor_pid(server: ServerProcess) -> int:
    for line in server.log:
        if "executor pid" in line:
            return int(line.rsplit("executor pid", 1)[1].strip(" )"))
    raise AssertionError("no executor pid in the log")


def infer_slow(url: str, seconds: float) -> Any:
    with httpclient.InferenceServerClient(url, network_timeout=60) as client:
        tensor = httpclient.InferInput("INPUT0", [1], "FP32")
        tensor.set_data_from_numpy(np.array([seconds], np.float32))
        return client.infer("slow", [tensor]).as_numpy("OUTPUT0")


def test_a_dead_frontend_is_replaced_and_costs_only_its_own_requests(
    repository: Path,
) -> None:
    with serve(repository, 2) as server:
        executor = executor_pid(server)
        (victim,) = [p for p in server.children() if p != executor][:1]
        outcomes: list[str] = []

        def one() -> None:
            try:
                infer_slow(server.url, 1.0)
                outcomes.append("ok")
            except InferenceServerException as exc:
                outcomes.append(f"status {exc.status()}")
            except Exception:  # the connection went down with its front end
                outcomes.append("dropped")

        threads = [threading.Thread(target=one) for _ in range(8)]
        for thread in threads:
            thread.start()
        time.sleep(0.5)  # all eight are in the slow model now
        os.kill(victim, signal.SIGKILL)
        for thread in threads:
            thread.join(30)
        # geventhttpclient drops, unclosed, the sockets whose front end was killed under them:
        # collect them here, where that is expected, not in whichever test runs next.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        # No request failed with an error status: those of the other front end were answered,
        # those of the dead one lost their connection.
        assert all(o in ("ok", "dropped") for o in outcomes), outcomes
        assert len(outcomes) == 8
        wait_for(lambda: any("frontend-" in line and "exited" in line for line in server.log))
        wait_for(lambda: len(server.children()) == 3 and victim not in server.children())
        # The replacement serves (try enough fresh connections to reach both front ends).
        wait_for(lambda: all(infer_slow(server.url, 0.0) is not None for _ in range(10)))
        assert executor in server.children()  # the executor was never touched
        assert server.stop() == 0


def test_a_dead_executor_means_503_until_its_replacement_is_ready(repository: Path) -> None:
    with serve(repository, 2) as server:
        os.kill(executor_pid(server), signal.SIGKILL)
        wait_for(lambda: any("executor exited" in line for line in server.log))
        statuses = failures_until_answered(lambda: infer_slow(server.url, 0.0), "the executor")
        assert statuses <= {"503"}, statuses
        with grpcclient.InferenceServerClient(server.grpc_url) as client:
            assert client.is_server_ready()
        assert any("executor ready again" in line for line in server.log)
        assert server.stop() == 0


def test_sigterm_stops_every_process(repository: Path) -> None:
    with serve(repository, 3) as server:
        children = server.children()
        assert len(children) == 4
        assert server.stop() == 0
        wait_for(lambda: not any(Path(f"/proc/{pid}").exists() for pid in children), 10)


def test_bad_frontends_value_is_refused() -> None:
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "infermux", "serve", "--frontends", "0"],
        check=False,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "--frontends" in done.stderr


def test_start_up_errors_stop_the_server_with_the_reason(tmp_path: Path) -> None:
    import shutil
    import subprocess
    import sys

    shutil.copytree(builtin_repository() / "simple", tmp_path / "simple")
    command = [sys.executable, "-m", "infermux", "serve", "--frontends", "2", *SMALL_ARENAS]
    command += ["--http-port", "0", "--grpc-port", "0"]
    command += ["--model-repository", str(builtin_repository())]
    command += ["--model-repository", str(tmp_path)]
    done = subprocess.run(
        command,
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1
    assert "model 'simple' also exists" in done.stderr


def test_explicit_model_control_and_grpc_on_a_unix_socket(tmp_path: Path) -> None:
    socket_path = tmp_path / "grpc.sock"
    with start_server(
        "--frontends",
        "2",
        "--model-control-mode",
        "explicit",
        "--grpc-uds",
        str(socket_path),
        *SMALL_ARENAS,
    ) as server:
        with httpclient.InferenceServerClient(server.url) as client:
            assert not client.is_model_ready("simple")
            client.load_model("simple")
            assert client.is_model_ready("simple")
        # gRPC on the unix socket (served by front end 0) sees the same executor.
        with grpcclient.InferenceServerClient(f"unix://{socket_path}") as client:
            a = np.arange(16, dtype=np.int32).reshape(1, 16)
            inputs = [grpcclient.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]
            for tensor in inputs:
                tensor.set_data_from_numpy(a)
            np.testing.assert_array_equal(client.infer("simple", inputs).as_numpy("OUTPUT0"), 2 * a)
            client.unload_model("simple")
            wait_for(lambda: not client.is_model_ready("simple"), 30)
        assert oct(socket_path.stat().st_mode & 0o777) == "0o660"
        assert server.stop() == 0
    assert not socket_path.exists()
