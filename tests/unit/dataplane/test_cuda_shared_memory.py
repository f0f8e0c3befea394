"""CUDA shared memory without a GPU: the registry's checks, its namespace shared with system
regions, host copies for backends that read host memory, device views for those that read GPU
memory. CUDA itself is a stand-in here (host byte arrays play device memory); tests/gpu runs
the real IPC path with tritonclient's CUDA shared-memory utilities."""

from __future__ import annotations

import gc
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import numpy.typing as npt
import pytest

from infermux.backends import BackendRegistry
from infermux.backends.stacking import compatible, device_parts, stack
from infermux.dataplane import DataPlane
from infermux.dataplane.cuda_ipc import CudaCallError, CudaRuntime
from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
from infermux.dataplane.inputs import to_model_request
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.errors import (
    ErrorCode,
    InfermuxError,
    InternalError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from infermux.repository import ControlMode, ModelRepository, load_model_config
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    DeviceArray,
    InferRequest,
    Parameters,
    RequestedOutput,
    Tensor,
)
from tests.support import write_model

HANDLE = bytes(range(64))


class FakeIpc:
    """Device memory as host byte arrays: one allocation per distinct handle."""

    device_count = 2

    def __init__(self) -> None:
        self.memory: dict[bytes, bytearray] = {}
        self.bases: dict[int, bytes] = {}
        self.closed: list[int] = []

    def allocate(self, handle: bytes, size: int) -> bytearray:
        self.memory[handle] = bytearray(size)
        return self.memory[handle]

    def open(self, handle: bytes, device_id: int) -> int:
        base = 0x10000 * (len(self.bases) + 1)
        self.bases[base] = handle
        return base

    def close(self, pointer: int, device_id: int) -> None:
        self.closed.append(pointer)

    def allocation_size(self, pointer: int, device_id: int) -> int:
        base = max(b for b in self.bases if b <= pointer)
        if self.bases[base] not in self.memory:  # freed by its owner
            raise CudaCallError("cuMemGetAddressRange failed: CUDA_ERROR_NOT_FOUND")
        return len(self.memory[self.bases[base]]) - (pointer - base)

    def _at(self, pointer: int) -> tuple[bytearray, int]:
        base = max(b for b in self.bases if b <= pointer)
        return self.memory[self.bases[base]], pointer - base

    def to_host(self, pointer: int, target: npt.NDArray[np.generic], device_id: int) -> None:
        memory, offset = self._at(pointer)
        target.view(np.uint8)[:] = np.frombuffer(memory, np.uint8)[offset : offset + target.nbytes]

    def from_host(self, pointer: int, data: bytes, device_id: int) -> None:
        memory, offset = self._at(pointer)
        memory[offset : offset + len(data)] = data


def placed(name: str, datatype: str, shape: tuple[int, ...], **params: object) -> Tensor:
    return Tensor(name, datatype, shape, np.empty(0), dict(params))  # type: ignore[arg-type]


@pytest.fixture
def ipc() -> FakeIpc:
    return FakeIpc()


@pytest.fixture
def registry(ipc: FakeIpc) -> CudaSharedMemoryRegistry:
    return CudaSharedMemoryRegistry(enabled=True, ipc=lambda: ipc)


def test_disabled_registry_refuses_everything() -> None:
    registry = CudaSharedMemoryRegistry(enabled=False, ipc=FakeIpc)
    with pytest.raises(UnsupportedError, match="--allow-client-shm"):
        registry.register("c", HANDLE, 0, 8)
    with pytest.raises(UnsupportedError):
        registry.status()


@pytest.mark.parametrize(
    ("name", "handle", "device", "size", "message"),
    [
        ("", HANDLE, 0, 8, "'name' must not be empty"),
        ("c", b"short", 0, 8, "must be the 64 bytes of a cudaIpcMemHandle_t, got 5 bytes"),
        ("c", HANDLE, -1, 8, "'device_id' must be >= 0"),
        ("c", HANDLE, 0, 0, "'byte_size' > 0"),
        ("c", HANDLE, 2, 8, r"'device_id' 2 does not exist \(CUDA sees 2 device"),
    ],
)
def test_bad_registrations_name_the_field(
    registry: CudaSharedMemoryRegistry,
    name: str,
    handle: bytes,
    device: int,
    size: int,
    message: str,
) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        registry.register(name, handle, device, size)


def test_register_status_unregister(registry: CudaSharedMemoryRegistry, ipc: FakeIpc) -> None:
    ipc.allocate(HANDLE, 64)
    registry.register("c", HANDLE, 1, 64)
    with pytest.raises(InfermuxError) as exc:
        registry.register("c", HANDLE, 1, 64)
    assert exc.value.code == ErrorCode.ALREADY_EXISTS
    (status,) = registry.status("c")
    assert (status.name, status.device_id, status.byte_size) == ("c", 1, 64)
    with pytest.raises(NotFoundError, match="'d'"):
        registry.status("d")
    registry.unregister("c")
    gc.collect()
    assert ipc.closed == [0x10000]
    assert registry.status() == []
    with pytest.raises(NotFoundError):
        registry.unregister("c")


def test_an_array_in_flight_keeps_its_region_open(
    registry: CudaSharedMemoryRegistry, ipc: FakeIpc
) -> None:
    ipc.allocate(HANDLE, 64)
    registry.register("c", HANDLE, 0, 64)
    tensor = placed("x", "FP32", (2, 2), **{SHM_REGION: "c", SHM_BYTE_SIZE: 16})
    array = registry.read(tensor, on_device=True)
    registry.unregister()
    gc.collect()
    assert ipc.closed == []  # a batch may still be copying from it
    del array
    gc.collect()
    assert ipc.closed == [0x10000]


def test_device_reads_are_views_and_host_reads_are_copies(
    registry: CudaSharedMemoryRegistry, ipc: FakeIpc
) -> None:
    memory = ipc.allocate(HANDLE, 64)
    memory[16:32] = np.arange(4, dtype=np.float32).tobytes()
    registry.register("c", HANDLE, 1, 64)
    params = {SHM_REGION: "c", SHM_BYTE_SIZE: 16, SHM_OFFSET: 16}
    view = registry.read(placed("x", "FP32", (2, 2), **params), on_device=True)
    assert isinstance(view, DeviceArray)
    assert (view.pointer, view.shape, view.dtype, view.device_id) == (
        0x10000 + 16,
        (2, 2),
        np.dtype(np.float32),
        1,
    )
    interface = view.__cuda_array_interface__
    assert (interface["data"], interface["typestr"], interface["shape"]) == (
        (0x10000 + 16, False),
        "<f4",
        (2, 2),
    )
    copy = registry.read(placed("x", "FP32", (2, 2), **params), on_device=False)
    assert isinstance(copy, np.ndarray)
    np.testing.assert_array_equal(copy, [[0, 1], [2, 3]])
    # BOOL must be checked and BYTES parsed on the host, whatever the backend reads.
    memory[0:2] = b"\x01\x00"
    flags = registry.read(
        placed("b", "BOOL", (2,), **{SHM_REGION: "c", SHM_BYTE_SIZE: 2}), on_device=True
    )
    assert isinstance(flags, np.ndarray)
    assert flags.tolist() == [True, False]


def test_reads_check_sizes_and_bounds(registry: CudaSharedMemoryRegistry, ipc: FakeIpc) -> None:
    ipc.allocate(HANDLE, 64)
    registry.register("c", HANDLE, 0, 64)
    with pytest.raises(InvalidArgumentError, match="byte size is 12 but shape"):
        registry.read(
            placed("x", "FP32", (2, 2), **{SHM_REGION: "c", SHM_BYTE_SIZE: 12}), on_device=True
        )
    with pytest.raises(InvalidArgumentError, match="outside region 'c' of 64 bytes"):
        registry.read(
            placed("x", "FP32", (4,), **{SHM_REGION: "c", SHM_BYTE_SIZE: 16, SHM_OFFSET: 56}),
            on_device=True,
        )
    with pytest.raises(InvalidArgumentError, match="'nope' is not registered"):
        registry.read(
            placed("x", "FP32", (1,), **{SHM_REGION: "nope", SHM_BYTE_SIZE: 4}), on_device=True
        )


def test_a_region_is_held_to_the_allocation_the_driver_reports(
    registry: CudaSharedMemoryRegistry, ipc: FakeIpc
) -> None:
    ipc.allocate(HANDLE, 64)
    # byte_size is the client's claim: one past the real allocation is refused, and closed.
    with pytest.raises(
        InvalidArgumentError, match="'c': byte_size 128 exceeds the 64 bytes of the CUDA alloc"
    ):
        registry.register("c", HANDLE, 0, 128)
    assert ipc.closed == [0x10000]
    assert registry.status() == []
    registry.register("c", HANDLE, 0, 64)
    params: Parameters = {SHM_REGION: "c", SHM_BYTE_SIZE: 16, SHM_OFFSET: 16}
    tensor = placed("x", "FP32", (4,), **params)
    # Asked again before every copy: an allocation that shrank or went away is never touched.
    ipc.memory[HANDLE] = bytearray(24)
    copies: list[object] = []
    ipc.to_host = lambda *args: copies.append(args)  # type: ignore[method-assign]
    ipc.from_host = lambda *args: copies.append(args)  # type: ignore[method-assign]
    for on_device in (True, False):
        with pytest.raises(
            InvalidArgumentError, match="past the end of the CUDA allocation of 24 bytes"
        ):
            registry.read(tensor, on_device=on_device)
    out = Tensor("y", "FP32", (4,), np.zeros(4, np.float32))
    with pytest.raises(InvalidArgumentError, match="region 'c' maps"):
        registry.write(out, params)
    del ipc.memory[HANDLE]
    with pytest.raises(InvalidArgumentError, match="'c' maps no CUDA allocation any more"):
        registry.read(tensor, on_device=True)
    assert copies == []


def test_write_copies_an_output_into_the_region(
    registry: CudaSharedMemoryRegistry, ipc: FakeIpc
) -> None:
    memory = ipc.allocate(HANDLE, 64)
    registry.register("c", HANDLE, 0, 64)
    out = Tensor("y", "INT16", (3,), np.array([1, -2, 3], np.int16))
    result = registry.write(out, {SHM_REGION: "c", SHM_BYTE_SIZE: 8, SHM_OFFSET: 4})
    assert result.parameters == {SHM_REGION: "c", SHM_BYTE_SIZE: 6, SHM_OFFSET: 4}
    assert np.frombuffer(bytes(memory[4:10]), np.int16).tolist() == [1, -2, 3]
    with pytest.raises(InvalidArgumentError, match="needs 6 bytes but its shared memory byte"):
        registry.write(out, {SHM_REGION: "c", SHM_BYTE_SIZE: 4})


def test_a_failing_copy_is_an_internal_error(
    registry: CudaSharedMemoryRegistry, ipc: FakeIpc
) -> None:
    def fail(*args: object) -> None:
        raise CudaCallError("cudaMemcpy failed: cudaErrorIllegalAddress")

    ipc.allocate(HANDLE, 64)
    registry.register("c", HANDLE, 0, 64)
    ipc.to_host = fail  # type: ignore[method-assign,assignment]
    with pytest.raises(InternalError, match="cannot read region 'c': cudaMemcpy failed"):
        registry.read(
            placed("x", "FP32", (1,), **{SHM_REGION: "c", SHM_BYTE_SIZE: 4}), on_device=False
        )


def test_without_a_gpu_registration_says_why() -> None:
    registry = CudaSharedMemoryRegistry(enabled=True)
    with pytest.raises(UnsupportedError, match="CUDA shared memory needs"):
        registry.register("c", HANDLE, 0, 64)
    assert registry.status() == []  # perf_analyzer asks before it registers anything
    registry.unregister()


def test_cuda_runtime_without_bindings(monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "cuda.bindings.runtime", None)
    with pytest.raises(UnsupportedError, match=r"pip install 'infermux\[gpu\]'"):
        CudaRuntime()


def test_device_inputs_ride_beside_host_inputs(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    model_dir.mkdir()
    (model_dir / "config.pbtxt").write_text(
        'name: "m"\nbackend: "python"\nmax_batch_size: 8\n'
        'input [ { name: "a", data_type: TYPE_FP32, dims: [ 4 ] },'
        ' { name: "b", data_type: TYPE_FP32, dims: [ 2 ], reshape: { shape: [ 1, 2 ] } } ]\n'
        'output [ { name: "y", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
    )
    config = load_model_config(model_dir)

    def request(rows: int, pointer: int) -> InferRequest:
        return InferRequest(
            "m",
            "",
            [
                Tensor("a", "FP32", (rows, 4), np.zeros((rows, 4), np.float32)),
                Tensor("b", "FP32", (rows, 2), np.empty(0, np.float32)),
            ],
            [RequestedOutput("y")],
        )

    first = to_model_request(
        config, request(2, 0), {"b": DeviceArray(0x1000, (2, 2), np.dtype(np.float32), 0)}
    )
    assert first.batch_size == 2
    assert set(first.inputs) == {"a"}
    assert first.device_inputs["b"].shape == (2, 1, 2)  # reshaped as the config says
    second = to_model_request(
        config, request(3, 0), {"b": DeviceArray(0x2000, (3, 2), np.dtype(np.float32), 0)}
    )
    assert compatible(first, second)
    assert stack([first, second])["a"].shape == (5, 4)
    parts = device_parts([first, second])["b"]
    assert [(p.pointer, p.shape) for p in parts] == [(0x1000, (2, 1, 2)), (0x2000, (3, 1, 2))]
    host_b = to_model_request(
        config,
        InferRequest(
            "m",
            "",
            [
                Tensor("a", "FP32", (1, 4), np.zeros((1, 4), np.float32)),
                Tensor("b", "FP32", (1, 2), np.zeros((1, 2), np.float32)),
            ],
            [],
        ),
    )
    assert not compatible(first, host_b)  # one input gathered from two kinds of memory


def test_rows_of_a_device_array() -> None:
    array = DeviceArray(0x1000, (4, 3), np.dtype(np.int16), 0)
    part = array.rows(1, 3)
    assert (part.pointer, part.shape) == (0x1000 + 6, (2, 3))
    assert part.nbytes == 12
    with pytest.raises(ValueError, match="cannot reshape"):
        array.reshape((5,))


@pytest.fixture
async def plane(tmp_path: Path, ipc: FakeIpc) -> AsyncIterator[DataPlane]:
    write_model(tmp_path, "ident", datatype="FP32", dims="[ 4 ]")
    repository = ModelRepository([tmp_path], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(
        repository,
        version="1",
        shared_memory=SharedMemoryRegistry(enabled=True),
        cuda_shared_memory=CudaSharedMemoryRegistry(enabled=True, ipc=lambda: ipc),
    )
    yield plane
    plane.close()
    await repository.close()


async def test_a_python_model_reads_and_answers_through_cuda_regions(
    plane: DataPlane, ipc: FakeIpc
) -> None:
    memory = ipc.allocate(HANDLE, 64)
    memory[0:16] = np.array([1, 2, 3, 4], np.float32).tobytes()
    await plane.cuda_shm_register("in", HANDLE, 0, 64)
    other = bytes(reversed(HANDLE))
    out = ipc.allocate(other, 16)
    await plane.cuda_shm_register("out", other, 0, 16)
    response = await plane.infer(
        InferRequest(
            "ident",
            "",
            [placed("INPUT0", "FP32", (1, 4), **{SHM_REGION: "in", SHM_BYTE_SIZE: 16})],
            [RequestedOutput("OUTPUT0", {SHM_REGION: "out", SHM_BYTE_SIZE: 16})],
        )
    )
    (output,) = response.outputs
    assert output.parameters[SHM_REGION] == "out"
    assert np.frombuffer(bytes(out), np.float32).tolist() == [1, 2, 3, 4]


async def test_system_and_cuda_regions_share_one_namespace(plane: DataPlane, ipc: FakeIpc) -> None:
    from multiprocessing import shared_memory

    ipc.allocate(HANDLE, 64)
    await plane.cuda_shm_register("r", HANDLE, 0, 64)
    block = shared_memory.SharedMemory(create=True, size=64)
    try:
        with pytest.raises(InfermuxError, match="'r' is already registered") as exc:
            await plane.shm_register("r", block.name, 0, 64)
        assert exc.value.code == ErrorCode.ALREADY_EXISTS
        await plane.shm_register("s", block.name, 0, 64)
        with pytest.raises(InfermuxError, match="'s' is already registered"):
            await plane.cuda_shm_register("s", HANDLE, 0, 64)
        await plane.shm_unregister()
    finally:
        block.close()
        block.unlink()
