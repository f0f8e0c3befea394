"""``model_path_of``: a file a config names stays inside the model directory, symlinks included."""

from __future__ import annotations

from pathlib import Path

import pytest

from infermux.backends.base import ModelContext, model_file
from infermux.backends.paths import model_path_of
from infermux.errors import ErrorCode, ModelLoadError
from infermux.repository import load_model_config
from tests.support import write_model


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = write_model(tmp_path / "repo", "m")
    (model / "1" / "nested").mkdir()
    (model / "1" / "nested" / "model.py").write_text("")
    (tmp_path / "outside.py").write_text("")
    return model


def test_a_nested_file_inside_is_resolved(model_dir: Path) -> None:
    path = model_path_of(model_dir, model_dir / "1", "nested/model.py", "f", where="model 'm'")
    assert path == (model_dir / "1" / "nested" / "model.py").resolve()
    # `..` that stays inside (the version directory up to the model directory) is fine.
    assert model_path_of(model_dir, model_dir / "1", "../config.pbtxt", "f", where="m").is_file()
    # A file that does not exist yet is the caller's "not found", not a refusal.
    assert not model_path_of(model_dir, model_dir, "missing.npz", "f", where="m").exists()


@pytest.mark.parametrize(
    "value",
    ["/tmp/evil/evil.py", "../../outside.py", "../../../evil/evil.py", "1/../../../outside.py"],
)
def test_absolute_and_dotdot_paths_are_refused_naming_the_field(
    model_dir: Path, value: str
) -> None:
    with pytest.raises(ModelLoadError) as info:
        model_path_of(
            model_dir, model_dir / "1", value, "default_model_filename", where="model 'm'"
        )
    assert str(info.value) == (
        f"model 'm': default_model_filename '{value}' resolves outside the model directory; a "
        "model config may only name files inside it (symlinks included)"
    )
    assert info.value.code is ErrorCode.INVALID_ARG


def test_an_absolute_path_inside_is_accepted(model_dir: Path) -> None:
    inside = str(model_dir / "config.pbtxt")
    assert model_path_of(model_dir, model_dir, inside, "f", where="m") == Path(inside).resolve()


def test_a_symlink_pointing_outside_is_refused(model_dir: Path, tmp_path: Path) -> None:
    (model_dir / "1" / "link.py").symlink_to(tmp_path / "outside.py")
    (model_dir / "escape").symlink_to(tmp_path)
    for base, value in [(model_dir / "1", "link.py"), (model_dir, "escape/outside.py")]:
        with pytest.raises(ModelLoadError, match="resolves outside the model directory"):
            model_path_of(model_dir, base, value, "f", where="m")
    # A symlink whose target is inside is fine.
    (model_dir / "1" / "alias.py").symlink_to(model_dir / "1" / "model.py")
    assert model_path_of(model_dir, model_dir / "1", "alias.py", "f", where="m").is_file()


def test_unresolvable_paths_are_refused(model_dir: Path) -> None:
    with pytest.raises(ModelLoadError, match="f 'a\\\\x00b' cannot be resolved"):
        model_path_of(model_dir, model_dir, "a\x00b", "f", where="m")
    (model_dir / "loop").symlink_to(model_dir / "loop")
    with pytest.raises(ModelLoadError, match="'loop'"):
        model_path_of(model_dir, model_dir, "loop", "f", where="m")


def test_model_file_uses_it(model_dir: Path, tmp_path: Path) -> None:
    config = load_model_config(model_dir)
    context = ModelContext(config, 1, model_dir, model_dir / "1", "m_0")
    assert model_file(context, "model.py") == str((model_dir / "1" / "model.py").resolve())
    (model_dir / "1" / "model.py").unlink()
    (model_dir / "1" / "model.py").symlink_to(tmp_path / "outside.py")
    with pytest.raises(ModelLoadError, match=r"version 1: model file 'model\.py' resolves outside"):
        model_file(context, "model.py")
