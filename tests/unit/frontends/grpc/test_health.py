"""``grpc.health.v1.Health`` in-process: SERVING exactly while the data plane is ready."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from infermux.frontends.access import Access, Kind
from infermux.frontends.grpc import GrpcServer
from infermux.frontends.grpc.access import kind_of

from .fake_plane import FakePlane

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
async def served(plane: FakePlane) -> AsyncIterator[tuple[GrpcServer, Any]]:
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=1)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.bound_port}") as channel:
        yield server, health_pb2_grpc.HealthStub(channel)
    await server.stop()


@pytest.fixture
def plane() -> FakePlane:
    return FakePlane()


async def check(stub: Any, service: str) -> Any:
    reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
    return reply.status


async def test_check_follows_readiness(served: tuple[GrpcServer, Any], plane: FakePlane) -> None:
    _, stub = served
    for service in ("", "inference.GRPCInferenceService"):
        assert await check(stub, service) == SERVING
    plane.is_ready = False
    for service in ("", "inference.GRPCInferenceService"):
        assert await check(stub, service) == NOT_SERVING
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await check(stub, "no.such.Service")
    assert caught.value.code() == grpc.StatusCode.NOT_FOUND


async def test_watch_streams_changes(served: tuple[GrpcServer, Any], plane: FakePlane) -> None:
    server, stub = served
    server_health = server._health  # the poll interval, shortened for the test
    assert server_health is not None
    server_health._poll_s = 0.05
    call = stub.Watch(health_pb2.HealthCheckRequest(service=""))
    assert (await call.read()).status == SERVING
    plane.is_ready = False
    assert (await asyncio.wait_for(call.read(), 5)).status == NOT_SERVING
    plane.is_ready = True
    assert (await asyncio.wait_for(call.read(), 5)).status == SERVING
    call.cancel()


async def test_health_needs_no_token(plane: FakePlane) -> None:
    assert kind_of("/grpc.health.v1.Health/Check") is Kind.HEALTH
    access = Access(inference_token=b"secret")
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=1, access=access)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.bound_port}") as channel:
        assert await check(health_pb2_grpc.HealthStub(channel), "") == SERVING
    await server.stop()
