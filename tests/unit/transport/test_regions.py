"""A front end's copies of the executor's system shared-memory regions (transport/regions.py):
read where the request arrives, and never once the executor has let a region go."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infermux.errors import ErrorCode, InfermuxError, NotFoundError
from infermux.transport import regions as regions_module
from infermux.transport.regions import RegionCopies, in_shared_memory
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
    SharedMemoryRegion,
    Tensor,
)
from tests.unit.transport.ends import connected
from tests.unit.transport.test_grouping import Ends, write_plus_one


def _segment(values: float) -> shared_memory.SharedMemory:
    block = shared_memory.SharedMemory(name=f"imx_{uuid.uuid4().hex[:8]}", create=True, size=4096)
    data = np.ndarray((1024,), np.float32, buffer=block.buf)
    data[:] = values
    del data  # no view may outlive close()
    return block


@pytest.fixture
def segments() -> Iterator[list[shared_memory.SharedMemory]]:
    """Two 4 KiB objects: one filled with 1.0, one with 7.0."""
    made = [_segment(1.0), _segment(7.0)]
    yield made
    for block in made:
        block.close()
        block.unlink()


@pytest.fixture
async def ends(tmp_path: Path) -> AsyncIterator[Ends]:
    write_plus_one(tmp_path / "repo")
    async with connected(tmp_path / "repo", tmp_path) as (plane, remote):
        yield Ends(plane, remote)


def from_region(region: str, offset: int = 0) -> InferRequest:
    where: Parameters = {SHM_REGION: region, SHM_BYTE_SIZE: 16, SHM_OFFSET: offset}
    empty = np.empty(0, np.float32)
    return InferRequest("plus_one", "", [Tensor("INPUT__0", "FP32", (1, 4), empty, where)])


def copies(ends: Ends) -> RegionCopies:
    return ends.executor._regions


async def test_a_region_registered_through_the_front_end_is_read_there(
    ends: Ends, segments: list[shared_memory.SharedMemory]
) -> None:
    await ends.remote.shm_register("in", segments[0].name, 0, 4096)
    assert len(copies(ends)) == 1
    answers = await asyncio.gather(
        *(ends.remote.infer(from_region("in", 16 * i)) for i in range(8))
    )
    assert all(np.asarray(a.outputs[0].data).tolist() == [[2.0] * 4] for a in answers)
    assert ends.apart
    assert not any(k["inputs_apart"] for k in ends.apart)


async def test_an_unregistered_region_is_dropped_by_every_front_end_before_the_answer(
    ends: Ends, segments: list[shared_memory.SharedMemory]
) -> None:
    await ends.remote.shm_register("in", segments[0].name, 0, 4096)
    await ends.remote.infer(from_region("in"))
    # Unregistered in the executor by another path (another front end, a restore): the answer
    # waits for this front end's Forgotten.
    await ends.plane.shm_unregister("in")
    assert len(copies(ends)) == 0
    with pytest.raises(InfermuxError, match="'in' is not registered") as caught:
        await ends.remote.infer(from_region("in"))
    assert caught.value.code is ErrorCode.INVALID_ARG


async def test_a_name_registered_again_reads_its_new_object_not_the_old_copy(
    ends: Ends, segments: list[shared_memory.SharedMemory]
) -> None:
    await ends.remote.shm_register("in", segments[0].name, 0, 4096)
    first = await ends.remote.infer(from_region("in"))
    assert np.asarray(first.outputs[0].data).tolist() == [[2.0] * 4]
    await ends.remote.shm_unregister("in")
    await ends.plane.shm_register("in", segments[1].name, 0, 4096)  # this front end is not told
    again = await ends.remote.infer(from_region("in"))
    assert np.asarray(again.outputs[0].data).tolist() == [[8.0] * 4]


async def test_a_region_registered_elsewhere_is_learnt_on_first_use(
    ends: Ends, segments: list[shared_memory.SharedMemory]
) -> None:
    await ends.plane.shm_register("in", segments[0].name, 0, 4096)
    answer = await ends.remote.infer(from_region("in"))  # read by the executor meanwhile
    assert np.asarray(answer.outputs[0].data).tolist() == [[2.0] * 4]
    for _ in range(100):
        if len(copies(ends)):
            break
        await asyncio.sleep(0.01)
    assert len(copies(ends)) == 1
    await asyncio.gather(*(ends.remote.infer(from_region("in", 16 * i)) for i in range(4)))
    assert ends.apart
    assert not ends.apart[-1]["inputs_apart"]


async def test_outputs_placed_by_the_front_end_land_in_their_regions(
    ends: Ends, segments: list[shared_memory.SharedMemory]
) -> None:
    await ends.remote.shm_register("in", segments[0].name, 0, 2048)
    await ends.remote.shm_register("out", segments[1].name, 2048, 2048)
    request = from_region("in")
    where: Parameters = {SHM_REGION: "out", SHM_BYTE_SIZE: 16, SHM_OFFSET: 32}
    request.outputs = [RequestedOutput("OUTPUT__0", where)]
    (out,) = (await ends.remote.infer(request)).outputs
    assert out.parameters == {SHM_REGION: "out", SHM_BYTE_SIZE: 16, SHM_OFFSET: 32}
    buf = segments[1].buf
    assert buf is not None
    assert np.frombuffer(buf, np.float32)[(2048 + 32) // 4 :][:4].tolist() == [2.0] * 4
    small = from_region("in")
    small.outputs = [RequestedOutput("OUTPUT__0", {**where, SHM_BYTE_SIZE: 8})]
    with pytest.raises(InfermuxError, match="needs 16 bytes") as caught:
        await ends.remote.infer(small)
    assert caught.value.code is ErrorCode.INVALID_ARG


# -- the copies on their own --------------------------------------------------------------------


async def test_an_answer_that_crossed_an_unregistration_is_not_kept(
    segments: list[shared_memory.SharedMemory],
) -> None:
    answer: asyncio.Future[list[SharedMemoryRegion]] = asyncio.get_running_loop().create_future()
    asked: list[str] = []

    async def fetch(name: str) -> list[SharedMemoryRegion]:
        asked.append(name)
        return await answer

    held = RegionCopies(fetch)
    assert held.resolve(from_region("in")) is None  # unknown: asked for, the executor reads it
    await asyncio.sleep(0)
    assert asked == ["in"]
    held.forget("in")  # the executor's Forget came before our answer was used
    answer.set_result([SharedMemoryRegion("in", segments[0].name, 0, 4096)])
    await asyncio.sleep(0)
    assert len(held) == 0
    held.close()


async def test_a_name_the_executor_does_not_have_is_not_asked_for_again_at_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    asked: list[str] = []

    async def fetch(name: str) -> list[SharedMemoryRegion]:
        asked.append(name)
        raise NotFoundError(f"shared memory region '{name}' is not registered")

    held = RegionCopies(fetch)
    for _ in range(3):
        assert held.resolve(from_region("cuda_region")) is None
        await asyncio.sleep(0)
    assert asked == ["cuda_region"]
    monkeypatch.setattr(regions_module, "ABSENT_SECONDS", 0.0)
    held.forget("")  # a forget clears what was absent too
    assert held.resolve(from_region("cuda_region")) is None
    await asyncio.sleep(0)
    assert asked == ["cuda_region"] * 2
    held.close()


def test_only_requests_that_name_shared_memory_are_looked_at() -> None:
    data = np.zeros((1, 4), np.float32)
    plain = InferRequest("m", "", [Tensor("X", "FP32", (1, 4), data)])
    assert not in_shared_memory(plain)
    assert in_shared_memory(from_region("r"))
    out: Any = InferRequest(
        "m", "", plain.inputs, [RequestedOutput("Y", {SHM_REGION: "o", SHM_BYTE_SIZE: 16})]
    )
    assert in_shared_memory(out)


def test_placing_leaves_outputs_without_a_region_as_they_are() -> None:
    async def fetch(name: str) -> list[SharedMemoryRegion]:
        raise NotFoundError(name)

    held = RegionCopies(fetch)
    data = np.ones((1, 4), np.float32)
    response = InferResponse("m", "1", [Tensor("Y", "FP32", (1, 4), data)])
    assert held.place(response, {}).outputs[0].data is data
    held.close()
