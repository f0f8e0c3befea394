"""What a restarted executor is given back (:mod:`infermux.processes.desired`): the record of
clients' changes, and its replay on a real data plane (explicit mode, real shm objects)."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import replace
from multiprocessing import shared_memory
from pathlib import Path

import msgspec
import pytest

from infermux.dataplane.assembly import build_dataplane, build_repository
from infermux.processes.desired import (
    RESTART_FAILED,
    CudaRegion,
    Desired,
    Held,
    ModelWish,
    SystemRegion,
)
from infermux.settings import ServerSettings
from tests.support import write_model


def test_calls_are_recorded_however_their_arguments_came() -> None:
    desired = Desired()
    desired.record("load_model", ["a"], {"config_override": '{"max_batch_size": 2}'})
    desired.record("load_model", ["b"], {"config_override": None})
    desired.record("load_model", ["b"], {})  # each executor reports the same call: no change
    desired.record("unload_model", [], {"name": "c"})
    desired.record("shm_register", ["r", "/k", 8, 64], {})
    desired.record("shm_register", ["s", "/k", 0, 8], {})
    desired.record("cuda_shm_register", ["g", b"h" * 64, 0, 256], {})
    assert desired.models == {
        "a": ModelWish(True, '{"max_batch_size": 2}'),
        "b": ModelWish(True),
        "c": ModelWish(False),
    }
    assert desired.shm == {"r": SystemRegion("/k", 8, 64), "s": SystemRegion("/k", 0, 8)}
    assert desired.cuda_shm == {"g": CudaRegion(b"h" * 64, 0, 256)}
    desired.record("unload_model", ["a"], {})
    desired.record("shm_unregister", ["r"], {})
    desired.record("cuda_shm_unregister", [], {})  # "" unregisters every region of the kind
    assert desired.models["a"] == ModelWish(False)
    assert list(desired.shm) == ["s"]
    assert desired.cuda_shm == {}
    desired.record("shm_unregister", [""], {})
    assert desired.shm == {}


def test_it_travels_over_the_control_socket_and_copies_independently() -> None:
    desired = Desired()
    desired.record("load_model", ["a"], {})
    desired.record("cuda_shm_register", ["g", b"\x00" * 64, 1, 8], {})
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(desired), type=Desired)
    assert wire == desired
    copy = desired.copy()
    copy.record("unload_model", ["a"], {})
    assert desired.models["a"].loaded
    assert not copy.models["a"].loaded
    assert copy != desired


# A load's ``config`` replaces the model's whole configuration (as in Triton).
OVERRIDE = json.dumps(
    {
        "name": "loaded",
        "backend": "python",
        "max_batch_size": 4,
        "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
    }
)


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    block = shared_memory.SharedMemory(name=f"imx_{uuid.uuid4().hex[:8]}", create=True, size=128)
    yield block
    block.close()
    block.unlink()


async def test_a_replay_restores_models_and_regions_and_says_what_failed(
    tmp_path: Path, segment: shared_memory.SharedMemory
) -> None:
    for name in ("kept", "loaded", "unloaded", "broken"):
        write_model(tmp_path, name)
    settings = ServerSettings(
        model_repositories=(tmp_path,),
        model_control_mode="explicit",
        load_models=("kept", "unloaded"),
        allow_client_shm=True,
    )
    want = Desired()
    want.record("load_model", ["loaded"], {"config_override": OVERRIDE})
    want.record("unload_model", ["unloaded"], {})
    want.record("load_model", ["broken"], {})
    want.record("load_model", ["deleted"], {})  # gone from the repository since
    want.record("shm_register", ["alive", "/" + segment.name, 0, 64], {})
    want.record("shm_register", ["dead", f"/imx_gone_{uuid.uuid4().hex[:8]}", 0, 64], {})
    (tmp_path / "broken" / "1" / "model.py").write_text("raise RuntimeError('boom')\n")

    repository = build_repository(settings)
    plane = build_dataplane(settings, repository)
    reported: list[tuple[str, list[object]]] = []
    held = Held(plane, repository, lambda method, args, kwargs: reported.append((method, args)))
    try:
        await repository.start(skip=want.models)
        await held.restore(want)
        index = {(row.name, row.version): row for row in repository.index()}
        assert index["kept", "1"].state == "READY"
        assert index["loaded", "1"].state == "READY"
        assert (await plane.model_config("loaded")).max_batch_size == 4  # its override
        assert ("unloaded", "1") not in index  # never loaded: the startup set skipped it
        assert not repository.is_ready("unloaded")
        for name in ("broken", "deleted"):
            rows = [row for (n, _), row in index.items() if n == name]
            assert [row.state for row in rows] == ["UNAVAILABLE"], rows
            assert rows[0].reason.startswith(f"{RESTART_FAILED}: "), rows
        assert [r.name for r in await plane.shm_status()] == ["alive"]
        # The region that could not be mapped again is dropped, and reported as unregistered.
        assert reported == [("shm_unregister", ["dead"])]
        assert list(held.desired.shm) == ["alive"]

        # A later restore (changes made while it started) applies only the difference.
        later = held.desired.copy()
        later.record("shm_unregister", ["alive"], {})
        later.record("unload_model", ["loaded"], {})
        later.record("load_model", ["unloaded"], {})
        await held.restore(later)
        assert await plane.shm_status() == []
        assert not repository.is_ready("loaded")
        assert repository.is_ready("unloaded")
        assert repository.is_ready("kept")
    finally:
        await repository.close()
        plane.close()


async def test_without_changes_the_startup_set_loads_as_the_command_line_says(
    tmp_path: Path,
) -> None:
    write_model(tmp_path, "m")
    settings = replace(
        ServerSettings(model_repositories=(tmp_path,)),
        model_control_mode="explicit",
        load_models=("*",),
    )
    repository = build_repository(settings)
    plane = build_dataplane(settings, repository)
    try:
        await repository.start(skip=Desired().models)
        await Held(plane, repository, lambda *call: None).restore(Desired())
        assert repository.is_ready("m")
    finally:
        await repository.close()
        plane.close()


def test_trace_settings_are_recorded_by_scope_and_reads_are_not_reported() -> None:
    desired = Desired()
    desired.record("trace_settings", ["", {"trace_rate": "5"}], {})
    desired.record("trace_settings", [], {"model": "m", "changes": {"trace_level": ["OFF"]}})
    desired.record("trace_settings", ["", {"trace_rate": "5"}], {})  # every executor reports it
    assert desired.trace == {"": {"trace_rate": "5"}, "m": {"trace_level": ["OFF"]}}
    copy = desired.copy()
    copy.record("trace_settings", ["m", {"trace_level": None}], {})  # nothing left: global
    assert "m" not in copy.trace
    assert desired.trace["m"] == {"trace_level": ["OFF"]}
    wire = msgspec.msgpack.decode(msgspec.msgpack.encode(desired), type=Desired)
    assert wire == desired

    reported: list[str] = []
    held = Held(None, None, lambda method, args, kwargs: reported.append(method))  # type: ignore[arg-type]
    held.observe("trace_settings", ["m"], {})
    held.observe("trace_settings", ["m", None], {})
    assert reported == []
    held.observe("trace_settings", ["m", {"trace_rate": "2"}], {})
    assert reported == ["trace_settings"]
    assert held.desired.trace == {"m": {"trace_rate": "2"}}


async def test_a_replay_restores_trace_settings(tmp_path: Path) -> None:
    write_model(tmp_path, "m")
    settings = ServerSettings(model_repositories=(tmp_path,))
    repository = build_repository(settings)
    plane = build_dataplane(settings, repository)
    held = Held(plane, repository, lambda method, args, kwargs: None)
    want = Desired()
    want.record("trace_settings", ["", {"trace_rate": "5"}], {})
    want.record("trace_settings", ["m", {"trace_count": "3"}], {})
    want.record("trace_settings", ["gone", {"trace_count": "3"}], {})  # not here: skipped
    try:
        await repository.start()
        await held.restore(want)
        assert (await plane.trace_settings())["trace_rate"] == "5"
        assert (await plane.trace_settings("m"))["trace_count"] == "3"
        later = held.desired.copy()
        later.record("trace_settings", ["", {"trace_rate": None}], {})
        await held.restore(later)
        assert (await plane.trace_settings())["trace_rate"] == "1000"
        assert (await plane.trace_settings("m"))["trace_count"] == "3"
    finally:
        await plane.trace_settings("m", {"trace_count": None})
        await plane.trace_settings("", {"trace_rate": None})
        await repository.close()
        plane.close()
