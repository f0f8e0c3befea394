"""Micro-batches of requests whose tensors lie in CUDA shared memory, on the executor's side
(``DataPlane.infer_many``): one model request, each request's rows left where its client put
them (one device part each), each output placed in its own region; a request whose region is
bad makes the micro-batch ungroupable, so it fails on its own. CUDA is the stand-in of
``test_cuda_shared_memory.py``; tests/gpu/test_cuda_shm_gpu.py runs the same on a GPU."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.backends.base import DeviceParts
from infermux.dataplane import DataPlane
from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
from infermux.dataplane.micro_batches import Ungroupable
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.repository import ControlMode, ModelRepository
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    InferRequest,
    RequestedOutput,
    Tensor,
)
from tests.unit.dataplane.cuda_fakes import PlusOneBackend, write_plus_one
from tests.unit.dataplane.test_cuda_shared_memory import HANDLE, FakeIpc

OUT_HANDLE = bytes(reversed(HANDLE))
ROW = 16  # bytes of one row: four FP32


@pytest.fixture
def ipc() -> FakeIpc:
    ipc = FakeIpc()
    ipc.allocate(HANDLE, 1024)
    ipc.allocate(OUT_HANDLE, 1024)
    return ipc


async def serving(repo: Path, backend: PlusOneBackend) -> tuple[ModelRepository, DataPlane]:
    write_plus_one(repo)
    registry = BackendRegistry({backend.name: lambda: backend})
    repository = ModelRepository([repo], registry, control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(
        repository,
        version="1",
        shared_memory=SharedMemoryRegistry(enabled=True),
        cuda_shared_memory=CudaSharedMemoryRegistry(enabled=True, ipc=lambda: backend.ipc),
    )
    await plane.cuda_shm_register("in", HANDLE, 0, 1024)
    await plane.cuda_shm_register("out", OUT_HANDLE, 0, 1024)
    return repository, plane


@pytest.fixture(params=[True, False], ids=["device model", "host model"])
async def served(
    request: pytest.FixtureRequest, tmp_path: Path, ipc: FakeIpc
) -> AsyncIterator[tuple[DataPlane, PlusOneBackend]]:
    backend = PlusOneBackend(ipc, on_device=request.param)
    repository, plane = await serving(tmp_path, backend)
    yield plane, backend
    plane.close()
    await repository.close()


def region(name: str, row: int, rows: int) -> dict[str, object]:
    return {SHM_REGION: name, SHM_OFFSET: row * ROW, SHM_BYTE_SIZE: rows * ROW}


def micro_batch(rows: list[int], inputs: list[dict[str, object]] | None = None) -> InferRequest:
    """What the executor is sent for ``len(rows)`` requests of ``rows[i]`` rows, their inputs
    and outputs in CUDA regions 'in' and 'out' (request i from row sum(rows[:i]) on)."""
    starts = [sum(rows[:i]) for i in range(len(rows))]
    if inputs is None:
        inputs = [region("in", s, n) for s, n in zip(starts, rows, strict=True)]
    return InferRequest(
        "plus_one",
        "",
        [
            Tensor("INPUT0", "FP32", (n, 4), np.empty(0, np.float32), dict(p))  # type: ignore[arg-type]
            for n, p in zip(rows, inputs, strict=True)
        ],
        [
            RequestedOutput("OUTPUT0", region("out", s, n))  # type: ignore[arg-type]
            for s, n in zip(starts, rows, strict=True)
        ],
    )


def fill(ipc: FakeIpc, handle: bytes, rows: int) -> None:
    """Row r of the region holds four times r."""
    data = np.repeat(np.arange(rows, dtype=np.float32), 4)
    ipc.memory[handle][: data.nbytes] = data.tobytes()


def written(ipc: FakeIpc, rows: int) -> list[float]:
    """The first value of each row written in the output region."""
    out = np.frombuffer(bytes(ipc.memory[OUT_HANDLE][: rows * ROW]), np.float32)
    values: list[float] = out.reshape(rows, 4)[:, 0].tolist()
    return values


async def test_a_micro_batch_of_cuda_requests_is_one_model_request(
    served: tuple[DataPlane, PlusOneBackend], ipc: FakeIpc
) -> None:
    plane, backend = served
    fill(ipc, HANDLE, 6)
    rows = [2, 1, 3]
    response = await plane.infer_many(
        micro_batch(rows), rows, inputs_apart=True, outputs_apart=True
    )
    (batch,) = backend.batches  # one queue entry, one execution
    (model_request,) = batch
    assert model_request.batch_size == 6
    if backend.accepts_device_inputs:
        # Each request's rows stay where its client put them, in request order.
        assert not model_request.inputs
        parts = model_request.device_inputs["INPUT0"]
        assert isinstance(parts, DeviceParts)
        base = min(ipc.bases)
        assert [(p.pointer - base, p.shape) for p in parts.parts] == [
            (0, (2, 4)),
            (2 * ROW, (1, 4)),
            (3 * ROW, (3, 4)),
        ]
    else:  # copied to the host, as a single request's would be for such a model
        assert not model_request.device_inputs
        assert model_request.inputs["INPUT0"][:, 0].tolist() == [0, 1, 2, 3, 4, 5]
    assert written(ipc, 6) == [1, 2, 3, 4, 5, 6]
    placed = [(o.parameters[SHM_REGION], o.parameters[SHM_OFFSET]) for o in response.outputs]
    assert placed == [("out", 0), ("out", 2 * ROW), ("out", 3 * ROW)]
    (stats,) = await plane.model_statistics("plus_one")
    assert stats.inference_stats["success"].count == 3
    assert stats.execution_count == 1


async def test_a_request_whose_cuda_region_is_bad_makes_the_micro_batch_ungroupable(
    served: tuple[DataPlane, PlusOneBackend],
) -> None:
    plane, backend = served
    inputs = [region("in", 0, 1), region("in", 1, 1), region("nope", 2, 1)]
    with pytest.raises(Ungroupable, match="'nope' is not registered"):
        await plane.infer_many(micro_batch([1, 1, 1], inputs), [1, 1, 1], inputs_apart=True)
    short = [region("in", 0, 1), {**region("in", 1, 1), SHM_BYTE_SIZE: 12}]
    with pytest.raises(Ungroupable, match=r"byte size is 12|got 12 bytes"):  # as if alone
        await plane.infer_many(micro_batch([1, 1], short), [1, 1], inputs_apart=True)
    assert backend.batches == []  # nothing ran: each request is sent again on its own


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    block = shared_memory.SharedMemory(create=True, size=1024)
    yield block
    block.close()
    block.unlink()


async def test_system_and_cuda_inputs_in_one_micro_batch_are_stacked_on_the_host(
    served: tuple[DataPlane, PlusOneBackend],
    ipc: FakeIpc,
    segment: shared_memory.SharedMemory,
) -> None:
    # A front end sends a system region's request as a reference only while it does not know
    # the region yet (transport/regions.py), so this mix is rare: read on the host.
    plane, backend = served
    fill(ipc, HANDLE, 4)
    assert segment.buf is not None
    segment.buf[: 2 * ROW] = np.full(8, 10.0, np.float32).tobytes()
    await plane.shm_register("sys", segment.name, 0, 1024)
    inputs = [region("in", 0, 1), region("sys", 0, 2), region("in", 3, 1)]
    rows = [1, 2, 1]
    await plane.infer_many(micro_batch(rows, inputs), rows, inputs_apart=True, outputs_apart=True)
    ((model_request,),) = backend.batches
    assert not model_request.device_inputs
    assert model_request.inputs["INPUT0"][:, 0].tolist() == [0, 10, 10, 3]
    assert written(ipc, 4) == [1, 11, 11, 4]
