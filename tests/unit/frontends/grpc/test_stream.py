"""Triton's bidirectional ``ModelStreamInfer`` in-process (``frontends/grpc/stream.py``): a
grpc.aio server on port 0 over the scripted data plane (``fake_plane``), driven by tritonclient's
aio client or by raw stream calls where the client hides what is checked."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
from tritonclient.grpc import service_pb2

from infermux.frontends.grpc import GrpcServer
from infermux.types import InferRequest, InferResponse

from .fake_plane import FakePlane, fp32_input


async def test_stream_answers_as_requests_complete_and_survives_a_failure(
    client: Any, plane: FakePlane
) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        # 'gated' waits for 'opener', sent after it: only concurrent handling answers all three.
        for model, request_id in (("gated", "first"), ("fail", "second"), ("opener", "third")):
            yield {"model_name": model, "inputs": [fp32_input([5.0])], "request_id": request_id}

    answers = [answer async for answer in client.stream_infer(requests())]
    assert len(answers) == 3
    by_id: dict[str, Any] = {}
    for result, error in answers:
        if error is not None:
            assert result is None
            by_id["second"] = error
        else:
            by_id[result.get_response().id] = result
    assert "request 'second' refused" in by_id["second"].message()
    assert by_id["third"].as_numpy("OUTPUT0").tolist() == [[5.0]]
    assert by_id["first"].as_numpy("OUTPUT0").tolist() == [[5.0]]
    last_result, _ = answers[-1]
    assert last_result.get_response().id == "first"


async def test_stream_error_names_the_failed_request(client: Any) -> None:
    # tritonclient hides the echoed request of an error; read the raw stream message instead.
    async def requests() -> AsyncIterator[Any]:
        yield {"model_name": "crash", "inputs": [fp32_input([1.0])], "request_id": "c1"}

    stream = client.stream_infer(requests())
    raw = await stream._grpc_call.read()
    assert raw.error_message == "internal error: kaboom"
    assert (raw.infer_response.id, raw.infer_response.model_name) == ("c1", "crash")


async def test_stream_with_no_requests_ends(client: Any) -> None:
    async def requests() -> AsyncIterator[dict[str, Any]]:
        return
        yield  # an async generator that yields nothing

    assert [a async for a in client.stream_infer(requests())] == []


@contextlib.asynccontextmanager
async def raw_stream(plane: FakePlane, **options: Any) -> AsyncIterator[Any]:
    """A ModelStreamInfer call on a server over ``plane``, bytes in and out: the checks here
    read what tritonclient hides or could not send (unread replies, raw flags)."""
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=1, **options)
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{server.bound_port}") as channel:
            yield channel.stream_stream("/inference.GRPCInferenceService/ModelStreamInfer")()
    finally:
        await server.stop()


class CountingPlane(FakePlane):
    def __init__(self) -> None:
        super().__init__()
        self.started = 0

    async def infer(self, request: InferRequest) -> InferResponse:
        self.started += 1
        return await super().infer(request)


async def test_a_stream_reads_no_more_than_its_in_flight_bound() -> None:
    plane = CountingPlane()
    async with raw_stream(plane, stream_in_flight=2) as call:
        for i in range(5):  # small: grpc buffers them, the writes do not wait
            request = service_pb2.ModelInferRequest(model_name="gated", id=str(i))
            await call.write(request.SerializeToString())
        await asyncio.wait_for(plane.entered.wait(), 10)
        await asyncio.sleep(0.3)  # time enough for a third read, were it allowed
        assert plane.started == 2
        plane.gate.set()
        await call.done_writing()
        answers = [service_pb2.ModelStreamInferResponse.FromString(m) async for m in call]
        assert sorted(a.infer_response.id for a in answers) == ["0", "1", "2", "3", "4"]
        assert plane.started == 5


def ticker(request_id: str, count: int, **flags: bool) -> bytes:
    request = service_pb2.ModelInferRequest(model_name="ticker", id=request_id)
    request.parameters["count"].int64_param = count
    for name, value in flags.items():
        request.parameters[name].bool_param = value
    return bytes(request.SerializeToString())


async def test_a_stream_carries_many_responses_per_request_with_the_final_flag() -> None:
    async with raw_stream(FakePlane()) as call:
        await call.write(ticker("a", 3, triton_enable_empty_final_response=True, fail_second=True))
        await call.write(ticker("b", 2))  # no empty final response asked for
        await call.done_writing()
        answers = [service_pb2.ModelStreamInferResponse.FromString(m) async for m in call]
    a = [m for m in answers if m.infer_response.id == "a"]
    b = [m for m in answers if m.infer_response.id == "b"]
    assert [m.error_message for m in a] == ["", "second response failed", "", ""]
    assert [m.infer_response.parameters["triton_final_response"].bool_param for m in a] == [
        False,
        False,
        False,
        True,
    ]
    assert len(a[3].infer_response.raw_output_contents) == 0  # the flag alone, sent empty
    assert len(b) == 2  # the flag alone sends nothing
    # Every response sent says whether it is the last, with or without the option (as Triton).
    assert [m.infer_response.parameters["triton_final_response"].bool_param for m in b] == [
        False,
        False,
    ]
    assert "triton_enable_empty_final_response" not in a[0].infer_response.parameters


async def test_a_client_that_stops_reading_holds_a_streaming_request_back() -> None:
    plane = FakePlane()
    async with raw_stream(plane, stream_in_flight=2) as call:
        await call.write(ticker("slow", 400))  # 400 x 64 KiB = 25 MiB if nothing held it
        await asyncio.sleep(1.0)  # the client reads nothing meanwhile
        held = plane.streamed
        assert held < 200, held  # flow control plus a bounded buffer, not the whole stream
        await call.done_writing()
        count = 0
        async for _ in call:
            count += 1
        assert count == 400  # reading again, everything comes, then the stream ends
