"""The front-end process's data plane against the executor's channel server, in one process.

Both ends of a real channel (shared-memory rings and arenas, FIFO doorbells) run on this test's
event loop, so every frame and tensor byte takes the path it takes between processes; the
answers are compared with the in-process data plane's.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.errors import ErrorCode, InfermuxError
from infermux.ipc import Channel
from infermux.repository import ControlMode, ModelRepository
from infermux.settings import builtin_repository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_REGION,
    InferRequest,
    Parameters,
    RequestedOutput,
    ServerMetadata,
    Tensor,
)

METADATA = ServerMetadata("infermux", "test", ("statistics",))


class Pair:
    def __init__(self, plane: DataPlane, remote: RemoteDataPlane, server: ChannelServer) -> None:
        self.plane, self.remote, self.server = plane, remote, server


@pytest.fixture
def arena_bytes() -> int:
    return 1024 * 1024


@pytest.fixture
async def pair(tmp_path: Path, arena_bytes: int) -> AsyncIterator[Pair]:
    repository = ModelRepository(
        [builtin_repository()], BackendRegistry(), control_mode=ControlMode.NONE
    )
    await repository.start()
    plane = DataPlane(repository, version="test", shared_memory=SharedMemoryRegistry(enabled=True))
    channel = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=arena_bytes)
    server = ChannelServer(plane)
    server.attach(channel.spec)
    remote = RemoteDataPlane(METADATA)
    remote.attach(channel.spec)
    yield Pair(plane, remote, server)
    remote.detach("test over")
    await server.close()
    channel.close()
    plane.close()
    await repository.close()


def simple_request(a: np.ndarray, b: np.ndarray) -> InferRequest:
    return InferRequest(
        "simple",
        "",
        [Tensor("INPUT0", "INT32", a.shape, a), Tensor("INPUT1", "INT32", b.shape, b)],
        id="r1",
        parameters={"p": 1},
    )


async def test_answers_are_those_of_the_in_process_plane(pair: Pair) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    b = np.full((1, 16), 3, dtype=np.int32)
    local = await pair.plane.infer(simple_request(a, b))
    remote = await pair.remote.infer(simple_request(a, b))
    assert (remote.model_name, remote.model_version, remote.id) == ("simple", "1", "r1")
    assert [o.name for o in remote.outputs] == [o.name for o in local.outputs]
    for mine, theirs in zip(remote.outputs, local.outputs, strict=True):
        assert (mine.datatype, mine.shape) == (theirs.datatype, theirs.shape)
        np.testing.assert_array_equal(mine.data, theirs.data)


async def test_bytes_tensors_cross_intact(pair: Pair) -> None:
    data = np.array([[str(i).encode() for i in range(16)]], dtype=np.object_)
    request = InferRequest(
        "simple_string",
        "",
        [Tensor("INPUT0", "BYTES", (1, 16), data), Tensor("INPUT1", "BYTES", (1, 16), data)],
        [RequestedOutput("OUTPUT0")],
    )
    response = await pair.remote.infer(request)
    (output,) = response.outputs
    assert output.data.reshape(-1).tolist() == [str(2 * i).encode() for i in range(16)]


async def test_many_concurrent_requests_all_answered_and_arena_reclaimed(pair: Pair) -> None:
    import asyncio

    async def one(i: int) -> None:
        a = np.full((1, 16), i, dtype=np.int32)
        response = await pair.remote.infer(simple_request(a, a))
        assert response.outputs[0].data.tolist() == [[2 * i] * 16]

    # 1 MiB arenas and 64 KiB rings: 400 requests in flight wrap both several times.
    await asyncio.gather(*(one(i) for i in range(400)))
    await asyncio.sleep(0.01)  # the last Release frame is sent on the next iteration
    link = pair.remote._executors[0]._link  # the one executor's channel
    assert link is not None
    assert link.endpoint.arena.used == 0


async def test_errors_keep_their_code(pair: Pair) -> None:
    with pytest.raises(InfermuxError) as exc:
        await pair.remote.infer(InferRequest("nope", "", []))
    assert exc.value.code is ErrorCode.NOT_FOUND
    bad = np.zeros((1, 3), dtype=np.int32)
    with pytest.raises(InfermuxError, match="INPUT0") as exc:
        await pair.remote.infer(simple_request(bad, bad))
    assert exc.value.code is ErrorCode.INVALID_ARG


async def test_other_operations_match(pair: Pair) -> None:
    p, r = pair.plane, pair.remote
    assert await r.ready() == await p.ready()
    assert await r.model_ready("simple")
    assert not await r.model_ready("simple", "9")
    assert await r.model_metadata("simple") == await p.model_metadata("simple")
    assert await r.model_config("simple") == await p.model_config("simple")
    assert (await r.model_config("simple")).to_json_dict() == (
        await p.model_config("simple")
    ).to_json_dict()
    assert await r.repository_index() == await p.repository_index()
    a = np.ones((1, 16), dtype=np.int32)
    await r.infer(simple_request(a, a))
    assert await r.model_statistics("simple") == await p.model_statistics("simple")
    assert r.server_metadata() == METADATA


async def test_client_shared_memory_is_read_by_the_executor(pair: Pair) -> None:
    region = shared_memory.SharedMemory(create=True, size=128)
    try:
        np.ndarray((32,), np.int32, region.buf)[:] = np.arange(32, dtype=np.int32)
        await pair.remote.shm_register("in", region.name, 0, 128)
        assert [s.name for s in await pair.remote.shm_status()] == ["in"]
        placed: Parameters = {SHM_REGION: "in", SHM_BYTE_SIZE: 64}
        empty = np.empty(0, np.int32)
        request = InferRequest(
            "simple",
            "",
            [
                Tensor("INPUT0", "INT32", (1, 16), empty, dict(placed)),
                Tensor("INPUT1", "INT32", (1, 16), empty, dict(placed)),
            ],
            # The output goes back into the region at offset 0, over the inputs.
            [RequestedOutput("OUTPUT0", {SHM_REGION: "in", SHM_BYTE_SIZE: 64})],
        )
        response = await pair.remote.infer(request)
        (output,) = response.outputs
        assert output.parameters[SHM_REGION] == "in"
        assert np.ndarray((16,), np.int32, region.buf).tolist() == [2 * i for i in range(16)]
        await pair.remote.shm_unregister()
    finally:
        region.close()
        region.unlink()


async def test_detached_front_end_answers_unavailable(pair: Pair) -> None:
    pair.remote.detach("the executor is restarting")
    assert not await pair.remote.ready()
    assert not await pair.remote.model_ready("simple")
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InfermuxError, match="the executor is restarting") as exc:
        await pair.remote.infer(simple_request(a, a))
    assert exc.value.code is ErrorCode.UNAVAILABLE


async def test_a_channel_that_cannot_be_opened_leaves_the_front_end_detached_not_broken(
    pair: Pair, tmp_path: Path
) -> None:
    # Regression: attach raised when a channel's files could not be opened, which ended the
    # front end's loop that follows the supervisor (it would never hear of the next channel).
    spare = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=64 * 1024)
    spec = spare.spec
    spare.close()  # its files are removed: opening them fails
    pair.remote.attach(spec)
    assert not pair.remote.attached
    assert not await pair.remote.ready()
    a = np.ones((1, 16), dtype=np.int32)
    with pytest.raises(InfermuxError, match="cannot attach to the executor's channel") as exc:
        await pair.remote.infer(simple_request(a, a))
    assert exc.value.code is ErrorCode.UNAVAILABLE
    good = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=1024 * 1024)
    pair.server.attach(good.spec)
    pair.remote.attach(good.spec)  # the next channel works
    try:
        assert (await pair.remote.infer(simple_request(a, a))).outputs
    finally:
        pair.remote.detach("test over")
        good.close()


async def test_requests_in_flight_fail_unavailable_when_the_executor_goes(pair: Pair) -> None:
    import asyncio

    a = np.ones((1, 16), dtype=np.int32)
    # Detach the server side first: the request is written but never answered.
    await pair.server.close()
    task = asyncio.ensure_future(pair.remote.infer(simple_request(a, a)))
    await asyncio.sleep(0.01)
    assert not task.done()
    pair.remote.detach("the executor exited")
    with pytest.raises(InfermuxError, match="the executor exited"):
        await task


async def test_too_large_input_is_refused_naming_the_setting(pair: Pair) -> None:
    big = np.zeros((1, 400_000), dtype=np.int32)  # 1.6 MB > the 1 MiB arena
    with pytest.raises(InfermuxError, match="ipc-arena-mb") as exc:
        await pair.remote.infer(simple_request(big, big))
    assert exc.value.code is ErrorCode.INVALID_ARG


@pytest.mark.parametrize("arena_bytes", [4096])
async def test_full_arenas_make_requests_wait_not_fail(pair: Pair) -> None:
    """4 KiB arenas hold 64 blocks: 200 requests in flight (2 inputs and 2 outputs each) must
    wait for space on both sides, the executor finding the front end's unrung releases itself."""
    import asyncio

    async def one(i: int) -> None:
        a = np.full((1, 16), i, dtype=np.int32)
        response = await pair.remote.infer(simple_request(a, a))
        assert response.outputs[0].data.tolist() == [[2 * i] * 16]

    await asyncio.wait_for(asyncio.gather(*(one(i) for i in range(200))), 60)
