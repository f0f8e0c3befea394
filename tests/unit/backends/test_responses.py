from __future__ import annotations

import asyncio
import threading

import pytest

from infermux.backends.responses import ResponseStream


async def test_responses_arrive_in_order_then_the_final_flag() -> None:
    stream = ResponseStream()
    sender = threading.Thread(
        target=lambda: [stream.send({"i": i}, final=i == 4) for i in range(5)]  # type: ignore[func-returns-value]
    )
    sender.start()
    got = [await stream.get() for _ in range(5)]
    sender.join()
    assert got == [({"i": i}, i == 4) for i in range(5)]


async def test_readers_of_many_streams_woken_together_each_get_their_responses() -> None:
    # The wake-ups of one loop are shared: senders racing on many streams must wake every
    # reader that waits, each with its own responses in order.
    streams = [ResponseStream() for _ in range(8)]

    def send(stream: ResponseStream, key: int) -> None:
        for i in range(50):
            stream.send({"i": key * 100 + i}, final=i == 49)

    senders = [
        threading.Thread(target=send, args=(stream, key)) for key, stream in enumerate(streams)
    ]

    async def read(stream: ResponseStream) -> list[tuple[object, bool]]:
        return [await stream.get() for _ in range(50)]

    readers = [asyncio.create_task(read(stream)) for stream in streams]
    for sender in senders:
        sender.start()
    got = await asyncio.wait_for(asyncio.gather(*readers), 10)
    for sender in senders:
        sender.join()
    for key, responses in enumerate(got):
        assert responses == [({"i": key * 100 + i}, i == 49) for i in range(50)]


async def test_a_sender_blocks_while_the_reader_is_behind() -> None:
    stream = ResponseStream(limit=2)
    sent: list[int] = []

    def send() -> None:
        for i in range(5):
            stream.send({"i": i})
            sent.append(i)

    sender = threading.Thread(target=send, daemon=True)
    sender.start()
    await asyncio.sleep(0.1)
    assert sent == [0, 1]  # bounded: the third send waits for the reader
    assert (await stream.get())[0] == {"i": 0}
    await asyncio.sleep(0.1)
    assert sent == [0, 1, 2]
    stream.close()  # the reader is gone: the blocked sender is released, later sends dropped
    sender.join(2)
    assert not sender.is_alive()
    assert stream.cancelled


async def test_nothing_is_sent_after_the_final_flag() -> None:
    stream = ResponseStream()
    stream.send(None, final=True)
    with pytest.raises(RuntimeError, match="already sent"):
        stream.send({"late": 1})
    stream.end(ValueError("ignored"))  # the model finished first: the failure is nobody's
    assert await stream.get() == (None, True)


async def test_end_finishes_a_stream_with_an_error() -> None:
    stream = ResponseStream()
    stream.send({"a": 1})
    error = ValueError("queue timeout")
    stream.end(error)
    assert await stream.get() == ({"a": 1}, False)
    assert await stream.get() == (error, True)


async def test_after_the_server_ends_a_stream_the_models_sends_are_dropped() -> None:
    stream = ResponseStream()
    stream.send({"a": 1})
    assert state(stream) == (False, False)
    stream.end(TimeoutError("stalled"))
    assert state(stream) == (True, True)  # the model may see it and stop
    stream.send({"late": 2})  # dropped, not an error: the model did nothing wrong
    stream.send(None, final=True)  # its final flag, which Triton asks for even then
    assert await stream.get() == ({"a": 1}, False)
    error, final = await stream.get()
    assert isinstance(error, TimeoutError)
    assert final


async def test_a_send_waiting_for_the_reader_is_seen_as_blocked() -> None:
    stream = ResponseStream(limit=1)
    stream.begin()
    started = stream.started_ns
    stream.send({"i": 0})
    assert stream.progress_ns >= started
    assert stream.resumed_ns == 0
    sender = threading.Thread(target=stream.send, args=({"i": 1},))
    sender.start()
    for _ in range(100):
        if stream.blocked:
            break
        await asyncio.sleep(0.01)
    assert stream.blocked  # the reader is behind: not the model's delay
    result, _, sent_ns = await stream.get_stamped()
    assert result == {"i": 0}
    assert sent_ns >= started
    sender.join(2)
    assert not blocked(stream)
    assert stream.resumed_ns >= sent_ns
    assert await stream.get() == ({"i": 1}, False)


def state(stream: ResponseStream) -> tuple[bool, bool]:
    return stream.cancelled, stream.over


def blocked(stream: ResponseStream) -> bool:
    return stream.blocked
