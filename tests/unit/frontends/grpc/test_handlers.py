"""Bytes that protobuf cannot parse, in-process: INVALID_ARGUMENT (a stream answers with
``error_message`` and stays open), one rate-limited warning and never a traceback."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
import pytest
from tritonclient.grpc import service_pb2

from infermux.frontends.grpc import GrpcServer
from infermux.frontends.grpc.handlers import SERVICE, Malformed, tolerant

from .fake_plane import FakePlane

GARBAGE = b"\xff\xff\xff\xff garbage"  # field 31 with a truncated varint: never valid protobuf
METHOD = "/inference.GRPCInferenceService/"


@pytest.fixture
async def channel() -> AsyncIterator[grpc.aio.Channel]:
    server = GrpcServer(FakePlane(), addresses=["127.0.0.1:0"], graceful_timeout=1)
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{server.bound_port}") as opened:
        yield opened
    await server.stop()


def test_the_tolerant_deserializer_returns_malformed() -> None:
    parse = tolerant(service_pb2.ModelInferRequest)
    assert parse(service_pb2.ModelInferRequest(id="x").SerializeToString()).id == "x"
    bad = parse(GARBAGE)
    assert isinstance(bad, Malformed)
    assert bad.message_type == "inference.ModelInferRequest"
    assert "inference.ModelInferRequest" in bad.describe()


def test_every_rpc_of_the_service_is_served() -> None:
    assert {m.name for m in SERVICE.methods} >= {"ModelInfer", "ModelStreamInfer", "ServerLive"}


@pytest.mark.parametrize("method", ["ModelInfer", "ModelMetadata", "RepositoryModelLoad"])
async def test_garbage_is_invalid_argument_with_one_line(
    channel: grpc.aio.Channel, method: str, caplog: pytest.LogCaptureFixture
) -> None:
    call = channel.unary_unary(METHOD + method)
    for _ in range(20):
        with pytest.raises(grpc.aio.AioRpcError) as caught:
            await call(GARBAGE)
        assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "does not parse as a protobuf inference." in caught.value.details()
    lines = [r for r in caplog.records if "malformed gRPC" in r.getMessage()]
    assert len(lines) <= 1  # rate-limited (possibly none: an earlier test logged this kind)
    assert all(r.levelno == logging.WARNING and r.exc_info is None for r in lines)
    assert not any(r.exc_info for r in caplog.records)
    assert await channel.unary_unary(METHOD + "ServerLive")(b"") == b"\x08\x01"


async def test_garbage_in_a_stream_is_answered_and_the_stream_goes_on(
    channel: grpc.aio.Channel,
) -> None:
    call = channel.stream_stream(METHOD + "ModelStreamInfer")()
    await call.write(GARBAGE)
    first = service_pb2.ModelStreamInferResponse.FromString(await call.read())
    assert "does not parse as a protobuf inference.ModelInferRequest" in first.error_message
    good = service_pb2.ModelInferRequest(model_name="echo", id="after")
    await call.write(good.SerializeToString())
    second = service_pb2.ModelStreamInferResponse.FromString(await call.read())
    assert (second.error_message, second.infer_response.id) == ("", "after")
    await call.done_writing()
    assert await call.code() == grpc.StatusCode.OK
