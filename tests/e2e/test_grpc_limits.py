"""What a hostile gRPC client can make the server hold or log, black-box: an unread
``ModelStreamInfer`` stream (``--grpc-max-stream-in-flight``), an unauthenticated large message
(refused from its metadata, unread), a message over the default ``--grpc-max-message-size``
(RESOURCE_EXHAUSTED) and bytes that are no protobuf (INVALID_ARGUMENT, one rate-limited line).

Memory is the server process's resident set (``/proc/<pid>/status``), with bounds far from both
the fixed server's growth (a few MiB) and the old one's (the whole payload, or several times it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
import numpy as np
import pytest
from tritonclient.grpc import service_pb2

from tests.support import ServerProcess, start_server

MiB = 2**20
METHOD = "/inference.GRPCInferenceService/"
UNLIMITED = [("grpc.max_send_message_length", -1), ("grpc.max_receive_message_length", -1)]
TOKEN = "grpc-limits-secret"


def memory(server: ServerProcess, key: str = "VmRSS") -> int:
    """``VmRSS`` (now) or ``VmHWM`` (the peak so far) of the server process, in bytes."""
    for line in Path(f"/proc/{server.process.pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise AssertionError(f"no {key} for the server")


def infer_request(model: str, payload: bytes, request_id: str = "") -> bytes:
    request = service_pb2.ModelInferRequest(model_name=model, id=request_id)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=[1, len(payload) // 4])
    request.raw_input_contents.append(payload)
    data: bytes = request.SerializeToString()
    return data


SMALL = infer_request("identity_fp32", bytes(16))


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server() as started:  # the default limits
        yield started
        assert started.stop() == 0


@pytest.fixture(scope="module")
def guarded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    token = tmp_path_factory.mktemp("grpc-limits") / "token"
    token.write_text(TOKEN)
    # A cap above the test's message, so that only the order of the checks keeps it out.
    flags = ["--auth-token-file", str(token), "--grpc-max-message-size", str(256 * MiB)]
    with start_server(*flags) as started:
        yield started
        assert started.stop() == 0


async def unread_stream(server: ServerProcess, count: int, payload: bytes) -> tuple[int, int]:
    """Send up to ``count`` requests without reading an answer, until a write waits 3 s: the
    growth of the server's memory meanwhile, and how many answers come once read (all)."""
    async with grpc.aio.insecure_channel(server.grpc_url) as channel:
        call = channel.stream_stream(METHOD + "ModelStreamInfer")()
        before = memory(server)
        sent = 0
        waiting: asyncio.Future[None] | None = None
        while sent < count:
            write = asyncio.ensure_future(call.write(infer_request("identity_fp32", payload)))
            done, _ = await asyncio.wait({write}, timeout=3)
            if not done:  # flow control pushes back; cancelling the write would end the call
                waiting = write
                break
            sent += 1
        await asyncio.sleep(1)  # what the server has read by now it holds until answered
        growth = memory(server) - before
        answers = 0

        async def read() -> None:
            nonlocal answers
            async for message in call:
                answer = service_pb2.ModelStreamInferResponse.FromString(message)
                assert answer.error_message == ""
                answers += 1

        reader = asyncio.create_task(read())
        if waiting is not None:
            await waiting
            sent += 1
        await call.done_writing()
        await asyncio.wait_for(reader, 120)
        assert answers == sent
        return growth, answers


def test_an_unread_stream_is_held_to_its_in_flight_bound(server: ServerProcess) -> None:
    # 4000 x 64 KiB = 250 MiB: unbounded, the server reads and answers all of it into memory.
    payload = np.ones(16384, np.float32).tobytes()
    growth, answers = asyncio.run(unread_stream(server, 4000, payload))
    assert growth < 100 * MiB, f"an unread stream grew the server by {growth / MiB:.0f} MiB"
    assert answers > 64  # the in-flight requests, and those in gRPC's flow-control windows


async def call_once(server: ServerProcess, method: str, body: bytes, token: str = "") -> object:
    """The status of one unary call of raw bytes (the answer itself is dropped)."""
    metadata = (("authorization", f"Bearer {token}"),) if token else None
    async with grpc.aio.insecure_channel(server.grpc_url, options=UNLIMITED) as channel:
        try:
            await channel.unary_unary(METHOD + method)(body, metadata=metadata, timeout=60)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


def test_an_unauthenticated_message_is_refused_unread(guarded: ServerProcess) -> None:
    body = infer_request("identity_fp32", bytes(128 * MiB))
    peak = memory(guarded, "VmHWM")
    assert asyncio.run(call_once(guarded, "ModelInfer", body)) == grpc.StatusCode.UNAUTHENTICATED
    del body
    growth = memory(guarded, "VmHWM") - peak
    assert growth < 64 * MiB, f"a refused 128 MiB message cost {growth / MiB:.0f} MiB"
    # Garbage before authentication is refused as unauthenticated too, and logs nothing.
    for _ in range(20):
        code = asyncio.run(call_once(guarded, "ModelInfer", b"\xff" * 64))
        assert code == grpc.StatusCode.UNAUTHENTICATED
    assert not [line for line in guarded.log if "malformed" in line or "Traceback" in line]
    assert asyncio.run(call_once(guarded, "ModelInfer", SMALL, TOKEN)) == grpc.StatusCode.OK


def test_a_message_over_the_default_cap_is_resource_exhausted(server: ServerProcess) -> None:
    body = infer_request("identity_fp32", bytes(65 * MiB))
    assert asyncio.run(call_once(server, "ModelInfer", body)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    del body
    assert asyncio.run(call_once(server, "ModelInfer", SMALL)) == grpc.StatusCode.OK


def test_garbage_requests_are_invalid_argument_and_one_log_line(server: ServerProcess) -> None:
    rng = np.random.default_rng(23)

    async def flood() -> set[object]:
        codes: set[object] = set()
        async with grpc.aio.insecure_channel(server.grpc_url) as channel:
            call = channel.unary_unary(METHOD + "ModelInfer")
            for _ in range(200):
                # Random bytes, ending in a truncated varint so that they never parse.
                garbage = rng.bytes(int(rng.integers(1, 512))) + b"\xff"
                try:
                    await call(garbage, timeout=30)
                    codes.add("OK")
                except grpc.aio.AioRpcError as exc:
                    codes.add(exc.code())
        return codes

    assert asyncio.run(flood()) == {grpc.StatusCode.INVALID_ARGUMENT}
    assert not [line for line in server.log if "Traceback" in line]
    lines = [line for line in server.log if "malformed gRPC ModelInfer request" in line]
    assert 1 <= len(lines) <= 5, lines
    assert "WARNING" in lines[0]
    assert "from ipv4:127.0.0.1:" in lines[0]  # names the peer
    assert asyncio.run(call_once(server, "ModelInfer", SMALL)) == grpc.StatusCode.OK
