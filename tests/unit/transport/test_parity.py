"""Every data-plane operation means the same whichever plane a front end is given: the in-process
``DataPlane``, the multi-process client (``RemoteDataPlane`` over ``RemoteExecutor``) and, where
Ray is installed, ``RayDataPlane``. Signatures match ``Operations``; every operation that crosses
the channel by name (``CALLS``) round-trips, answering as the plane behind it answers.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import pytest

from infermux.dataplane import DataPlane, Operations
from infermux.errors import InfermuxError
from infermux.transport.calls import CALLS
from infermux.transport.executor_client import RemoteExecutor
from infermux.transport.remote_plane import RemoteDataPlane
from tests.support import write_model
from tests.unit.transport.ends import connected

OPERATIONS = sorted(
    name for name, member in vars(Operations).items() if callable(member) and name[0] != "_"
)


def implementations() -> list[type]:
    planes: list[type] = [DataPlane, RemoteDataPlane, RemoteExecutor]
    try:
        # Through importorskip's own import, which silences what Ray's import warns about.
        pytest.importorskip("ray.serve")
    except pytest.skip.Exception:  # ray is an optional extra
        return planes
    from infermux.ray.plane import RayDataPlane

    return [*planes, RayDataPlane]


@pytest.mark.parametrize("plane", implementations(), ids=lambda p: p.__name__)
def test_every_plane_has_every_operation_with_its_signature(plane: type) -> None:
    for name in OPERATIONS:
        wanted = inspect.signature(getattr(Operations, name))
        method = getattr(plane, name, None)
        assert method is not None, f"{plane.__name__} lacks {name}"
        got = inspect.signature(method)
        assert [(p.name, p.kind, p.default) for p in got.parameters.values()] == [
            (p.name, p.kind, p.default) for p in wanted.parameters.values()
        ], f"{plane.__name__}.{name}{got} is not Operations.{name}{wanted}"
        assert inspect.iscoroutinefunction(method) == inspect.iscoroutinefunction(
            getattr(Operations, name)
        ), name


def test_calls_are_every_operation_but_inference_and_what_the_front_end_answers_itself() -> None:
    assert set(CALLS) == set(OPERATIONS) - {"infer", "infer_stream", "live", "server_metadata"}


class Planes:
    def __init__(self, local: DataPlane, remote: RemoteDataPlane) -> None:
        self.local, self.remote = local, remote


@pytest.fixture
async def planes(tmp_path: Path) -> AsyncIterator[Planes]:
    write_model(tmp_path / "repo", "m", versions=(1, 2))
    (tmp_path / "repo" / "m" / "config.pbtxt").write_text(
        (tmp_path / "repo" / "m" / "config.pbtxt").read_text() + "version_policy: { all { } }\n"
    )
    async with connected(tmp_path / "repo", tmp_path, ready_timeout_s=2.0) as (local, remote):
        yield Planes(local, remote)


def bound(plane: object, name: str, args: tuple[Any, ...]) -> Callable[[], Awaitable[Any]]:
    method: Callable[..., Awaitable[Any]] = getattr(plane, name)
    return lambda: method(*args)


async def outcome(call: Callable[[], Awaitable[Any]]) -> tuple[str, Any]:
    try:
        return "value", await call()
    except InfermuxError as exc:
        return "error", exc.code


async def test_every_call_round_trips_and_answers_as_the_plane_behind_it(planes: Planes) -> None:
    segment = shared_memory.SharedMemory(name=f"imx_{uuid.uuid4().hex[:8]}", create=True, size=64)
    try:
        # Each operation with arguments that reach the model layer; those that change state are
        # followed by a read through the in-process plane that sees the change.
        policy = '{"weights": {"1": 1, "2": 3}}'
        cases: dict[str, tuple[tuple[Any, ...], Callable[[], Awaitable[Any]] | None]] = {
            "ready": ((), None),
            "model_ready": (("m", "2"), None),
            "model_metadata": (("m",), None),
            "model_config": (("m", "1"), None),
            "model_statistics": (("m",), None),
            "repository_index": ((), None),
            "load_model": (("m",), None),  # refused alike: not explicit mode
            "unload_model": (("m",), None),
            "traffic": (("m",), None),
            "set_traffic": (("m", policy), lambda: planes.local.traffic("m")),
            "promote": (("m", 2), lambda: planes.local.traffic("m")),
            "rollback": (("m",), lambda: planes.local.traffic("m")),
            "shm_register": (("r", segment.name, 0, 64), planes.local.shm_status),
            "shm_status": (("r",), None),
            "shm_unregister": (("r",), planes.local.shm_status),
            "cuda_shm_register": (("c", b"\0" * 64, 0, 64), None),  # refused alike: disabled
            "cuda_shm_status": ((), None),
            "cuda_shm_unregister": (("c",), None),
            "log_settings": (({"log_info": True},), None),  # one process: the same settings
            "trace_settings": (
                ("m", {"trace_rate": "7"}),
                lambda: planes.local.trace_settings("m"),
            ),
        }
        assert set(cases) == CALLS  # a new operation needs a case here
        for name, (args, after) in cases.items():
            remote = await outcome(bound(planes.remote, name, args))
            if after is None:  # no state changed: the plane itself answers the same
                local = await outcome(bound(planes.local, name, args))
                assert remote == local, name
            else:
                assert remote[0] == "value", (name, remote)
                seen = await after()
                if name == "set_traffic":
                    assert seen.policy == {"weights": {"1": 1.0, "2": 3.0}}
                elif name == "promote":
                    assert seen.policy == {"weights": {"2": 1.0}}
                elif name == "rollback":
                    assert seen.policy == {"weights": {"1": 1.0, "2": 3.0}}
                elif name == "shm_register":
                    assert [r.name for r in seen] == ["r"]
                elif name == "shm_unregister":
                    assert seen == []
                elif name == "trace_settings":
                    assert seen["trace_rate"] == "7"
        for refused in (("nobody", {}), ("", {"trace_file": "x"}), ("", {"trace_rate": "x"})):
            remote = await outcome(bound(planes.remote, "trace_settings", refused))
            assert remote == await outcome(bound(planes.local, "trace_settings", refused))
            assert remote[0] == "error", refused
    finally:
        await planes.local.trace_settings("m", {"trace_rate": None})
        segment.close()
        segment.unlink()
