"""A front end holds a micro-batch while the executor is busy with its work; when an instance
falls free with less than a full batch queued, the executor asks every front end that holds one
to send it now, and only those (``transport/wanted.py``, ``scheduling/demand.py``).

Two front ends share one executor over real channels on this test's event loop."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.ipc import Channel
from infermux.repository import ControlMode, ModelRepository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.link import Link
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.transport.wanted import WANTED
from infermux.types import InferRequest, ServerMetadata, Tensor
from tests.support import SLOW_MODEL, write_model
from tests.unit.transport.test_grouping import write_plus_one


async def _attached(work: Path, server: ChannelServer) -> RemoteDataPlane:
    channel = Channel(work, ring_bytes=64 * 1024, arena_bytes=1024 * 1024)
    server.attach(channel.spec)
    remote = RemoteDataPlane(ServerMetadata("infermux", "test", ()), ready_timeout_s=1.0)
    remote.attach(channel.spec)
    for _ in range(200):
        if await remote.ready():
            return remote
        await asyncio.sleep(0.01)
    raise AssertionError("the channel did not come up")


@pytest.fixture
async def fronts(tmp_path: Path) -> AsyncIterator[tuple[RemoteDataPlane, RemoteDataPlane]]:
    repo = tmp_path / "repo"
    write_plus_one(repo)
    write_model(repo, "slow", source=SLOW_MODEL, max_batch_size=0)
    repository = ModelRepository([repo], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(repository, version="test")
    server = ChannelServer(plane)
    for side in ("a", "b"):
        (tmp_path / side).mkdir()
    a = await _attached(tmp_path / "a", server)
    b = await _attached(tmp_path / "b", server)
    yield a, b
    for remote in (a, b):
        remote.detach("test over")
    await server.close()
    plane.close()
    await repository.close()


def plus_one(value: float) -> InferRequest:
    data = np.full((1, 4), value, dtype=np.float32)
    return InferRequest("plus_one", "", [Tensor("INPUT__0", "FP32", data.shape, data)])


def slow(seconds: float) -> InferRequest:
    data = np.full((1,), seconds, dtype=np.float32)
    # A parameter of its own: it travels alone, not in a micro-batch.
    return InferRequest(
        "slow", "", [Tensor("INPUT0", "FP32", data.shape, data)], parameters={"tag": 1}
    )


async def test_a_free_instance_asks_only_the_front_ends_holding_a_micro_batch(
    fronts: tuple[RemoteDataPlane, RemoteDataPlane], monkeypatch: pytest.MonkeyPatch
) -> None:
    a, b = fronts
    # Only an answer to this front end or the executor's word releases a held micro-batch.
    monkeypatch.setattr("infermux.transport.micro_batcher.HOLD_SECONDS", 30.0)
    asked: list[str] = []  # the channels a Wanted frame went to
    send = Link.send

    def recorded(self: Link, frame: bytes, *, wake: bool = True) -> None:
        if frame == WANTED:
            asked.append(self.id)
        send(self, frame, wake=wake)

    monkeypatch.setattr(Link, "send", recorded)
    busy = [asyncio.ensure_future(a.infer(slow(2.0))) for _ in range(2)]
    await asyncio.sleep(0.1)
    assert a._executors[0].in_flight() == 2  # a's work keeps the executor busy for 4 s
    held = asyncio.ensure_future(a.infer(plus_one(1.0)))
    await asyncio.sleep(0.1)
    assert not held.done()  # held for a place at the executor
    # b's request runs on plus_one's instance and ends: the instance is free, nothing queued.
    answer = await b.infer(plus_one(5.0))
    assert answer.outputs[0].data.tolist() == [[6.0] * 4]
    answer = await asyncio.wait_for(held, 1.0)  # long before a's first slow answer (2 s)
    assert answer.outputs[0].data.tolist() == [[2.0] * 4]
    a_id, b_id = (remote._executors[0].require().id for remote in (a, b))
    assert a_id in asked
    assert b_id not in asked  # b held nothing: its loop is not woken for it
    for task in busy:
        task.cancel()
    await asyncio.gather(*busy, return_exceptions=True)
