"""Giving a request up across the channel: the front end's cancellation and the request's
deadline reach the executor's channel server, which takes a queued request out of the queue
(the model never runs it), lets one in a running batch finish without an answer, and frees
every arena block either way.

Both ends of a real channel run on this test's event loop, over a one-instance model that
sleeps as long as its input says and runs one request at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.errors import ErrorCode, InfermuxError
from infermux.ipc import Arena, Channel
from infermux.ipc.wire import Cancel, encode
from infermux.repository import ControlMode, ModelRepository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import InferRequest, ServerMetadata, Tensor
from tests.support import SLOW_MODEL, write_model

METADATA = ServerMetadata("infermux", "test", ())


class Ends:
    def __init__(self, plane: DataPlane, remote: RemoteDataPlane, server: ChannelServer) -> None:
        self.plane, self.remote, self.server = plane, remote, server

    @property
    def front_arena(self) -> Arena:
        link = self.remote._executors[0]._link
        assert link is not None
        return link.endpoint.arena

    @property
    def executor_arena(self) -> Arena:
        (client,) = self.server._clients.values()
        return client.link.endpoint.arena

    async def executions(self) -> int:
        (stats,) = await self.plane.model_statistics("slow")
        return stats.execution_count

    async def idle(self) -> None:
        """Until nothing is in flight and both arenas are empty again. Release frames wait for
        the executor's next wake-up: a readiness call gives it one."""
        deadline = time.monotonic() + 10
        while self.front_arena.used or self.executor_arena.used or self.server_busy():
            assert time.monotonic() < deadline, "blocks or requests left behind"
            await asyncio.sleep(0.01)
            await self.remote.ready()

    def server_busy(self) -> bool:
        return any(c.tasks for c in self.server._clients.values())


@pytest.fixture
async def ends(tmp_path: Path) -> AsyncIterator[Ends]:
    write_model(tmp_path / "repo", "slow", source=SLOW_MODEL, max_batch_size=0)
    repository = ModelRepository(
        [tmp_path / "repo"], BackendRegistry(), control_mode=ControlMode.NONE
    )
    await repository.start()
    plane = DataPlane(repository, version="test")
    channel = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=1024 * 1024)
    server = ChannelServer(plane)
    server.attach(channel.spec)
    remote = RemoteDataPlane(METADATA, ready_timeout_s=0.2)
    remote.attach(channel.spec)
    yield Ends(plane, remote, server)
    remote.detach("test over")
    await server.close()
    channel.close()
    plane.close()
    await repository.close()


def sleeping(seconds: float, deadline_ns: int = 0) -> InferRequest:
    data = np.full((1,), seconds, dtype=np.float32)
    return InferRequest("slow", "", [Tensor("INPUT0", "FP32", (1,), data)], deadline_ns=deadline_ns)


async def test_a_cancelled_queued_request_leaves_the_queue_and_never_runs(ends: Ends) -> None:
    running = asyncio.ensure_future(ends.remote.infer(sleeping(0.3)))
    await asyncio.sleep(0.1)
    queued = [asyncio.ensure_future(ends.remote.infer(sleeping(0.3))) for _ in range(5)]
    await asyncio.sleep(0.05)
    started = time.monotonic()
    for task in queued:
        task.cancel()
    await running
    await asyncio.gather(*queued, return_exceptions=True)
    await ends.idle()
    # Five more sleeps would take 1.5 s: they left the queue instead.
    assert time.monotonic() - started < 1.2
    assert await ends.executions() == 1
    assert (await ends.remote.infer(sleeping(0))).outputs[0].data.tolist() == [0]


async def test_a_cancelled_running_request_keeps_its_inputs_until_its_batch_ends(
    ends: Ends,
) -> None:
    task = asyncio.ensure_future(ends.remote.infer(sleeping(0.4)))
    await asyncio.sleep(0.15)  # in the model now
    task.cancel()
    await asyncio.sleep(0.05)
    # The model may still read its input: the front end must not reuse that block yet.
    assert ends.front_arena.used > 0
    await ends.idle()  # the batch ended: the inputs are freed, the outputs never placed
    assert await ends.executions() == 1
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_a_request_past_its_deadline_is_dropped_by_the_executor(ends: Ends) -> None:
    blocker = asyncio.ensure_future(ends.remote.infer(sleeping(0.5)))
    await asyncio.sleep(0.1)
    # The front end does not enforce the deadline itself (the transport does): the executor
    # gives the queued request up when its deadline passes, and says so.
    soon = time.monotonic_ns() + 100_000_000
    with pytest.raises(InfermuxError, match="gave up") as late:
        await ends.remote.infer(sleeping(0.5, soon))
    assert late.value.code is ErrorCode.CANCELLED
    # Already past when it arrives: not started at all.
    with pytest.raises(InfermuxError, match="deadline passed") as past:
        await ends.remote.infer(sleeping(0.5, time.monotonic_ns() - 1))
    assert past.value.code is ErrorCode.CANCELLED
    await blocker
    await ends.idle()
    assert await ends.executions() == 1


async def test_a_cancel_for_a_request_already_answered_is_ignored(ends: Ends) -> None:
    response = await ends.remote.infer(sleeping(0))
    link = ends.remote._executors[0]._link
    assert link is not None
    # Late cancels (the answer crossed them) and cancels naming no request change nothing.
    for seq in (1, 999):
        link.send(encode(Cancel(seq)))
    await asyncio.sleep(0.05)
    assert response.outputs[0].data.tolist() == [0]
    assert (await ends.remote.infer(sleeping(0))).outputs[0].data.tolist() == [0]
    await ends.idle()


async def test_an_answer_arriving_as_the_client_gives_up_frees_its_blocks(ends: Ends) -> None:
    # Many requests cancelled at every stage: before sending, queued, running, answered.
    tasks = [asyncio.ensure_future(ends.remote.infer(sleeping(0.01))) for _ in range(40)]
    for i, task in enumerate(tasks):
        await asyncio.sleep(0.002 * (i % 7))
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)
    await ends.idle()
    assert (await ends.remote.infer(sleeping(0))).outputs[0].data.tolist() == [0]


async def test_readiness_answers_not_ready_when_the_executor_does_not_answer(ends: Ends) -> None:
    assert await ends.remote.ready()
    await ends.server.close()  # the executor side stops reading: nothing is answered now
    started = time.monotonic()
    answers = await asyncio.gather(*(ends.remote.ready() for _ in range(20)))
    assert answers == [False] * 20
    assert not await ends.remote.model_ready("slow")
    assert time.monotonic() - started < 5  # bounded (0.2 s here), not waiting forever
    # Probes share the call in flight: one readiness frame waits, not one per probe.
    assert len(ends.remote._executors[0]._pending) == 2
