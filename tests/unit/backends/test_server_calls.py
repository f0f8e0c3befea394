"""The data plane's ``infer`` and ``infer_stream`` as models reach them (BLS): from a thread,
from another loop, and refused where waiting would deadlock or nothing is attached; a stream
read to its end, cancelled, or abandoned."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import TypeVar

import numpy as np
import pytest

from infermux.backends.server_calls import CallResponses, ServerCalls, current, set_current
from infermux.errors import NotFoundError, UnavailableError
from infermux.types import InferRequest, InferResponse, Tensor
from tests.support import wait_for

T = TypeVar("T")


async def echo(request: InferRequest) -> InferResponse:
    await asyncio.sleep(0)
    return InferResponse(request.model_name, "1", list(request.inputs))


def a_request() -> InferRequest:
    data = np.ones(2, np.float32)
    return InferRequest("m", "", [Tensor("IN", "FP32", (2,), data)])


def test_a_thread_waits_for_the_answer_and_tensors_are_not_copied() -> None:
    async def main() -> None:
        calls = ServerCalls()
        calls.attach(echo)
        calls.serve_on(asyncio.get_running_loop())
        request = a_request()
        answer = await asyncio.to_thread(calls.infer, request)
        assert answer.outputs[0].data is request.inputs[0].data
        # From the loop itself it would wait for itself: refused, saying where to call from.
        with pytest.raises(UnavailableError, match="event loop"):
            calls.infer(request)
        # An async caller on the same loop just awaits.
        assert (await calls.infer_async(request)).model_name == "m"

    asyncio.run(main())


def test_nothing_attached_is_unavailable() -> None:
    with pytest.raises(UnavailableError, match="does not take requests from models"):
        ServerCalls().infer(a_request())


def test_the_current_server_is_per_thread_else_the_one_this_process_serves() -> None:
    calls = ServerCalls()
    previous = set_current(calls)
    seen: list[ServerCalls | None] = []

    def look(explicit: bool) -> None:
        if explicit:
            set_current(None)  # as in a worker process of its own
        seen.append(current())

    serving = ServerCalls()
    loop = asyncio.new_event_loop()
    serving.serve_on(loop)
    for explicit in (False, True):
        thread = threading.Thread(target=look, args=(explicit,))
        thread.start()
        thread.join()
    loop.close()
    assert current() is calls
    # A thread the model started finds the server; one told it has none, none.
    assert seen == [serving, None]
    set_current(previous)


# -- streams (a decoupled model's responses) ------------------------------------------------------


class Source:
    """An ``infer_stream`` yielding IN's values one response each, the last one final; it
    notes how it ended and, from response ``hold`` on, waits for ever."""

    def __init__(self, hold: int = 99) -> None:
        self.ended = ""
        self.hold = hold
        self.waiting = False  # a read waits on this source

    async def __call__(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if request.model_name != "m":
            raise NotFoundError(f"no model '{request.model_name}'")
        values = list(request.inputs[0].data)
        try:
            for i, value in enumerate(values):
                if i >= self.hold:
                    self.waiting = True
                    await asyncio.Event().wait()  # until cancelled
                data = np.array([value], np.float32)
                out = Tensor("OUT", "FP32", (1,), data)
                yield InferResponse("m", "1", [out], final=i == len(values) - 1)
            self.ended = "finished"
        except asyncio.CancelledError:
            self.ended = "cancelled"
            raise
        except GeneratorExit:
            self.ended = "closed"
            raise


class LoopThread:
    """The server's loop, on a thread of its own as in the server."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, work: Awaitable[T]) -> T:
        async def wrapped() -> T:
            return await work

        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(10)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join()
        self.loop.close()


@pytest.fixture
def server() -> Iterator[LoopThread]:
    loop = LoopThread()
    yield loop
    loop.close()


def streaming(loop: LoopThread, source: Source) -> ServerCalls:
    calls = ServerCalls()
    calls.attach(echo, source)
    calls.serve_on(loop.loop)
    return calls


def values(count: int, model: str = "m") -> InferRequest:
    data = np.arange(count, dtype=np.float32)
    return InferRequest(model, "", [Tensor("IN", "FP32", (count,), data)])


def read_all(responses: CallResponses) -> list[float]:
    got = []
    while (response := responses.next()) is not None:
        got.append(float(response.outputs[0].data[0]))
    return got


def test_a_thread_reads_the_responses_in_order_and_the_stream_ends_after_the_final(
    server: LoopThread,
) -> None:
    source = Source()
    responses = streaming(server, source).stream(values(3))
    assert read_all(responses) == [0, 1, 2]
    assert responses.over
    assert source.ended == "finished"  # read past its final response: nothing left hanging


def test_a_failure_before_the_first_response_is_raised(server: LoopThread) -> None:
    responses = streaming(server, Source()).stream(values(2, model="other"))
    with pytest.raises(NotFoundError, match="no model 'other'"):
        responses.next()
    assert responses.next() is None


def test_another_loop_awaits_the_responses(server: LoopThread) -> None:
    calls = streaming(server, Source())

    async def read() -> list[float]:
        responses = calls.stream(values(3))
        got = []
        while (response := await responses.anext()) is not None:
            got.append(float(response.outputs[0].data[0]))
        return got

    assert asyncio.run(read()) == [0, 1, 2]


def test_on_the_servers_loop_a_read_is_awaited_and_a_wait_refused(server: LoopThread) -> None:
    calls = streaming(server, Source())

    async def on_the_loop() -> float:
        responses = calls.stream(values(2))
        with pytest.raises(UnavailableError, match="event loop"):
            responses.next()
        first = await responses.anext()
        assert first is not None
        return float(first.outputs[0].data[0])

    assert server.run(on_the_loop()) == 0


def test_cancel_while_a_read_waits_stops_the_stream_where_it_waits(server: LoopThread) -> None:
    source = Source(hold=1)
    responses = streaming(server, source).stream(values(3))
    assert responses.next() is not None
    got: list[InferResponse | None] = []
    reader = threading.Thread(target=lambda: got.append(responses.next()))
    reader.start()
    wait_for(lambda: source.waiting)
    responses.cancel()
    reader.join(10)
    assert got == [None]
    wait_for(lambda: source.ended == "cancelled")
    assert responses.next() is None


def test_cancel_between_reads_closes_the_stream(server: LoopThread) -> None:
    source = Source()
    responses = streaming(server, source).stream(values(3))
    assert responses.next() is not None
    responses.cancel()
    wait_for(lambda: source.ended == "closed")
    assert responses.next() is None


def test_an_abandoned_stream_is_read_to_its_end(server: LoopThread) -> None:
    source = Source()
    responses = streaming(server, source).stream(values(5))
    assert responses.next() is not None
    responses.abandon()
    wait_for(lambda: source.ended == "finished")
    assert responses.next() is None


def test_no_stream_attached_is_unavailable(server: LoopThread) -> None:
    calls = ServerCalls()
    calls.attach(echo)
    calls.serve_on(server.loop)
    with pytest.raises(UnavailableError, match="does not stream"):
        calls.stream(values(1))
