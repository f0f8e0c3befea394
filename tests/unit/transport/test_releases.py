"""Answer blocks a front end read go back to its executor in one Release frame per loop
iteration, over the channel they came from."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from infermux.ipc import Channel, Endpoint
from infermux.ipc.wire import NO_DATA, Release, to_executor
from infermux.transport.executor_client import RemoteExecutor
from infermux.types import ServerMetadata

METADATA = ServerMetadata("infermux", "test", ())


@pytest.fixture
def channels(tmp_path: Path) -> Iterator[tuple[Channel, Channel]]:
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    first, second = Channel(tmp_path / "a"), Channel(tmp_path / "b")
    yield first, second
    first.close()
    second.close()


def released(executor_end: Endpoint) -> list[list[int]]:
    """The offsets of each Release frame the executor at ``executor_end`` has been sent."""
    messages = [to_executor(frame) for frame in executor_end.inbox.take()]
    return [m.offsets for m in messages if isinstance(m, Release)]


async def turn() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def test_blocks_read_in_one_iteration_go_back_in_one_frame(
    channels: tuple[Channel, Channel],
) -> None:
    channel, _ = channels
    executor_end = Endpoint(channel.spec, "executor")
    remote = RemoteExecutor(METADATA)
    remote.attach(channel.spec)
    link = remote.require()
    remote.free(link, [64, NO_DATA])
    remote.free(link, [128])
    remote.free(link, [NO_DATA])  # an output that was never in the arena
    await turn()
    assert released(executor_end) == [[64, 128]]
    remote.free(link, [256])
    await turn()
    assert released(executor_end) == [[256]]
    remote.detach("test over")
    executor_end.close()


async def test_blocks_of_a_new_executor_read_as_it_replaced_the_old_one_are_not_lost(
    channels: tuple[Channel, Channel],
) -> None:
    """Regression: the old executor's pending Release took the new one's offsets with it (and
    dropped them, its link being gone), so the new executor's arena leaked those blocks."""
    old_channel, new_channel = channels
    new_end = Endpoint(new_channel.spec, "executor")
    remote = RemoteExecutor(METADATA)
    remote.attach(old_channel.spec)
    remote.free(remote.require(), [64])
    remote.attach(new_channel.spec)  # the executor restarted, in the same loop iteration
    remote.free(remote.require(), [128])
    await turn()
    assert released(new_end) == [[128]]
    remote.detach("test over")
    new_end.close()
