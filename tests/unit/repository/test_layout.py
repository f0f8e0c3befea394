"""Triton's repository layout on disk (``infermux.repository.layout``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from infermux.errors import ConfigError
from infermux.repository.layout import ModelSource, discover_models, fingerprint, list_versions


def make_model(repo: Path, name: str, versions: tuple[str, ...] = ("1",)) -> Path:
    path = repo / name
    path.mkdir(parents=True)
    (path / "config.pbtxt").write_text(f'name: "{name}"\n', encoding="utf-8")
    for version in versions:
        (path / version).mkdir()
        (path / version / "model.py").write_text("# model\n", encoding="utf-8")
    return path


# -- discover_models -------------------------------------------------------------------------------


def test_discover_models_finds_every_model_directory(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    a = make_model(repo, "a")
    b = make_model(repo, "b")
    (repo / "README.md").write_text("not a model", encoding="utf-8")
    (repo / ".hidden").mkdir()
    found = discover_models([repo])
    assert found == {
        "a": ModelSource("a", a, repo),
        "b": ModelSource("b", b, repo),
    }
    assert list(found) == ["a", "b"]


def test_discover_models_over_several_repositories(tmp_path: Path) -> None:
    first, second = tmp_path / "r1", tmp_path / "r2"
    make_model(first, "a")
    make_model(second, "b")
    found = discover_models([first, second])
    assert {name: source.repository for name, source in found.items()} == {
        "a": first,
        "b": second,
    }
    assert found["b"].path == second / "b"


def test_empty_repository_has_no_models(tmp_path: Path) -> None:
    assert discover_models([tmp_path]) == {}
    assert discover_models([]) == {}


def test_same_model_in_two_repositories_is_an_error(tmp_path: Path) -> None:
    first, second = tmp_path / "r1", tmp_path / "r2"
    make_model(first, "dup")
    make_model(first, "only_first")
    make_model(second, "dup")
    with pytest.raises(ConfigError, match="'dup'") as info:
        discover_models([first, second])
    error = info.value
    assert error.field == "--model-repository"
    assert error.source == str(second / "dup")
    assert str(first) in error.message  # names where the first one lives


@pytest.mark.parametrize("kind", ["missing", "file"])
def test_repository_must_be_a_directory(tmp_path: Path, kind: str) -> None:
    repo = tmp_path / "repo"
    if kind == "file":
        repo.write_text("", encoding="utf-8")
    with pytest.raises(ConfigError, match="not a directory") as info:
        discover_models([repo])
    assert info.value.source == str(repo)
    assert info.value.field == "--model-repository"


# -- list_versions ---------------------------------------------------------------------------------


def test_list_versions_ascending_numeric(tmp_path: Path) -> None:
    path = make_model(tmp_path, "m", ("10", "2", "1", "300"))
    assert list_versions(path) == [1, 2, 10, 300]


def test_list_versions_ignores_non_version_entries(tmp_path: Path) -> None:
    path = make_model(
        tmp_path,
        "m",
        (
            "3",
            "0",
            "01",
            "007",
            "-1",
            "+2",
            "1a",
            "v1",
            "1.0",
            " 4",
            "latest",
            ".5",
            "\u00b2",
            "\u0661",
        ),  # superscript two, Arabic-Indic one
    )
    (path / "7").write_text("a file, not a directory", encoding="utf-8")
    assert list_versions(path) == [3]


def test_list_versions_of_a_model_without_versions(tmp_path: Path) -> None:
    assert list_versions(make_model(tmp_path, "m", ())) == []


# -- fingerprint -----------------------------------------------------------------------------------


def test_fingerprint_lists_files_with_size_and_mtime(tmp_path: Path) -> None:
    path = make_model(tmp_path, "m", ("1",))
    (path / "1" / "__pycache__").mkdir()
    (path / "1" / "__pycache__" / "model.cpython.pyc").write_bytes(b"\0" * 10)
    os.utime(path / "config.pbtxt", ns=(1_000_000_000, 2_000_000_000))
    rows = fingerprint(path)
    assert [row[0] for row in rows] == [os.path.join("1", "model.py"), "config.pbtxt"]
    assert rows[1] == ("config.pbtxt", len('name: "m"\n'), 2_000_000_000)


def test_fingerprint_is_stable_without_changes(tmp_path: Path) -> None:
    path = make_model(tmp_path, "m")
    assert fingerprint(path) == fingerprint(path)


def test_fingerprint_changes_when_a_file_changes(tmp_path: Path) -> None:
    path = make_model(tmp_path, "m")
    model = path / "1" / "model.py"
    before = fingerprint(path)

    # Same size, new modification time.
    model.write_text("# MODEL\n", encoding="utf-8")
    stat = model.stat()
    os.utime(model, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    after_touch = fingerprint(path)
    assert after_touch != before

    # New size, same modification time.
    mtime = model.stat().st_mtime_ns
    model.write_text("# a longer model\n", encoding="utf-8")
    os.utime(model, ns=(mtime, mtime))
    after_resize = fingerprint(path)
    assert after_resize != after_touch


def test_fingerprint_changes_when_files_come_and_go(tmp_path: Path) -> None:
    path = make_model(tmp_path, "m")
    before = fingerprint(path)
    (path / "2").mkdir()
    assert fingerprint(path) == before  # an empty directory holds no files
    (path / "2" / "model.py").write_text("# v2\n", encoding="utf-8")
    added = fingerprint(path)
    assert added != before
    (path / "1" / "model.py").unlink()
    assert fingerprint(path) not in (before, added)


def test_fingerprint_ignores_pycache(tmp_path: Path) -> None:
    path = make_model(tmp_path, "m")
    before = fingerprint(path)
    cache = path / "1" / "__pycache__"
    cache.mkdir()
    (cache / "model.cpython-311.pyc").write_bytes(b"compiled")
    assert fingerprint(path) == before
