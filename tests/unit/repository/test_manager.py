from __future__ import annotations

import gc
import shutil
import weakref
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from infermux.backends import BackendRegistry, ModelRequest
from infermux.backends.base import ExecuteResult, ModelContext
from infermux.errors import (
    ErrorCode,
    ModelLoadError,
    NotFoundError,
    UnavailableError,
    UnsupportedError,
)
from infermux.repository import ControlMode, ModelRepository
from tests.support import IDENTITY_MODEL, write_model

DOUBLE_MODEL = IDENTITY_MODEL.replace('r.inputs["INPUT0"]}', 'r.inputs["INPUT0"] * 2}')


def repo_of(path: Path, mode: ControlMode = ControlMode.NONE, *load: str) -> ModelRepository:
    return ModelRepository([path], BackendRegistry(), control_mode=mode, startup_models=load)


async def run(repository: ModelRepository, name: str, value: float, version: str = "") -> float:
    model = repository.get(name, version)
    done = await model.scheduler.submit(
        ModelRequest({"INPUT0": np.array([[value]], np.float32)}, ("OUTPUT0",))
    )
    return float(done.outputs[0].data.reshape(-1)[0])


async def test_failed_model_does_not_stop_the_others(tmp_path: Path) -> None:
    write_model(tmp_path, "good")
    write_model(tmp_path, "bad", source="raise ImportError('no such thing')\n")
    repository = repo_of(tmp_path)
    await repository.start()
    assert await run(repository, "good", 2.0) == 2.0
    assert not repository.all_ready()
    rows = {(r.name, r.version): r for r in repository.index()}
    assert rows[("bad", "1")].state == "UNAVAILABLE"
    assert "import failed: ImportError: no such thing" in rows[("bad", "1")].reason
    assert [r.name for r in repository.index(ready_only=True)] == ["good"]
    with pytest.raises(UnavailableError, match="bad"):
        repository.get("bad")
    with pytest.raises(NotFoundError, match="unknown model: 'nope'"):
        repository.get("nope")
    await repository.close()


async def test_version_policy_and_default_version(tmp_path: Path) -> None:
    write_model(
        tmp_path,
        "m",
        versions=(1, 2, 3),
        extra="dynamic_batching { }\nversion_policy: { latest: { num_versions: 2 } }",
    )
    repository = repo_of(tmp_path)
    await repository.start()
    assert repository.ready_versions("m") == [2, 3]
    assert repository.get("m").version == 3
    assert repository.get("m", "2").version == 2
    with pytest.raises(NotFoundError, match="version 1 is not found"):
        repository.get("m", "1")
    with pytest.raises(NotFoundError, match="version 'x'"):
        repository.get("m", "x")
    assert repository.all_ready()
    await repository.close()


async def test_reload_swaps_and_a_failed_reload_keeps_serving(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "m")
    repository = repo_of(tmp_path, ControlMode.EXPLICIT, "m")
    await repository.start()
    old = repository.get("m")
    assert await run(repository, "m", 3.0) == 3.0
    (model_dir / "1" / "model.py").write_text(DOUBLE_MODEL)
    await repository.load("m")
    assert repository.get("m") is not old
    assert await run(repository, "m", 3.0) == 6.0
    with pytest.raises(UnavailableError, match="unloading"):  # the old version was retired
        await old.scheduler.submit(ModelRequest({}, ()))
    # A broken config fails the reload but the loaded version keeps serving.
    (model_dir / "config.pbtxt").write_text("name: [")
    with pytest.raises(Exception, match=r"config\.pbtxt"):
        await repository.load("m")
    assert await run(repository, "m", 3.0) == 6.0
    await repository.close()


async def test_version_that_fails_is_reported_next_to_one_that_loads(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "m", versions=(1, 2), extra="version_policy: { all: { } }")
    (model_dir / "2" / "model.py").unlink()
    repository = repo_of(tmp_path)
    await repository.start()
    rows = {r.version: r for r in repository.index() if r.name == "m"}
    assert rows["1"].state == "READY"
    assert rows["2"].state == "UNAVAILABLE"
    assert "model.py not found" in rows["2"].reason
    assert repository.get("m").version == 1
    await repository.close()


async def test_model_without_versions_is_an_error(tmp_path: Path) -> None:
    write_model(tmp_path, "m", versions=())
    repository = repo_of(tmp_path, ControlMode.EXPLICIT)
    await repository.start()
    with pytest.raises(ModelLoadError, match="no version directory"):
        await repository.load("m")
    await repository.close()


async def test_explicit_mode(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    write_model(tmp_path, "b")
    repository = repo_of(tmp_path, ControlMode.EXPLICIT, "a", "ghost")
    await repository.start()
    assert repository.is_ready("a")
    assert not repository.is_ready("b")
    assert not repository.all_ready()  # "ghost" was asked for and does not exist
    rows = {r.name: r for r in repository.index()}
    assert rows["b"].state == ""
    assert rows["ghost"].reason == "not found in any repository"
    repository.check_explicit("load")
    await repository.unload("a")
    assert not repository.is_ready("a")
    with pytest.raises(NotFoundError):
        await repository.unload("zzz")
    with pytest.raises(NotFoundError, match="no such model"):
        await repository.load("zzz")
    await repository.close()


async def test_explicit_mode_star_loads_everything(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    write_model(tmp_path, "b")
    repository = repo_of(tmp_path, ControlMode.EXPLICIT, "*")
    await repository.start()
    assert repository.is_ready("a")
    assert repository.is_ready("b")
    await repository.close()


async def test_control_api_refused_outside_explicit(tmp_path: Path) -> None:
    repository = repo_of(tmp_path)
    with pytest.raises(UnsupportedError, match="model-control-mode=none"):
        repository.check_explicit("unload")


async def test_poll_once_loads_changes_and_drops_removed(tmp_path: Path) -> None:
    write_model(tmp_path, "a")
    repository = repo_of(tmp_path, ControlMode.NONE)
    await repository.start()
    write_model(tmp_path, "b")
    shutil.rmtree(tmp_path / "a")
    await repository.poll_once()
    assert repository.is_ready("b")
    with pytest.raises(NotFoundError):
        repository.get("a")
    await repository.close()


async def test_instance_groups_make_instances(tmp_path: Path) -> None:
    source = """
from typing import Any


class Model:
    def initialize(self, context: Any) -> None:
        with open(context.model_path / "instances.log", "a") as log:
            log.write(f"{context.instance_name}@{context.device}\\n")

    def execute(self, requests: list[Any]) -> list[Any]:
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""
    write_model(
        tmp_path,
        "m",
        source=source,
        extra='instance_group [ { count: 2, kind: KIND_CPU }, { name: "g", kind: KIND_GPU, '
        "gpus: [ 0, 1 ] } ]",
    )
    repository = repo_of(tmp_path)
    await repository.start()
    names = sorted((tmp_path / "m" / "instances.log").read_text().split())
    assert names == ["g_cuda0_0@cuda:0", "g_cuda1_0@cuda:1", "m_0_cpu_0@cpu", "m_0_cpu_1@cpu"]
    await repository.close()


# Writes a marker next to itself when imported: the proof that a refused file never ran.
EVIL_MODEL = """
from pathlib import Path

Path(__file__).with_name("ran").write_text("imported")
"""

_IO = (
    '"input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}], '
    '"output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]XX}]'
)


def override(extra: str = "", output: str = "") -> str:
    return (
        '{"name": "m", "backend": "python", "max_batch_size": 8, '
        + _IO.replace("XX", output)
        + extra
        + "}"
    )


@pytest.mark.parametrize(
    ("extra", "output", "field"),
    [
        (', "default_model_filename": "EVIL"', "", "default_model_filename"),
        (', "default_model_filename": "../../evil/model.py"', "", "default_model_filename"),
        ("", ', "label_filename": "../../evil/labels.txt"', "output 'OUTPUT0' label_filename"),
        (', "parameters": {"calibration_data": {"string_value": "EVIL"}}', "", "calibration_data"),
        (
            ', "model_warmup": [{"name": "w", "batch_size": 1, "inputs": {"INPUT0": {'
            '"data_type": "TYPE_FP32", "dims": [1], "input_data_file": "../../../evil/x"}}}]',
            "",
            "warm-up sample 'w' input 'INPUT0': input_data_file",
        ),
    ],
)
async def test_a_config_naming_a_file_outside_the_model_fails_the_load(
    tmp_path: Path, extra: str, output: str, field: str
) -> None:
    repo, evil = tmp_path / "repo", tmp_path / "evil"
    write_model(repo, "m")
    evil.mkdir()
    (evil / "model.py").write_text(EVIL_MODEL)
    repository = repo_of(repo, ControlMode.EXPLICIT, "m")
    await repository.start()
    text = override(extra.replace("EVIL", str(evil / "model.py")), output)
    with pytest.raises(ModelLoadError) as info:
        await repository.load("m", text)
    message = str(info.value)
    assert message.startswith("failed to load 'm': model 'm'"), message
    assert f"{field} '" in message
    assert "resolves outside the model directory" in message
    assert info.value.code is ErrorCode.INVALID_ARG
    assert not (evil / "ran").exists()
    assert await run(repository, "m", 3.0) == 3.0  # the loaded version keeps serving
    await repository.close()


async def test_a_failed_load_is_invalid_argument_and_says_failed_to_load(tmp_path: Path) -> None:
    write_model(tmp_path, "m", source="raise RuntimeError('boom')\n")
    repository = repo_of(tmp_path, ControlMode.EXPLICIT)
    await repository.start()
    with pytest.raises(ModelLoadError, match=r"^failed to load 'm': .*RuntimeError: boom") as info:
        await repository.load("m")
    assert info.value.code is ErrorCode.INVALID_ARG
    with pytest.raises(ModelLoadError, match=r"^failed to load 'm': m \(config override\)") as bad:
        await repository.load("m", "{not json")
    assert bad.value.code is ErrorCode.INVALID_ARG
    await repository.close()


class _Cyclic:
    """An instance in a reference cycle (as model objects often are): refcounting never frees
    it; only a garbage collection does."""

    alive: ClassVar[list[weakref.ref[_Cyclic]]] = []

    def __init__(self) -> None:
        self.me = self
        _Cyclic.alive.append(weakref.ref(self))

    def execute(self, requests: Sequence[ModelRequest]) -> list[ExecuteResult]:
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]

    def close(self) -> None:
        pass


class _CyclicBackend:
    name = "cyclic"
    stacks_inputs = False

    def load(self, context: ModelContext) -> _Cyclic:
        return _Cyclic()


async def test_an_unloaded_model_is_collected_at_once(tmp_path: Path) -> None:
    model = write_model(tmp_path, "m")
    config = model / "config.pbtxt"
    config.write_text(config.read_text().replace('"python"', '"cyclic"'))
    registry = BackendRegistry({"cyclic": _CyclicBackend})
    repository = ModelRepository(
        [tmp_path], registry, control_mode=ControlMode.EXPLICIT, startup_models=["m"]
    )
    gc.disable()  # only the repository's own collection may free it
    try:
        _Cyclic.alive.clear()
        await repository.start()
        assert await run(repository, "m", 1.0) == 1.0
        await repository.load("m")  # a reload retires the first instance
        assert [ref() is None for ref in _Cyclic.alive] == [True, False]
        await repository.unload("m")
        assert [ref() is None for ref in _Cyclic.alive] == [True, True]
    finally:
        gc.enable()
        await repository.close()


COMPLETING = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [2]})
        config.add_output({"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [2]})
        return config

    def execute(self, requests):
        return []
"""


@pytest.mark.parametrize("auto_complete", [True, False])
async def test_auto_complete_can_be_turned_off(tmp_path: Path, auto_complete: bool) -> None:
    # --disable-auto-complete-config / --strict-model-config=true: the config is taken as it is.
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text('backend: "python"\n')
    (tmp_path / "m" / "1" / "model.py").write_text(COMPLETING)
    repository = ModelRepository([tmp_path], BackendRegistry(), auto_complete=auto_complete)
    await repository.start()
    try:
        inputs = [t.name for t in repository.get("m").config.inputs]
        assert inputs == (["INPUT0"] if auto_complete else [])  # as the file says, when off
    finally:
        await repository.close()
