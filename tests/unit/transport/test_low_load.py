"""At the lowest load each side of a channel polls for what it waits for instead of sleeping
until a doorbell: the front end for its only request's answer, the executor, once its only
running request ended, for the next request. Under load neither starts a poll for that: the
executor publishes what else it runs, and a front end holding one request of several the
executor runs does not poll."""

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
from infermux.types import InferRequest, ServerMetadata, Tensor
from tests.support import SLOW_MODEL, write_model

# Budgets told apart in the recorded polls: each side's own.
FRONT_A, FRONT_B, EXECUTOR = 0.002, 0.0021, 0.003


async def _attached(tmp_path: Path, server: ChannelServer, poll: float) -> RemoteDataPlane:
    channel = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=1024 * 1024)
    server.attach(channel.spec)
    remote = RemoteDataPlane(
        ServerMetadata("infermux", "test", ()), ready_timeout_s=1.0, poll_seconds=poll
    )
    remote.attach(channel.spec)
    for _ in range(200):
        if await remote.ready():
            return remote
        await asyncio.sleep(0.01)
    raise AssertionError("the channel did not come up")


@pytest.fixture
async def fronts(tmp_path: Path) -> AsyncIterator[tuple[RemoteDataPlane, RemoteDataPlane]]:
    repo = tmp_path / "repo"
    write_model(repo, "identity", extra="dynamic_batching { max_queue_delay_microseconds: 0 }")
    write_model(repo, "slow", source=SLOW_MODEL, max_batch_size=0)
    repository = ModelRepository([repo], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(repository, version="test")
    server = ChannelServer(plane, poll_seconds=EXECUTOR)
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    a = await _attached(tmp_path / "a", server, FRONT_A)
    b = await _attached(tmp_path / "b", server, FRONT_B)
    yield a, b
    for remote in (a, b):
        remote.detach("test over")
    await server.close()
    plane.close()
    await repository.close()


@pytest.fixture
def polls(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The budgets of the polls started: each front end's answer polls and the executor's."""
    started: list[float] = []
    original = Link.poll_inbox

    def recorded(self: Link, seconds: float) -> None:
        started.append(seconds)
        original(self, seconds)

    monkeypatch.setattr(Link, "poll_inbox", recorded)
    return started


def request(value: float, model: str = "identity") -> InferRequest:
    data = np.array([[value]] if model == "identity" else [value], np.float32)
    return InferRequest(model, "", [Tensor("INPUT0", "FP32", data.shape, data)])


def value(response: object) -> float:
    return float(np.asarray(response.outputs[0].data).ravel()[0])  # type: ignore[attr-defined]


async def test_one_request_at_a_time_polls_on_both_sides(
    fronts: tuple[RemoteDataPlane, RemoteDataPlane], polls: list[float]
) -> None:
    a, _ = fronts
    for i in range(5):
        assert value(await a.infer(request(i))) == i
        await asyncio.sleep(0.005)  # the executor's task has ended meanwhile
    assert polls.count(FRONT_A) == 5
    # One executor poll per channel after each request.
    assert polls.count(EXECUTOR) == 2 * 5


async def test_requests_running_together_start_no_poll_for_the_next(
    fronts: tuple[RemoteDataPlane, RemoteDataPlane], polls: list[float]
) -> None:
    a, _ = fronts
    responses = await asyncio.gather(*(a.infer(request(i)) for i in range(8)))
    assert [value(r) for r in responses] == list(range(8))
    await asyncio.sleep(0.005)
    assert EXECUTOR not in polls
    assert polls.count(FRONT_A) < 8  # only requests sent alone poll


async def test_a_front_end_with_one_of_several_running_requests_does_not_poll(
    fronts: tuple[RemoteDataPlane, RemoteDataPlane], polls: list[float]
) -> None:
    """Front end A's only request is not all the executor runs (B's slow one runs too): the
    executor's answer tells A so, and A's next request, alone in A, is not polled for; once
    the executor is idle again A polls again."""
    a, b = fronts
    slow = asyncio.ensure_future(b.infer(request(0.5, "slow")))
    await asyncio.sleep(0.1)  # B's request is running
    assert polls.count(FRONT_B) == 1  # alone everywhere: B polls (for 2.1 ms)
    assert value(await a.infer(request(1))) == 1  # the executor was idle at A's last answer
    assert polls.count(FRONT_A) == 1
    await asyncio.sleep(0.005)
    assert value(await a.infer(request(2))) == 2  # told that B's request still runs
    assert polls.count(FRONT_A) == 1
    assert value(await slow) == 0.5
    await asyncio.sleep(0.005)
    assert EXECUTOR not in polls  # two ran at once since it was last idle
    # Idle again: it told every front end so, not only B, whose request ended last.
    assert value(await a.infer(request(3))) == 3
    assert polls.count(FRONT_A) == 2
    await asyncio.sleep(0.005)
    assert polls.count(EXECUTOR) == 2  # that one ran alone: one poll per channel
