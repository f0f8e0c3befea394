"""A decoupled model's responses across a real channel (``--frontends N``): streamed as they
come, in order, the last one final; errors mid-stream as error responses; a reader that stops
reading holds the model back within the window; a reader that leaves cancels the model's request.

Both ends run on this test's event loop. ``count`` is a decoupled Python model: its input is
``[total, fail_at, delay_ms]``; it sends ``total`` responses ``OUT = i`` (``BATCH``: how many
requests its batch had), an error response at ``fail_at``, sleeps ``delay_ms`` after each, and
writes how many it produced to ``progress`` and, when its generator is closed, ``closed``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry
from infermux.backends.responses import RESPONSE_BUFFER
from infermux.dataplane import DataPlane
from infermux.errors import ErrorCode, InfermuxError
from infermux.ipc import Channel
from infermux.ipc.wire import Cancel, to_executor
from infermux.repository import ControlMode, ModelRepository
from infermux.transport.channel_server import ChannelServer
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.transport.streams import STREAM_WINDOW
from infermux.types import InferRequest, InferResponse, ServerMetadata, Tensor
from tests.support import write_model

METADATA = ServerMetadata("infermux", "test", ())

CONFIG = """name: "count"
backend: "python"
max_batch_size: 8
input [ { name: "IN", data_type: TYPE_INT32, dims: [ 3 ] } ]
output [ { name: "OUT", data_type: TYPE_INT32, dims: [ 1 ] },
         { name: "BATCH", data_type: TYPE_INT32, dims: [ 1 ] } ]
model_transaction_policy { decoupled: true }
dynamic_batching { max_queue_delay_microseconds: 100000 }
"""

COUNT = """
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).parent


class Model:
    def execute(self, requests):
        return [self.count(r, len(requests)) for r in requests]

    def count(self, request, batch):
        total, fail_at, delay_ms = (int(v) for v in request.inputs["IN"][0])
        i = 0
        try:
            for i in range(total):
                (HERE / "progress").write_text(str(i + 1))
                if i == fail_at:
                    yield ValueError(f"failed at {i}")
                else:
                    yield {"OUT": np.array([[i]], np.int32), "BATCH": np.array([[batch]], np.int32)}
                time.sleep(delay_ms / 1000)
        except GeneratorExit:
            (HERE / "closed").write_text(str(i))
            raise
"""


class Ends:
    def __init__(self, model: Path, remote: RemoteDataPlane, server: ChannelServer) -> None:
        self.model, self.remote, self.server = model / "1", remote, server

    def progress(self) -> int:
        path = self.model / "progress"
        return int(path.read_text() or 0) if path.exists() else 0

    def closed(self) -> bool:
        return (self.model / "closed").exists()

    async def idle(self) -> None:
        """Until nothing is in flight and both arenas are empty again."""
        (client,) = self.server._clients.values()
        executor = self.remote._executors[0]
        link = executor._link
        assert link is not None
        deadline = time.monotonic() + 10
        # in_flight() is waited for too: the executor's last frame for a cancelled stream (its
        # CANCELLED failure) reaches the front end a loop turn after the executor's task ends.
        while (
            link.endpoint.arena.used
            or client.link.endpoint.arena.used
            or client.tasks
            or executor.in_flight()
        ):
            assert time.monotonic() < deadline, "blocks or requests left behind"
            await asyncio.sleep(0.01)
            await self.remote.ready()  # a wake-up: Release frames wait for one
        assert not client.credits


@pytest.fixture
async def ends(tmp_path: Path) -> AsyncIterator[Ends]:
    repo = tmp_path / "repo"
    model = repo / "count"
    (model / "1").mkdir(parents=True)
    (model / "config.pbtxt").write_text(CONFIG)
    (model / "1" / "model.py").write_text(COUNT)
    write_model(repo, "identity")
    repository = ModelRepository([repo], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    plane = DataPlane(repository, version="test")
    channel = Channel(tmp_path, ring_bytes=64 * 1024, arena_bytes=1024 * 1024)
    server = ChannelServer(plane)
    server.attach(channel.spec)
    remote = RemoteDataPlane(METADATA, ready_timeout_s=1.0)
    remote.attach(channel.spec)
    yield Ends(model, remote, server)
    remote.detach("test over")
    await server.close()
    channel.close()
    plane.close()
    await repository.close()


def count(total: int, fail_at: int = -1, delay_ms: int = 0, request_id: str = "") -> InferRequest:
    data = np.array([[total, fail_at, delay_ms]], np.int32)
    return InferRequest("count", "", [Tensor("IN", "INT32", (1, 3), data)], id=request_id)


def value(response: InferResponse, name: str = "OUT") -> int:
    (tensor,) = [t for t in response.outputs if t.name == name]
    return int(tensor.data.reshape(-1)[0])


async def until(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 10
    while not condition():
        assert time.monotonic() < deadline, what
        await asyncio.sleep(0.01)


async def test_responses_stream_in_order_then_the_final_flag(ends: Ends) -> None:
    responses = [r async for r in ends.remote.infer_stream(count(40, request_id="r"))]
    assert [value(r) for r in responses[:-1]] == list(range(40))
    assert [r.final for r in responses] == [False] * 40 + [True]
    assert responses[-1].flag_only
    assert not responses[-1].outputs
    assert {r.id for r in responses} == {"r"}
    assert {r.model_name for r in responses} == {"count"}
    await ends.idle()


async def test_an_error_mid_stream_is_an_error_response_and_the_stream_goes_on(
    ends: Ends,
) -> None:
    responses = [r async for r in ends.remote.infer_stream(count(3, fail_at=1))]
    assert value(responses[0]) == 0
    error = responses[1].error
    assert error is not None
    assert "failed at 1" in error.message
    assert not responses[1].outputs
    assert value(responses[2]) == 2
    assert responses[3].final
    await ends.idle()


async def test_a_failure_before_the_stream_starts_is_raised(ends: Ends) -> None:
    bad = InferRequest("count", "", [Tensor("IN", "INT32", (1, 2), np.zeros((1, 2), np.int32))])
    # Learnt decoupled first, so that this request is streamed (not sent as a plain one).
    assert [r async for r in ends.remote.infer_stream(count(0))][-1].final
    with pytest.raises(InfermuxError, match="IN") as caught:
        async for _ in ends.remote.infer_stream(bad):
            pass
    assert caught.value.code is ErrorCode.INVALID_ARG
    await ends.idle()


async def test_a_plain_model_answers_once_through_the_same_call(ends: Ends) -> None:
    data = np.array([[1.5, 2.5]], np.float32)
    request = InferRequest("identity", "", [Tensor("INPUT0", "FP32", (1, 2), data)])
    (response,) = [r async for r in ends.remote.infer_stream(request)]
    assert response.final
    assert response.outputs[0].data.tolist() == [[1.5, 2.5]]
    # A single-response call to the decoupled model is still refused, as in one process.
    with pytest.raises(InfermuxError, match="decoupled") as caught:
        await ends.remote.infer(count(1))
    assert caught.value.code is ErrorCode.UNSUPPORTED


async def test_a_slow_reader_holds_the_model_back_within_the_window(ends: Ends) -> None:
    total = 400
    responses = ends.remote.infer_stream(count(total))
    first = await anext(responses)
    assert value(first) == 0
    # The reader stops: the model runs ahead by at most the channel's window and its own
    # response buffer (one more response sits in the model's blocked send).
    bound = 1 + STREAM_WINDOW + RESPONSE_BUFFER + 1
    await until(lambda: ends.progress() >= bound - 2, "the model did not run ahead at all")
    await asyncio.sleep(0.5)
    assert ends.progress() <= bound
    rest = [r async for r in responses]
    assert [value(r) for r in rest[:-1]] == list(range(1, total))
    assert rest[-1].final
    await ends.idle()


async def test_a_reader_that_leaves_cancels_the_models_request(ends: Ends) -> None:
    responses = ends.remote.infer_stream(count(1000, delay_ms=20))
    assert [value(await anext(responses)) for _ in range(3)] == [0, 1, 2]
    await responses.aclose()  # type: ignore[attr-defined]  # an async generator
    await until(ends.closed, "the model's generator was not closed")
    stopped = ends.progress()
    await asyncio.sleep(0.2)
    assert ends.progress() == stopped < 1000
    await ends.idle()


async def test_a_reader_that_leaves_sends_its_cancel_before_aclose_returns(ends: Ends) -> None:
    # The front end's stream is an inner generator: closed with aclosing, its Cancel goes out
    # at once, not a loop turn later when the collected generator is finalised.
    link = ends.remote._executors[0].link
    assert link is not None
    sent: list[bytes] = []
    send = link.send

    def spy(frame: bytes, *, wake: bool = True) -> None:
        sent.append(frame)
        send(frame, wake=wake)

    link.send = spy  # type: ignore[method-assign]
    responses = ends.remote.infer_stream(count(1000, delay_ms=20))
    await anext(responses)
    await responses.aclose()  # type: ignore[attr-defined]  # an async generator
    assert [f for f in sent if isinstance(to_executor(f), Cancel)]
    await until(ends.closed, "the model's generator was not closed")
    await ends.idle()


async def test_a_cancelled_reader_cancels_the_models_request(ends: Ends) -> None:
    # A gRPC cancellation or HTTP disconnect cancels the task that reads the stream.
    got: list[int] = []

    async def read() -> None:
        async for response in ends.remote.infer_stream(count(1000, delay_ms=20)):
            got.append(value(response))

    task = asyncio.ensure_future(read())
    await until(lambda: len(got) >= 2, "no response came")
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    await until(ends.closed, "the model's generator was not closed")
    await ends.idle()


async def test_a_batch_of_streams_runs_together_each_with_its_own_responses(ends: Ends) -> None:
    async def read(total: int, request_id: str) -> list[InferResponse]:
        return [r async for r in ends.remote.infer_stream(count(total, request_id=request_id))]

    # Learnt decoupled first: the three then leave together, within the queue delay.
    await read(0, "warm")
    results = await asyncio.gather(read(2, "a"), read(3, "b"), read(1, "c"))
    for total, (request_id, responses) in zip(
        (2, 3, 1), zip("abc", results, strict=True), strict=True
    ):
        assert [value(r) for r in responses[:-1]] == list(range(total))
        assert {value(r, "BATCH") for r in responses[:-1]} == {3}
        assert {r.id for r in responses} == {request_id}
        assert responses[-1].final
    await ends.idle()


async def test_a_stream_fails_unavailable_when_its_executor_goes(ends: Ends) -> None:
    responses = ends.remote.infer_stream(count(1000, delay_ms=20))
    await anext(responses)
    ends.remote.detach("the executor exited")
    with pytest.raises(InfermuxError, match="the executor exited") as caught:
        async for _ in responses:
            pass
    assert caught.value.code is ErrorCode.UNAVAILABLE
