"""The calibration cache: keys, reuse, corrupt entries, concurrent builders, read-only versions."""

from __future__ import annotations

import json
import logging
import multiprocessing
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from infermux.backends import ModelContext
from infermux.backends.calibration_cache import (
    BUILDS,
    CACHE_DIRNAME,
    CalibrationCache,
    cache_key,
)
from infermux.repository import load_model_config
from infermux.repository.layout import fingerprint


def make_context(tmp_path: Path) -> ModelContext:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(
        'name: "m"\nbackend: "python"\ninput [ { name: "X", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ 1 ] } ]\n'
    )
    (model_dir / "1" / "model.bin").write_bytes(b"weights")
    return context_at(tmp_path)


def context_at(tmp_path: Path) -> ModelContext:
    """The context of the model :func:`make_context` wrote, without writing it again: a process
    that rewrote ``model.bin`` while another hashed it for its key gave that one another key
    (the digest of a truncated file), hence a second entry (a flake of the test, not the cache)."""
    model_dir = tmp_path / "m"
    return ModelContext(load_model_config(model_dir), 1, model_dir, model_dir / "1", "m_0")


def key_of(context: ModelContext, **settings: str) -> str:
    return cache_key("test", [context.version_path / "model.bin"], settings, {"lib": "1.0"})


def builder(content: bytes = b"artifact", delay: float = 0.0) -> Any:
    def build(artifact: Path) -> Mapping[str, Any]:
        time.sleep(delay)
        artifact.write_bytes(content)
        return {"figures": [1, 2]}

    return build


def test_a_second_load_reuses_the_entry_without_building(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    cache = CalibrationCache(context, "test", key_of(context), "model.onnx")
    before = BUILDS["test"]
    first = cache.get_or_build(builder())
    assert first.outcome == "miss"
    assert first.artifact == cache.path / "model.onnx"
    assert first.artifact.read_bytes() == b"artifact"
    assert cache.path.parent == context.version_path / CACHE_DIRNAME
    second = CalibrationCache(context, "test", key_of(context), "model.onnx").get_or_build(
        builder(b"never written")
    )
    assert second.outcome == "hit"
    assert second.artifact.read_bytes() == b"artifact"
    assert second.meta["figures"] == [1, 2]
    assert second.meta["key"] == key_of(context)
    assert BUILDS["test"] == before + 1
    assert [p.name for p in cache.path.parent.iterdir()] == [cache.path.name]  # no leftovers


def test_the_key_changes_with_model_bytes_settings_and_library_versions(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    model = context.version_path / "model.bin"
    base = key_of(context)
    assert key_of(context) == base  # deterministic
    assert key_of(context, per_channel="false") != base
    assert cache_key("test", [model], {}, {"lib": "1.1"}) != base
    assert cache_key("other", [model], {}, {"lib": "1.0"}) != base
    model.write_bytes(b"retrained")
    assert key_of(context) != base


def test_a_changed_key_builds_a_new_entry(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    CalibrationCache(context, "test", key_of(context), "a").get_or_build(builder())
    (context.version_path / "model.bin").write_bytes(b"retrained")
    entry = CalibrationCache(context, "test", key_of(context), "a").get_or_build(builder(b"new"))
    assert entry.outcome == "miss"
    assert entry.artifact.read_bytes() == b"new"


@pytest.mark.parametrize("damage", ["artifact", "meta", "missing artifact", "other key"])
def test_a_corrupt_entry_is_discarded_with_a_warning_and_rebuilt(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, damage: str
) -> None:
    context = make_context(tmp_path)
    cache = CalibrationCache(context, "test", key_of(context), "model.onnx")
    entry = cache.get_or_build(builder())
    meta = cache.path / "meta.json"
    if damage == "artifact":
        entry.artifact.write_bytes(b"artifacT")  # same size, one byte flipped
    elif damage == "meta":
        meta.write_text("{not json")
    elif damage == "missing artifact":
        entry.artifact.unlink()
    else:
        meta.write_text(json.dumps({**json.loads(meta.read_text()), "key": "0" * 64}))
    with caplog.at_level(logging.WARNING, logger="infermux.backends.calibration_cache"):
        again = cache.get_or_build(builder(b"rebuilt"))
    assert again.outcome == "corrupt"
    assert again.artifact.read_bytes() == b"rebuilt"
    assert "discarding the corrupt calibration cache entry" in caplog.text
    assert cache.get_or_build(builder(b"unused")).outcome == "hit"


def test_loaders_in_one_process_take_turns_so_only_one_builds(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    before = BUILDS["test"]
    outcomes: list[str] = []

    def load() -> None:
        cache = CalibrationCache(context, "test", key_of(context), "model.onnx")
        outcomes.append(cache.get_or_build(builder(delay=0.2)).outcome)

    threads = [threading.Thread(target=load) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(outcomes) == ["hit", "hit", "hit", "miss"]
    assert BUILDS["test"] == before + 1


def _build_in_a_process(tmp_path: str, content: bytes, start: Any) -> None:
    context = context_at(Path(tmp_path))
    cache = CalibrationCache(context, "test", key_of(context), "model.onnx")
    start.wait()
    cache.get_or_build(builder(content, delay=0.3))


def test_concurrent_processes_leave_one_whole_entry(tmp_path: Path) -> None:
    make_context(tmp_path)
    spawn = multiprocessing.get_context("spawn")
    start = spawn.Event()
    workers = [
        spawn.Process(target=_build_in_a_process, args=(str(tmp_path), content, start))
        for content in (b"first", b"second", b"third")
    ]
    for worker in workers:
        worker.start()
    start.set()
    for worker in workers:
        worker.join(60)
        assert worker.exitcode == 0
    context = context_at(tmp_path)
    cache = CalibrationCache(context, "test", key_of(context), "model.onnx")
    entry = cache.get_or_build(builder(b"not needed"))
    assert entry.outcome == "hit"  # whole: its artifact matches its recorded hash
    assert entry.artifact.read_bytes() in (b"first", b"second", b"third")
    assert [p.name for p in cache.path.parent.iterdir()] == [cache.path.name]


def test_a_read_only_version_directory_caches_in_the_user_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    context = make_context(tmp_path / "repo")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "home-cache"))
    real_access = os.access
    # The tests may run as root, for whom every directory is writable: pretend it is not.
    monkeypatch.setattr(os, "access", lambda p, mode: real_access(p, mode) and "repo" not in str(p))
    with caplog.at_level(logging.WARNING, logger="infermux.backends.calibration_cache"):
        cache = CalibrationCache(context, "test", key_of(context), "model.onnx")
    assert cache.path.is_relative_to(tmp_path / "home-cache" / "infermux" / "calibration")
    assert "is not writable; the calibration cache is in" in caplog.text
    assert cache.get_or_build(builder()).outcome == "miss"
    assert not (context.version_path / CACHE_DIRNAME).exists()


def test_a_failed_build_leaves_nothing_behind(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    cache = CalibrationCache(context, "test", key_of(context), "model.onnx")

    def failing(artifact: Path) -> Mapping[str, Any]:
        artifact.write_bytes(b"half")
        raise RuntimeError("calibration blew up")

    with pytest.raises(RuntimeError, match="blew up"):
        cache.get_or_build(failing)
    assert list(cache.path.parent.iterdir()) == []
    assert cache.get_or_build(builder()).outcome == "miss"


def test_the_repository_watcher_ignores_the_cache(tmp_path: Path) -> None:
    context = make_context(tmp_path)
    before = fingerprint(context.model_path)
    CalibrationCache(context, "test", key_of(context), "model.onnx").get_or_build(builder())
    assert fingerprint(context.model_path) == before
