"""Micro-batches of requests whose tensors lie in CUDA shared memory, through a real channel: a
front end sends them together as one frame, the executor runs them as one model request (each
request's rows one device part) and places each output in its own region; a request whose
region is bad fails alone. CUDA is the stand-in of tests/unit/dataplane (no GPU here)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.backends.base import DeviceParts
from infermux.dataplane import DataPlane
from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
from infermux.dataplane.micro_batches import Ungroupable
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.errors import ErrorCode, InfermuxError
from infermux.ipc import Channel
from infermux.repository import ControlMode, ModelRepository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    InferRequest,
    RequestedOutput,
    ServerMetadata,
    Tensor,
)
from tests.unit.dataplane.cuda_fakes import PlusOneBackend, write_plus_one
from tests.unit.dataplane.test_cuda_shared_memory import HANDLE, FakeIpc

OUT_HANDLE = bytes(reversed(HANDLE))
ROW = 16  # bytes of one row: four FP32


class Served:
    def __init__(self, plane: DataPlane, remote: RemoteDataPlane, backend: PlusOneBackend):
        self.plane, self.remote, self.backend = plane, remote, backend
        self.frames: list[dict[str, Any]] = []  # every micro-batch the executor was sent
        run = plane.infer_many

        async def counted(request: InferRequest, rows: Any, **kwargs: bool) -> Any:
            frame: dict[str, Any] = {"rows": list(rows), "refused": False, **kwargs}
            self.frames.append(frame)
            try:
                return await run(request, rows, **kwargs)
            except Ungroupable:
                frame["refused"] = True
                raise

        plane.infer_many = counted  # type: ignore[method-assign]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    ipc = FakeIpc()
    ipc.allocate(HANDLE, 1024)
    ipc.allocate(OUT_HANDLE, 1024)
    data = np.repeat(np.arange(64, dtype=np.float32), 4)  # row r holds four times r
    ipc.memory[HANDLE][:] = data.tobytes()
    backend = PlusOneBackend(ipc)
    write_plus_one(tmp_path / "repo")
    registry = BackendRegistry({backend.name: lambda: backend})
    repository = ModelRepository([tmp_path / "repo"], registry, control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(
        repository,
        version="test",
        shared_memory=SharedMemoryRegistry(enabled=True),
        cuda_shared_memory=CudaSharedMemoryRegistry(enabled=True, ipc=lambda: ipc),
    )
    channel = Channel(tmp_path, ring_bytes=256 * 1024, arena_bytes=4 * 1024 * 1024)
    server = ChannelServer(plane)
    server.attach(channel.spec)
    remote = RemoteDataPlane(ServerMetadata("infermux", "test", ()), ready_timeout_s=0.5)
    remote.attach(channel.spec)
    await remote.cuda_shm_register("in", HANDLE, 0, 1024)
    await remote.cuda_shm_register("out", OUT_HANDLE, 0, 1024)
    try:
        yield Served(plane, remote, backend)
    finally:
        remote.detach("test over")
        await server.close()
        channel.close()
        plane.close()
        await repository.close()


def region(name: str, row: int) -> dict[str, Any]:
    return {SHM_REGION: name, SHM_BYTE_SIZE: ROW, SHM_OFFSET: row * ROW}


def request(row: int) -> InferRequest:
    """One row, read from row ``row`` of region 'in' and answered into the same row of 'out'."""
    return InferRequest(
        "plus_one",
        "",
        [Tensor("INPUT0", "FP32", (1, 4), np.empty(0, np.float32), region("in", row))],
        [RequestedOutput("OUTPUT0", region("out", row))],
    )


def written(served: Served, rows: int) -> list[float]:
    out = np.frombuffer(bytes(served.backend.ipc.memory[OUT_HANDLE][: rows * ROW]), np.float32)
    values: list[float] = out.reshape(rows, 4)[:, 0].tolist()
    return values


async def test_cuda_requests_travel_as_one_frame_and_one_model_request(served: Served) -> None:
    answers = await asyncio.gather(*(served.remote.infer(request(i)) for i in range(12)))
    for i, answer in enumerate(answers):
        (out,) = answer.outputs
        assert (out.parameters[SHM_REGION], out.parameters[SHM_OFFSET]) == ("out", i * ROW)
    assert written(served, 12) == [i + 1.0 for i in range(12)]
    grouped = [f for f in served.frames if len(f["rows"]) > 1]
    assert grouped
    assert not any(f["refused"] for f in grouped)  # as they were: a Regroup, then one by one
    assert all(f["inputs_apart"] and f["outputs_apart"] for f in grouped)
    # A micro-batch of n requests is one model request of n device parts (one queue entry).
    given = [r for batch in served.backend.batches for r in batch]
    assert len(given) == len(served.frames) + 12 - sum(len(f["rows"]) for f in served.frames)
    parts = [r.device_inputs["INPUT0"] for r in given]
    assert any(isinstance(p, DeviceParts) and len(p.parts) > 1 for p in parts)
    (stats,) = await served.plane.model_statistics("plus_one")
    assert stats.inference_stats["success"].count == 12


async def test_a_request_whose_cuda_region_is_bad_fails_alone(served: Served) -> None:
    requests = [request(i) for i in range(6)]
    requests[2].inputs[0].parameters[SHM_BYTE_SIZE] = 12  # the model's row needs 16 bytes
    results = await asyncio.gather(
        *(served.remote.infer(r) for r in requests), return_exceptions=True
    )
    assert isinstance(results[2], InfermuxError)
    assert results[2].code is ErrorCode.INVALID_ARG
    assert "byte size is 12" in results[2].message
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)
    assert any(f["refused"] for f in served.frames)  # then sent one by one
    assert written(served, 6)[:2] + written(served, 6)[3:] == [1.0, 2.0, 4.0, 5.0, 6.0]
    (stats,) = await served.plane.model_statistics("plus_one")
    assert stats.inference_stats["success"].count == 5
    assert stats.inference_stats["fail"].count == 1


async def test_a_lone_cuda_request_travels_as_a_micro_batch_of_one(served: Served) -> None:
    # Sent on its own, its output would come to the host and be copied back into its region
    # synchronously on the executor's loop; as a micro-batch it gets the one-pass checks and a
    # destination the model may write on the device.
    answer = await served.remote.infer(request(3))
    (out,) = answer.outputs
    assert (out.parameters[SHM_REGION], out.parameters[SHM_OFFSET]) == ("out", 3 * ROW)
    assert written(served, 4)[3] == 4.0
    assert served.frames == [{"rows": [1], "refused": False, "inputs_apart": True,
                              "outputs_apart": True}]  # fmt: skip
    ((given,),) = served.backend.batches
    assert isinstance(given.device_inputs["INPUT0"], DeviceParts)
    assert "OUTPUT0" in given.device_outputs  # its place in 'out', for the model to write


async def test_a_request_at_fault_does_not_stop_the_next_micro_batches(served: Served) -> None:
    first = [request(i) for i in range(4)]
    first[1].inputs[0].parameters[SHM_BYTE_SIZE] = 12  # the model's row needs 16 bytes
    results = await asyncio.gather(*(served.remote.infer(r) for r in first), return_exceptions=True)
    assert isinstance(results[1], InfermuxError)
    assert "byte size is 12" in results[1].message
    assert [f["refused"] for f in served.frames] == [True]  # then one by one
    seen = len(served.frames)
    answers = await asyncio.gather(*(served.remote.infer(request(i)) for i in range(8)))
    assert len(answers) == 8
    assert written(served, 8) == [i + 1.0 for i in range(8)]
    # One client's mistake says nothing about the model: the requests after it still group
    # (they went one by one for 10 s after it).
    later = served.frames[seen:]
    assert later
    assert not any(f["refused"] for f in later)
    assert any(len(f["rows"]) > 1 for f in later)
