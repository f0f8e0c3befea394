"""The gRPC servicer's fixtures: the scripted data plane and a tritonclient aio client of a
grpc.aio server over it on port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
from tritonclient.grpc.aio import InferenceServerClient

from infermux.frontends.grpc import GrpcServer

from .fake_plane import FakePlane


@pytest.fixture
def plane() -> FakePlane:
    return FakePlane()


@pytest.fixture
async def client(plane: FakePlane) -> AsyncIterator[Any]:
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=1)
    await server.start()
    async with InferenceServerClient(f"127.0.0.1:{server.bound_port}") as triton:
        yield triton
    await server.stop()
