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
from google.protobuf import text_format
from tritonclient.grpc import model_config_pb2 as pb

from infermux.backends import BackendRegistry
from infermux.backends.base import DeviceParts
from infermux.dataplane import DataPlane
from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
from infermux.dataplane.micro_batches import Ungroupable, device_destinations
from infermux.dataplane.regions import Regions
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.model_config import ModelConfig
from infermux.repository import ControlMode, ModelRepository
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    InferRequest,
    Parameters,
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


def region(name: str, row: int, rows: int) -> Parameters:
    return {SHM_REGION: name, SHM_OFFSET: row * ROW, SHM_BYTE_SIZE: rows * ROW}


def micro_batch(rows: list[int], inputs: list[Parameters] | None = None) -> InferRequest:
    """What the executor is sent for ``len(rows)`` requests of ``rows[i]`` rows, their inputs
    and outputs in CUDA regions 'in' and 'out' (request i from row sum(rows[:i]) on)."""
    starts = [sum(rows[:i]) for i in range(len(rows))]
    if inputs is None:
        inputs = [region("in", s, n) for s, n in zip(starts, rows, strict=True)]
    return InferRequest(
        "plus_one",
        "",
        [
            Tensor("INPUT0", "FP32", (n, 4), np.empty(0, np.float32), dict(p))
            for n, p in zip(rows, inputs, strict=True)
        ],
        [
            RequestedOutput("OUTPUT0", region("out", s, n))
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


async def test_outputs_the_backend_wrote_on_the_device_are_not_written_again(
    tmp_path: Path, ipc: FakeIpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = PlusOneBackend(ipc, writes_outputs=True)
    repository, plane = await serving(tmp_path, backend)
    try:
        fill(ipc, HANDLE, 6)

        def no_host_write(*args: object) -> None:
            raise AssertionError("an output the backend placed went through the host again")

        monkeypatch.setattr(CudaSharedMemoryRegistry, "write", no_host_write)
        rows = [2, 1, 3]
        response = await plane.infer_many(
            micro_batch(rows), rows, inputs_apart=True, outputs_apart=True
        )
        ((model_request,),) = backend.batches
        parts = model_request.device_outputs["OUTPUT0"]
        base = min(b for b, h in ipc.bases.items() if h == OUT_HANDLE)
        assert [(p.pointer - base, p.shape) for p in parts.parts] == [
            (0, (2, 4)),
            (2 * ROW, (1, 4)),
            (3 * ROW, (3, 4)),
        ]
        assert model_request.outputs_on_device == {"OUTPUT0"}
        assert written(ipc, 6) == [1, 2, 3, 4, 5, 6]
        answered = [
            (o.parameters[SHM_REGION], o.parameters[SHM_OFFSET], o.parameters[SHM_BYTE_SIZE])
            for o in response.outputs
        ]
        assert answered == [("out", 0, 2 * ROW), ("out", 2 * ROW, ROW), ("out", 3 * ROW, 3 * ROW)]
    finally:
        plane.close()
        await repository.close()


async def test_outputs_not_all_in_cuda_regions_are_placed_from_the_host(
    tmp_path: Path, ipc: FakeIpc, segment: shared_memory.SharedMemory
) -> None:
    backend = PlusOneBackend(ipc, writes_outputs=True)
    repository, plane = await serving(tmp_path, backend)
    try:
        fill(ipc, HANDLE, 2)
        await plane.shm_register("sys", segment.name, 0, 1024)
        request = micro_batch([1, 1])
        request.outputs[1] = RequestedOutput("OUTPUT0", region("sys", 0, 1))
        await plane.infer_many(request, [1, 1], inputs_apart=True, outputs_apart=True)
        ((model_request,),) = backend.batches
        assert model_request.device_outputs == {}
        assert model_request.outputs_on_device == set()
        assert written(ipc, 1) == [1]
        assert segment.buf is not None
        assert np.frombuffer(bytes(segment.buf[:ROW]), np.float32).tolist() == [2, 2, 2, 2]
    finally:
        plane.close()
        await repository.close()


def test_device_destinations_leave_outputs_asked_with_more_than_a_place_on_the_host(
    ipc: FakeIpc,
) -> None:
    cuda = CudaSharedMemoryRegistry(enabled=True, ipc=lambda: ipc)
    cuda.register("out", OUT_HANDLE, 0, 1024)
    regions = Regions(SharedMemoryRegistry(enabled=True), cuda)
    config = ModelConfig.from_proto(
        text_format.Parse(
            'name: "m" max_batch_size: 8 '
            'input [ { name: "X", data_type: TYPE_FP16, dims: [ 3 ] } ] '
            'output [ { name: "Y", data_type: TYPE_FP16, dims: [ 3 ] }, '
            '{ name: "S", data_type: TYPE_STRING, dims: [ 1 ] } ]',
            pb.ModelConfig(),
        )
    )
    y = [RequestedOutput("Y", region("out", 0, 1)), RequestedOutput("Y", region("out", 1, 2))]
    (found,) = device_destinations(config, [[y[0]], [y[1]]], [1, 2], regions).values()
    described = [(p.shape, p.dtype.name) for p in found.parts]
    assert described == [((1, 3), "float16"), ((2, 3), "float16")]
    classified = RequestedOutput("Y", {**region("out", 1, 2), "classification": 2})
    assert device_destinations(config, [[y[0]], [classified]], [1, 2], regions) == {}
    strings = [[RequestedOutput("S", region("out", 0, 1))]] * 2
    assert device_destinations(config, strings, [1, 1], regions) == {}
    gone = [RequestedOutput("Y", region("nope", 0, 1))]
    assert device_destinations(config, [[y[0]], gone], [1, 1], regions) == {}


async def test_a_micro_batch_asks_the_driver_once_per_region_and_still_holds_each_slice(
    tmp_path: Path, ipc: FakeIpc, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Every request of perf_analyzer's names the same few regions: the driver was asked about
    # the allocation once per slice (~12% of the executor's loop on this path); now once per
    # region and micro-batch, and every slice is still held to that answer.
    backend = PlusOneBackend(ipc, writes_outputs=True)
    repository, plane = await serving(tmp_path, backend)
    asked: list[int] = []
    size_of = ipc.allocation_size

    def counted(pointer: int, device_id: int) -> int:
        asked.append(pointer)
        return size_of(pointer, device_id)

    monkeypatch.setattr(ipc, "allocation_size", counted)
    try:
        fill(ipc, HANDLE, 6)
        rows = [2, 1, 3]
        await plane.infer_many(micro_batch(rows), rows, inputs_apart=True, outputs_apart=True)
        assert sorted(asked) == sorted(ipc.bases)  # 'in' once, 'out' once
        assert written(ipc, 6) == [1, 2, 3, 4, 5, 6]
        # The allocation behind 'in' shrank to four rows after its registration: the request
        # whose rows lie past them makes the micro-batch ungroupable (it then fails alone).
        del ipc.memory[HANDLE][4 * ROW :]
        asked.clear()
        with pytest.raises(Ungroupable, match="past the end of the CUDA allocation of 64 bytes"):
            await plane.infer_many(micro_batch(rows), rows, inputs_apart=True, outputs_apart=True)
        assert len(asked) == 1
        assert len(backend.batches) == 1
    finally:
        plane.close()
        await repository.close()
