"""Both ends of a real channel on the test's event loop: a repository and its DataPlane behind a
ChannelServer, and the RemoteDataPlane a front end would be given."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.ipc import Channel
from infermux.repository import ControlMode, ModelRepository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import ServerMetadata

METADATA = ServerMetadata("infermux", "test", ())


@contextlib.asynccontextmanager
async def connected(
    repo: Path,
    work: Path,
    *,
    ring_bytes: int = 256 * 1024,
    arena_bytes: int = 4 * 1024 * 1024,
    ready_timeout_s: float = 0.5,
) -> AsyncIterator[tuple[DataPlane, RemoteDataPlane]]:
    """The models of ``repo`` served by an in-process plane (system shared memory allowed) and
    reached through a channel whose FIFOs live in ``work``."""
    repository = ModelRepository([repo], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(repository, version="test", shared_memory=SharedMemoryRegistry(enabled=True))
    channel = Channel(work, ring_bytes=ring_bytes, arena_bytes=arena_bytes)
    server = ChannelServer(plane)
    server.attach(channel.spec)
    remote = RemoteDataPlane(METADATA, ready_timeout_s=ready_timeout_s)
    remote.attach(channel.spec)
    try:
        yield plane, remote
    finally:
        remote.detach("test over")
        await server.close()
        channel.close()
        plane.close()
        await repository.close()
