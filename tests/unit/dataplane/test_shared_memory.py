from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from multiprocessing import shared_memory

import numpy as np
import pytest

from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.errors import (
    ErrorCode,
    InfermuxError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from infermux.ipc.arena import Block
from infermux.types import SHM_BYTE_SIZE, SHM_OFFSET, SHM_REGION, Tensor


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    block = shared_memory.SharedMemory(name=f"imx_{uuid.uuid4().hex[:8]}", create=True, size=256)
    yield block
    block.close()
    block.unlink()


def shm_tensor(name: str, datatype: str, shape: tuple[int, ...], **params: object) -> Tensor:
    return Tensor(name, datatype, shape, np.empty(0), dict(params))  # type: ignore[arg-type]


def test_disabled_registry_refuses_everything() -> None:
    registry = SharedMemoryRegistry(enabled=False)
    with pytest.raises(UnsupportedError, match="--allow-client-shm"):
        registry.register("r", "/k", 0, 8)
    with pytest.raises(UnsupportedError):
        registry.status()


def test_read_and_write(segment: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", "/" + segment.name, 16, 128)
    data = np.arange(8, dtype=np.float32)
    buf = segment.buf
    assert buf is not None
    buf[16 + 32 : 16 + 64] = data.tobytes()
    tensor = shm_tensor("x", "FP32", (2, 4), **{SHM_REGION: "r", SHM_BYTE_SIZE: 32, SHM_OFFSET: 32})
    array = registry.read(tensor)
    np.testing.assert_array_equal(array, data.reshape(2, 4))
    buf[16 + 32 : 16 + 36] = b"\xff" * 4  # a copy: the client's later writes do not reach it
    assert array[0, 0] == 0
    out = Tensor("y", "INT16", (3,), np.array([1, -2, 3], np.int16))
    placed = registry.write(out, {SHM_REGION: "r", SHM_BYTE_SIZE: 6})
    assert placed.parameters == {SHM_REGION: "r", SHM_BYTE_SIZE: 6}
    assert placed.data.size == 0
    assert np.frombuffer(buf[16:22], np.int16).tolist() == [1, -2, 3]
    assert [r.name for r in registry.status()] == ["r"]
    assert registry.status("r")[0].byte_size == 128
    registry.close()
    assert registry.status() == []


@pytest.mark.parametrize(
    ("name", "key", "offset", "size", "error", "fragment"),
    [
        ("", "/k", 0, 8, InvalidArgumentError, "must not be empty"),
        ("r", "a/b", 0, 8, InvalidArgumentError, "not a valid POSIX shm name"),
        ("r", "/..", 0, 8, InvalidArgumentError, "not a valid POSIX shm name"),
        ("r", "/imx_missing_key", 0, 8, InvalidArgumentError, "unable to open"),
        ("r", "SEG", 200, 100, InvalidArgumentError, "exceeds the 256 bytes"),
        ("r", "SEG", 0, 0, InvalidArgumentError, "byte_size > 0"),
    ],
)
def test_bad_registrations(
    segment: shared_memory.SharedMemory,
    name: str,
    key: str,
    offset: int,
    size: int,
    error: type[Exception],
    fragment: str,
) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    with pytest.raises(error, match=fragment):
        registry.register(name, segment.name if key == "SEG" else key, offset, size)
    assert registry.status() == []


def test_duplicates_and_unknown_names(segment: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", segment.name, 0, 8)  # a key without the leading slash works too
    with pytest.raises(InfermuxError, match="already registered") as info:
        registry.register("r", segment.name, 0, 8)
    assert info.value.code is ErrorCode.ALREADY_EXISTS
    with pytest.raises(NotFoundError):
        registry.unregister("other")
    with pytest.raises(NotFoundError):
        registry.status("other")
    registry.unregister("r")


@pytest.mark.parametrize(
    ("params", "fragment"),
    [
        ({SHM_BYTE_SIZE: 8}, "must name a registered region"),
        ({SHM_REGION: "ghost", SHM_BYTE_SIZE: 8}, "'ghost' is not registered"),
        ({SHM_REGION: "r", SHM_BYTE_SIZE: -1}, "must be an integer >= 0"),
        ({SHM_REGION: "r", SHM_BYTE_SIZE: True}, "must be an integer >= 0"),
        ({SHM_REGION: "r", SHM_BYTE_SIZE: 8, SHM_OFFSET: 60}, "outside region 'r'"),
        ({SHM_REGION: "r", SHM_BYTE_SIZE: 12}, "needs 8 bytes"),
    ],
)
def test_bad_tensor_references(
    segment: shared_memory.SharedMemory, params: dict[str, object], fragment: str
) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", segment.name, 0, 64)
    with pytest.raises(InvalidArgumentError, match=fragment):
        registry.read(shm_tensor("x", "INT32", (2,), **params))
    registry.close()


def test_output_too_big_for_its_region(segment: shared_memory.SharedMemory) -> None:
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", segment.name, 0, 64)
    tensor = Tensor("y", "BYTES", (1,), np.array([b"x" * 10], dtype=np.object_))
    with pytest.raises(InvalidArgumentError, match="needs 14 bytes"):
        registry.write(tensor, {SHM_REGION: "r", SHM_BYTE_SIZE: 8})
    registry.close()


def test_a_truncated_object_is_refused_naming_the_region_never_faulted(
    segment: shared_memory.SharedMemory,
) -> None:
    """A client may shrink its object after registering it; a mapped region would then raise
    SIGBUS inside the server. Reads and writes check the object's size first."""
    other = shared_memory.SharedMemory(name=f"imx_{uuid.uuid4().hex[:8]}", create=True, size=64)
    registry = SharedMemoryRegistry(enabled=True)
    try:
        registry.register("r", segment.name, 16, 128)
        registry.register("o", other.name, 0, 64)
        path = f"/dev/shm/{segment.name}"
        tensor = shm_tensor("x", "INT32", (4,), **{SHM_REGION: "r", SHM_BYTE_SIZE: 16})
        out = Tensor("y", "INT32", (4,), np.arange(4, dtype=np.int32))
        for size in (0, 31):  # nothing left, and one byte short of the slice's end
            os.truncate(path, size)
            with pytest.raises(InvalidArgumentError) as info:
                registry.read(tensor)
            assert str(info.value).startswith(
                f"input 'x': shared memory region 'r' was truncated to {size} bytes; it needs 32"
            )
            with pytest.raises(InvalidArgumentError, match="region 'r' was truncated"):
                registry.write(out, {SHM_REGION: "r", SHM_BYTE_SIZE: 16})
        # Every other region is untouched, and this one works again once its size is back.
        placed = registry.write(out, {SHM_REGION: "o", SHM_BYTE_SIZE: 16})
        assert placed.parameters[SHM_BYTE_SIZE] == 16
        os.truncate(path, 256)
        registry.write(out, {SHM_REGION: "r", SHM_BYTE_SIZE: 16})
        np.testing.assert_array_equal(registry.read(tensor), out.data)
        assert [r.name for r in registry.status()] == ["r", "o"]
    finally:
        registry.close()
        other.close()
        other.unlink()


def test_a_read_cut_short_by_a_truncation_is_refused(
    segment: shared_memory.SharedMemory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Truncated between the size check and the copy: the read comes back short, and is refused
    the same way (a mapping would have faulted here, whatever had been checked before)."""
    registry = SharedMemoryRegistry(enabled=True)
    registry.register("r", segment.name, 0, 64)
    real = os.preadv

    def truncating(fd: int, buffers: list[memoryview], offset: int) -> int:
        os.ftruncate(fd, 8)
        return real(fd, buffers, offset)

    monkeypatch.setattr(os, "preadv", truncating)
    tensor = shm_tensor("x", "INT32", (4,), **{SHM_REGION: "r", SHM_BYTE_SIZE: 16, SHM_OFFSET: 4})
    with pytest.raises(InvalidArgumentError, match="'r' was truncated to 8 bytes; it needs 20"):
        registry.read(tensor)
    registry.close()


def ints(segment: shared_memory.SharedMemory) -> np.ndarray:
    buf = segment.buf
    assert buf is not None
    return np.frombuffer(buf, np.int32)


def test_reads_go_into_reused_staging_blocks_which_go_back_after_the_request(
    segment: shared_memory.SharedMemory,
) -> None:
    registry = SharedMemoryRegistry(enabled=True, staging_bytes=4096)
    registry.register("r", segment.name, 0, 256)
    ints(segment)[:8] = np.arange(8, dtype=np.int32)
    tensor = shm_tensor("x", "INT32", (8,), **{SHM_REGION: "r", SHM_BYTE_SIZE: 32})
    held: list[Block] = []
    first = registry.read(tensor, held)
    assert first.tolist() == list(range(8))
    assert len(held) == 1
    address = first.__array_interface__["data"][0]
    registry.release(held)
    assert held == []
    again = registry.read(tensor, held)
    # The ring starts over once empty: the same pages, no fresh memory per request.
    assert again.__array_interface__["data"][0] == address
    registry.release(held)
    # Without a list to hold the block, or with no staging, the read is into fresh memory.
    assert registry.read(tensor).tolist() == list(range(8))
    unstaged = SharedMemoryRegistry(enabled=True, staging_bytes=0)
    unstaged.register("r", segment.name, 0, 256)
    assert unstaged.read(tensor, held).tolist() == list(range(8))
    assert held == []
    registry.close()
    unstaged.close()


def test_an_input_too_large_for_the_free_staging_is_read_into_fresh_memory(
    segment: shared_memory.SharedMemory,
) -> None:
    registry = SharedMemoryRegistry(enabled=True, staging_bytes=128)
    registry.register("r", segment.name, 0, 256)
    tensor = shm_tensor("x", "INT32", (64,), **{SHM_REGION: "r", SHM_BYTE_SIZE: 256})
    held: list[Block] = []
    assert registry.read(tensor, held).shape == (64,)
    assert held == []
    registry.close()


def test_outputs_that_view_a_staging_block_are_copied_out_before_it_goes_back(
    segment: shared_memory.SharedMemory,
) -> None:
    registry = SharedMemoryRegistry(enabled=True, staging_bytes=4096)
    registry.register("r", segment.name, 0, 256)
    ints(segment)[:8] = 7
    tensor = shm_tensor("x", "INT32", (8,), **{SHM_REGION: "r", SHM_BYTE_SIZE: 32})
    held: list[Block] = []
    data = registry.read(tensor, held)
    other = np.zeros(8, np.int32)
    echoed = Tensor("y", "INT32", (8,), data)  # an identity model answers with its input
    kept = Tensor("z", "INT32", (8,), other)
    out = registry.unstaged([echoed, kept])
    assert out[1].data is other  # not in the staging arena: untouched
    assert not np.shares_memory(out[0].data, data)
    registry.release(held)
    ints(segment)[:8] = 1
    registry.read(tensor, held)  # a later request overwrites the block
    assert out[0].data.tolist() == [7] * 8
    registry.close()
