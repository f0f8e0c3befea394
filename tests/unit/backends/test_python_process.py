"""Process-isolated Python models: the worker's results, errors, crashes and restarts."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.python import PythonBackend
from infermux.backends.python_process import ProcessInstance
from infermux.errors import ErrorCode, InfermuxError, ModelLoadError, UnavailableError
from infermux.repository import load_model_config
from tests.support import write_model

pytestmark = pytest.mark.skipif(os.name != "posix", reason="POSIX signals")

MODEL = """
import os
from typing import Any

import numpy as np

from infermux.errors import InvalidArgumentError


class Model:
    def initialize(self, context: Any) -> None:
        if os.path.exists(os.path.join(str(context.version_path), "refuse")):
            raise RuntimeError("refused to start")

    def execute(self, requests: list[Any]) -> list[Any]:
        results: list[Any] = []
        for request in requests:
            value = float(request.inputs["INPUT0"].reshape(-1)[0])
            if value == 1:
                os._exit(9)
            if value == 2:
                raise KeyError("whole batch")
            if value == 3:
                results.append(InvalidArgumentError("three is invalid"))
            elif value == 4:
                results.append(ZeroDivisionError("four"))
            else:
                results.append({"OUTPUT0": np.full((1, 1), os.getpid(), np.float32)})
        return results

    def finalize(self) -> None:
        open(os.path.join(os.environ["FINALIZED_DIR"], str(os.getpid())), "w").close()
"""


@pytest.fixture
def model_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("FINALIZED_DIR", str(tmp_path))
    extra = 'parameters { key: "isolation" value: { string_value: "process" } }'
    return write_model(tmp_path / "repo", "iso", source=MODEL, extra=extra)


def context_for(model_dir: Path) -> ModelContext:
    return ModelContext(load_model_config(model_dir), 1, model_dir, model_dir / "1", "iso_0")


def request(value: float) -> ModelRequest:
    return ModelRequest({"INPUT0": np.full((1, 1), value, np.float32)}, ("OUTPUT0",))


def pid_of(instance: ProcessInstance, value: float = 0) -> int:
    (result,) = instance.execute([request(value)])
    assert isinstance(result, dict)
    return int(result["OUTPUT0"][0, 0])


def wait_for_restart(instance: ProcessInstance, old: int) -> None:
    deadline = time.monotonic() + 30
    while instance.pid == old and time.monotonic() < deadline:
        time.sleep(0.02)
    assert instance.pid != old


def test_the_model_runs_in_a_worker_and_its_errors_come_back_as_raised(
    model_dir: Path, tmp_path: Path
) -> None:
    instance = PythonBackend().load(context_for(model_dir))
    assert isinstance(instance, ProcessInstance)
    pid = pid_of(instance)
    assert pid == instance.pid != os.getpid()
    invalid, division, fine = instance.execute([request(3), request(4), request(0)])
    assert isinstance(invalid, InfermuxError)
    assert invalid.code is ErrorCode.INVALID_ARG
    assert str(invalid) == "three is invalid"
    assert type(division).__name__ == "ZeroDivisionError"  # as the in-process backend shows it
    assert str(division) == "four"
    assert isinstance(fine, dict)
    with pytest.raises(Exception, match="whole batch") as raised:
        instance.execute([request(2)])
    assert type(raised.value).__name__ == "KeyError"
    instance.close()
    assert (tmp_path / str(pid)).exists()  # finalize() ran in the worker
    assert instance.crashes == 0


def test_a_crash_fails_its_batch_with_unavailable_and_the_worker_restarts(
    model_dir: Path,
) -> None:
    instance = ProcessInstance(context_for(model_dir))
    first = instance.pid
    with pytest.raises(UnavailableError, match="exited with code 9 while running"):
        instance.execute([request(1)])
    second = pid_of(instance)
    assert second != first
    assert instance.crashes == 1
    # Killed while idle: the watcher restarts it before any request asks.
    os.kill(second, signal.SIGKILL)
    wait_for_restart(instance, second)
    assert pid_of(instance) == instance.pid
    assert instance.crashes == 2
    instance.close()


def test_abort_kills_a_stuck_worker_without_counting_a_crash(model_dir: Path) -> None:
    instance = ProcessInstance(context_for(model_dir))
    first = instance.pid
    instance.abort()
    wait_for_restart(instance, first)
    assert pid_of(instance) != first
    assert instance.crashes == 0
    instance.close()


def test_a_model_that_cannot_start_fails_the_load_with_its_own_message(
    model_dir: Path,
) -> None:
    (model_dir / "1" / "refuse").touch()
    with pytest.raises(ModelLoadError, match="initialize failed: RuntimeError: refused to start"):
        ProcessInstance(context_for(model_dir))


def test_an_unknown_isolation_mode_is_refused(tmp_path: Path) -> None:
    extra = 'parameters { key: "isolation" value: { string_value: "container" } }'
    model_dir = write_model(tmp_path, "m", extra=extra)
    with pytest.raises(ModelLoadError, match=r"parameters.isolation must be one of thread, proc"):
        PythonBackend().load(context_for(model_dir))


def test_a_worker_that_dies_while_starting_is_started_once_more(tmp_path: Path) -> None:
    # The first import of model.py kills its worker (leaving a marker); the second loads.
    marker = tmp_path / "died-once"
    source = f"""
import os
import pathlib

marker = pathlib.Path({str(marker)!r})
if not marker.exists():
    marker.touch()
    os._exit(5)

from typing import Any


class Model:
    def execute(self, requests: list[Any]) -> list[Any]:
        return [{{"OUTPUT0": r.inputs["INPUT0"]}} for r in requests]
"""
    extra = 'parameters { key: "isolation" value: { string_value: "process" } }'
    model_dir = write_model(tmp_path / "repo", "iso", source=source, extra=extra)
    instance = ProcessInstance(context_for(model_dir))
    assert marker.exists()
    (result,) = instance.execute([request(7)])
    assert isinstance(result, dict)
    instance.close()


def test_a_worker_that_dies_while_starting_twice_fails_the_load(tmp_path: Path) -> None:
    extra = 'parameters { key: "isolation" value: { string_value: "process" } }'
    model_dir = write_model(
        tmp_path / "repo", "iso", source="import os\nos._exit(5)\n", extra=extra
    )
    with pytest.raises(ModelLoadError, match="exited with code 5 while loading"):
        ProcessInstance(context_for(model_dir))


# A Triton model in a worker: its pid as OUTPUT0, an error response for 3, a BLS call for 5.
TRITON_MODEL = """
import os

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def execute(self, requests):
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0").as_numpy()
            if x[0, 0] == 3:
                error = pb_utils.TritonError("three", pb_utils.TritonError.UNSUPPORTED)
                responses.append(pb_utils.InferenceResponse([], error))
                continue
            if x[0, 0] == 5:
                pb_utils.InferenceRequest(model_name="other", inputs=[]).exec()
            out = pb_utils.Tensor("OUTPUT0", np.full((1, 1), os.getpid(), np.float32))
            responses.append(pb_utils.InferenceResponse([out]))
        return responses
"""


def test_a_triton_model_runs_in_a_worker_without_bls(tmp_path: Path) -> None:
    extra = 'parameters { key: "isolation" value: { string_value: "process" } }'
    model_dir = write_model(tmp_path, "iso", source=TRITON_MODEL, extra=extra)
    instance = PythonBackend().load(context_for(model_dir))
    assert isinstance(instance, ProcessInstance)
    assert pid_of(instance) == instance.pid != os.getpid()
    (failed,) = instance.execute([request(3)])
    assert isinstance(failed, InfermuxError)
    assert failed.code is ErrorCode.UNSUPPORTED
    assert failed.message == "three"
    with pytest.raises(Exception, match="not isolation: process"):
        instance.execute([request(5)])
    instance.close()
