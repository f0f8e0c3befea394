"""Loading a model from a load request's files (``infermux.repository.overrides`` and
``ModelRepository.load(files=...)``): Triton's ``file:<version>/<name>`` override."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry, ModelRequest
from infermux.errors import ErrorCode, InfermuxError, InvalidArgumentError, ModelLoadError
from infermux.repository import ControlMode, ModelRepository
from infermux.repository.overrides import discard, materialize
from tests.support import IDENTITY_MODEL, write_model

DOUBLE_MODEL = IDENTITY_MODEL.replace('r.inputs["INPUT0"]}', 'r.inputs["INPUT0"] * 2}')
CONFIG = json.dumps(
    {
        "backend": "python",
        "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
)


def overrides_left() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("infermux-override-*"))


async def run(repository: ModelRepository, name: str, version: str = "") -> float:
    model = repository.get(name, version)
    done = await model.scheduler.submit(
        ModelRequest({"INPUT0": np.array([[1.5]], np.float32)}, ("OUTPUT0",))
    )
    return float(done.outputs[0].data.reshape(-1)[0])


def test_materialize_writes_the_files_below_a_directory_named_after_the_model() -> None:
    model_dir = materialize("m", {"1/model.py": b"a", "2/sub/x.bin": b"\0"})
    try:
        assert model_dir.name == "m"
        assert (model_dir / "1" / "model.py").read_bytes() == b"a"
        assert (model_dir / "2" / "sub" / "x.bin").read_bytes() == b"\0"
    finally:
        discard(model_dir)
    assert not model_dir.parent.exists()


@pytest.mark.parametrize(
    "path",
    [
        "/etc/passwd",
        "../escape.txt",
        "1/../../escape.txt",
        "1/./model.py",
        "1//model.py",
        "",
        "1/" + "x" * 256,
        "x" * 300 + "/model.py",
    ],
)
def test_a_path_leaving_the_directory_or_too_long_is_refused_naming_it(path: str) -> None:
    before = overrides_left()
    with pytest.raises(InvalidArgumentError, match=f"'file:{path[:40]}"):
        materialize("m", {"1/model.py": b"a", path: b"evil"})
    assert overrides_left() == before  # refused before anything was written
    assert not (Path(tempfile.gettempdir()) / "escape.txt").exists()


def test_a_component_of_exactly_name_max_bytes_is_fine() -> None:
    model_dir = materialize("m", {"1/" + "x" * 255: b"a"})
    discard(model_dir)


def test_a_file_where_a_directory_goes_is_refused() -> None:
    before = overrides_left()
    with pytest.raises(InvalidArgumentError, match="'file:1/x/y': cannot write the file"):
        materialize("m", {"1/x": b"a", "1/x/y": b"b"})
    assert overrides_left() == before


@pytest.mark.parametrize("name", ["..", "a/b", "x" * 256])
def test_a_model_name_that_is_no_directory_name_is_refused(name: str) -> None:
    with pytest.raises(InvalidArgumentError, match="override files"):
        materialize(name, {"1/model.py": b"a"})


async def test_a_model_is_loaded_from_its_override_files_and_back_from_the_repository(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "m", versions=(3,))
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["m"]
    )
    await repository.start()
    before = overrides_left()
    assert repository.ready_versions("m") == [3]

    # Files replace the model's directory: only their version serves, with their code.
    await repository.load("m", CONFIG, {"1/model.py": DOUBLE_MODEL.encode()})
    assert repository.ready_versions("m") == [1]
    assert await run(repository, "m") == 3.0
    assert len(overrides_left() - before) == 1

    # A model that is in no repository can be loaded from files alone.
    await repository.load("other", CONFIG, {"1/model.py": IDENTITY_MODEL.encode()})
    assert await run(repository, "other") == 1.5
    assert len(overrides_left() - before) == 2

    # A load without files reads the repository again; the override directory goes.
    await repository.load("m")
    assert repository.ready_versions("m") == [3]
    assert await run(repository, "m") == 1.5
    assert len(overrides_left() - before) == 1

    await repository.unload("other")
    assert overrides_left() == before
    with pytest.raises(InfermuxError, match="failed to load 'other': no such model"):
        await repository.load("other")
    await repository.close()


async def test_override_files_need_a_config_and_a_bad_path_harms_nothing(tmp_path: Path) -> None:
    write_model(tmp_path, "m")
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["m"]
    )
    await repository.start()
    before = overrides_left()
    with pytest.raises(InvalidArgumentError, match="failed to load 'm': override files need"):
        await repository.load("m", None, {"1/model.py": b""})
    with pytest.raises(ModelLoadError, match=r"failed to load 'm': .*'file:\.\./\.\./x'") as caught:
        await repository.load("m", CONFIG, {"1/model.py": b"", "../../x": b"evil"})
    assert caught.value.code is ErrorCode.INVALID_ARG
    # A load that fails after the files were written removes them too.
    with pytest.raises(ModelLoadError, match="failed to load 'm'"):
        await repository.load("m", CONFIG, {"2/model.py": b"raise ImportError('x')\n"})
    # So does one whose only version failed while its old instance keeps serving.
    await repository.load("m", CONFIG, {"1/model.py": b"raise ImportError('x')\n"})
    assert "reload failed" in repository.index()[0].reason
    assert overrides_left() == before
    assert repository.ready_versions("m") == [1]  # the served model never noticed
    assert await run(repository, "m") == 1.5
    await repository.close()
