"""``GrpcServer``: binding (TCP, Unix sockets, clear errors) and a graceful stop."""

from __future__ import annotations

import asyncio
import socket
from pathlib import Path

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
import numpy as np
import pytest
from grpc_health.v1 import health_pb2
from tritonclient.grpc import InferInput
from tritonclient.grpc.aio import InferenceServerClient

from infermux.frontends.grpc import GrpcBindError, GrpcServer

from .fake_plane import FakePlane


async def test_serves_on_tcp_and_unix_socket_at_once(tmp_path: Path) -> None:
    sock = tmp_path / "grpc.sock"
    server = GrpcServer(FakePlane(), addresses=["127.0.0.1:0", f"unix:{sock}"], graceful_timeout=1)
    unbound = server.bound_port
    await server.start()
    try:
        assert unbound is None
        assert server.bound_port
        for url in (f"127.0.0.1:{server.bound_port}", f"unix:{sock}"):
            async with InferenceServerClient(url) as client:
                assert await client.is_server_live()
    finally:
        await server.stop()
    await server.stop()  # a second stop is harmless


async def test_a_busy_port_is_a_clear_error_and_releases_what_was_bound(tmp_path: Path) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        sock = tmp_path / "first.sock"
        server = GrpcServer(
            FakePlane(), addresses=[f"unix:{sock}", f"127.0.0.1:{port}"], graceful_timeout=1
        )
        with pytest.raises(GrpcBindError, match=f"'127.0.0.1:{port}': Address already in use"):
            await server.start()
    # The Unix socket bound before the failure was released: another server can take it.
    again = GrpcServer(FakePlane(), addresses=[f"unix:{sock}"], graceful_timeout=1)
    await again.start()
    await again.stop()


@pytest.mark.parametrize(
    ("address", "reason"),
    [
        ("unix:/nonexistent-dir/x.sock", "No such file or directory"),
        ("127.0.0.1:port", "expected 'host:port' or 'unix:/path'"),
    ],
)
async def test_unbindable_addresses_are_named(address: str, reason: str) -> None:
    server = GrpcServer(FakePlane(), addresses=[address], graceful_timeout=1)
    with pytest.raises(GrpcBindError) as caught:
        await server.start()
    assert str(caught.value) == f"cannot listen for gRPC on '{address}': {reason}"


def test_needs_an_address() -> None:
    with pytest.raises(ValueError, match="at least one address"):
        GrpcServer(FakePlane(), addresses=[], graceful_timeout=1)


async def test_stop_lets_running_requests_finish() -> None:
    plane = FakePlane()
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=10)
    await server.start()
    array = np.ones((1, 2), np.float32)
    item = InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(array)
    async with InferenceServerClient(f"127.0.0.1:{server.bound_port}") as client:
        running = asyncio.create_task(client.infer("gated", [item]))
        await plane.entered.wait()
        stopping = asyncio.create_task(server.stop())
        await asyncio.sleep(0.05)  # give stop() time to begin; it must still wait for the request
        assert not stopping.done()
        plane.gate.set()
        result = await running
        await stopping
    assert result.as_numpy("OUTPUT0").tolist() == array.tolist()


async def test_methods_are_served_through_generic_handlers_only(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Registered methods would make grpc.aio wait on one request-call future per method for
    every call it accepts (``handlers.add_service``): none may be registered, and both services
    still answer."""
    registered: list[str] = []

    def spy(_server: object, service: str, _handlers: object) -> None:
        registered.append(service)

    monkeypatch.setattr(grpc.aio._server.Server, "add_registered_method_handlers", spy)
    server = GrpcServer(FakePlane(), addresses=["127.0.0.1:0"], graceful_timeout=1)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.bound_port}") as channel:
            check = channel.unary_unary(
                "/grpc.health.v1.Health/Check",
                request_serializer=health_pb2.HealthCheckRequest.SerializeToString,
                response_deserializer=health_pb2.HealthCheckResponse.FromString,
            )
            answer = await check(health_pb2.HealthCheckRequest(service=""))
            assert answer.status == health_pb2.HealthCheckResponse.SERVING
        async with InferenceServerClient(f"127.0.0.1:{server.bound_port}") as client:
            assert await client.is_server_live()
    finally:
        await server.stop()
    assert registered == []
