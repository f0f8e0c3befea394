"""The bounded httptools protocol in-process, over a fake transport: head size classes (line
lengths, header counts, total size, unterminated heads, any chunking) end in the answer a model
of the limits predicts and never buffer past the limit by more than one read; the header and
body timeouts and the connection cap answer and close as documented."""

from __future__ import annotations

import asyncio
from typing import Any

import uvicorn
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from uvicorn.server import ServerState

from infermux.frontends.http.protocol import BoundedHttpToolsProtocol, protocol_class
from infermux.frontends.http.transport import Receive, Scope, Send
from infermux.settings import HttpLimits

LIMITS = HttpLimits()


class FakeTransport(asyncio.Transport):
    def __init__(self) -> None:
        super().__init__()
        self.written = bytearray()
        self.closed = False
        self.eof = False
        self.paused = False

    def write(self, data: bytes | bytearray | memoryview) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def is_closing(self) -> bool:
        return self.closed

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.eof = True

    def pause_reading(self) -> None:
        self.paused = True

    def resume_reading(self) -> None:
        self.paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        return default


async def ok_app(scope: Scope, receive: Receive, send: Send) -> None:
    """Reads the whole body, answers 200 'ok'."""
    while (await receive()).get("more_body", False):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-length", b"2")]})  # fmt: skip
    await send({"type": "http.response.body", "body": b"ok"})


def connect(
    loop: asyncio.AbstractEventLoop, limits: HttpLimits = LIMITS, state: ServerState | None = None
) -> tuple[BoundedHttpToolsProtocol, FakeTransport]:
    config = uvicorn.Config(ok_app, http=protocol_class(limits), lifespan="off", log_level="error")
    config.load()
    protocol = config.http_protocol_class(  # type: ignore[call-arg]
        config=config, server_state=state or ServerState(), app_state={}, _loop=loop
    )
    assert isinstance(protocol, BoundedHttpToolsProtocol)
    transport = FakeTransport()
    protocol.connection_made(transport)
    return protocol, transport


def status(transport: FakeTransport) -> int | None:
    if not transport.written:
        return None
    assert transport.written.startswith(b"HTTP/1.1 "), bytes(transport.written[:100])
    return int(transport.written.split()[1])


def paused(transport: FakeTransport) -> bool:
    return transport.paused  # a call: mypy would carry one assert's narrowing to the next


# -- head size classes ----------------------------------------------------------------------------

LINE = LIMITS.max_header_line_size
SIZES = [0, 10, 200, 4000, LINE - 40, LINE, LINE + 10, 70_000]


@st.composite
def heads(draw: st.DrawFn) -> tuple[bytes, int | None, set[int | None]]:
    """A request head of some size class, and the answers the limits allow for it."""
    url = b"/v2/health/live" + b"?" + b"q" * draw(st.sampled_from([0, 100, LINE - 30, LINE + 10]))
    count = draw(st.sampled_from([0, 1, 5, 98, 99, 100, 130]))
    sizes = draw(st.lists(st.sampled_from(SIZES), min_size=1, max_size=4))
    headers = [(b"x-h%d" % i, b"v" * sizes[i % len(sizes)]) for i in range(count)]
    terminated = draw(st.booleans())
    head = b"GET " + url + b" HTTP/1.1\r\n"
    head += b"".join(name + b": " + value + b"\r\n" for name, value in headers)
    head += b"\r\n" if terminated else b"x-open: " + b"o" * draw(st.sampled_from([10, 100_000]))
    lines = [len(name) + len(value) + 4 for name, value in headers]
    measured = len(url) + sum(lines)  # what the parser's callbacks see
    if not terminated:  # never whole: only the bytes received can refuse it
        allowed: set[int | None] = {431} if len(head) > LIMITS.max_header_size else {None}
    else:
        header_fault = any(line > LINE for line in lines) or count > LIMITS.max_header_count
        if len(url) > LINE:
            allowed = {414}
        elif header_fault or measured > LIMITS.max_header_size:
            allowed = {431}
        else:
            allowed = {200}
        if len(head) > LIMITS.max_header_size:
            allowed.add(431)  # the bytes received may pass the limit before the head is whole
    chunk = draw(st.sampled_from([None, 1, 7, 1000, 65536, 262144]))
    return head, chunk, allowed


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(heads())
def test_head_size_classes_end_as_the_limits_say(
    case: tuple[bytes, int | None, set[int | None]],
) -> None:
    head, chunk, allowed = case
    loop = asyncio.new_event_loop()
    try:
        protocol, transport = connect(loop)
        step = chunk or len(head)
        largest = 0
        for start in range(0, len(head), step):
            if transport.closed or transport.eof:
                break
            piece = head[start : start + step]
            largest = max(largest, len(piece))
            protocol.data_received(piece)
            # What the head holds never passes the limit by more than the last read.
            assert protocol._head_received <= LIMITS.max_header_size + largest
        loop.run_until_complete(asyncio.sleep(0.001))  # the app answers a complete request
        assert status(transport) in allowed, (bytes(transport.written[:300]), allowed)
        if status(transport) in (414, 431):
            assert transport.eof  # answered, then the write side shut (lingering close)
        protocol.connection_lost(None)
    finally:
        loop.close()


# -- timeouts and the connection cap --------------------------------------------------------------

FAST = HttpLimits(header_timeout=0.05, body_timeout=0.05, keep_alive_timeout=0.05)


async def test_a_partial_head_gets_408_and_an_idle_connection_a_silent_close() -> None:
    loop = asyncio.get_running_loop()
    partial, partial_transport = connect(loop, FAST)
    idle, idle_transport = connect(loop, FAST)
    partial.data_received(b"GET / HTTP/1.1\r\nHost:")
    await asyncio.sleep(0.2)
    assert status(partial_transport) == 408
    assert b"--http-header-timeout" in partial_transport.written
    assert idle_transport.closed
    assert idle_transport.written == b""
    partial.connection_lost(None)
    idle.connection_lost(None)


async def test_the_header_timeout_runs_again_for_the_next_request_only_from_its_first_byte() -> (
    None
):
    loop = asyncio.get_running_loop()
    protocol, transport = connect(loop, HttpLimits(header_timeout=0.1, keep_alive_timeout=60))
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.3)  # answered, then idle under the keep-alive timeout
    assert status(transport) == 200
    assert not transport.closed
    transport.written.clear()
    protocol.data_received(b"GET / HTTP/1.1\r\n")
    await asyncio.sleep(0.3)
    assert status(transport) == 408
    protocol.connection_lost(None)


async def test_an_idle_body_gets_408_and_the_app_sees_a_disconnect() -> None:
    loop = asyncio.get_running_loop()
    protocol, transport = connect(loop, FAST)
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 10\r\n\r\n12")
    await asyncio.sleep(0.2)
    assert status(transport) == 408
    assert b"--http-body-timeout" in transport.written
    assert protocol.cycle.disconnected
    protocol.connection_lost(None)


async def test_a_body_that_keeps_coming_is_not_cut() -> None:
    loop = asyncio.get_running_loop()
    protocol, transport = connect(loop, HttpLimits(body_timeout=1.0))
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: 8\r\n\r\n")
    for byte in b"12345678":  # 1.2 s in all, never 1 s without a byte
        await asyncio.sleep(0.15)
        protocol.data_received(bytes([byte]))
    await asyncio.sleep(0.05)
    assert status(transport) == 200
    protocol.connection_lost(None)


async def test_the_body_timeout_waits_while_the_server_paused_reading() -> None:
    loop = asyncio.get_running_loop()
    protocol, transport = connect(loop, HttpLimits(body_timeout=0.5))
    busy = asyncio.Event()

    async def busy_app(scope: Scope, receive: Receive, send: Send) -> None:
        await busy.wait()  # not taking the body yet
        await ok_app(scope, receive, send)

    protocol.app = busy_app
    size = 100_000
    protocol.data_received(b"POST / HTTP/1.1\r\nHost: t\r\nContent-Length: %d\r\n\r\n" % size)
    protocol.data_received(b"b" * (size - 10))  # past uvicorn's 64 KiB: it pauses reading
    assert paused(transport)
    await asyncio.sleep(1.5)  # three body timeouts, all the server's
    assert status(transport) is None
    busy.set()
    await asyncio.sleep(0)
    assert not paused(transport)
    protocol.data_received(b"b" * 10)
    await asyncio.sleep(0.01)
    assert status(transport) == 200
    protocol.connection_lost(None)


async def test_a_connection_beyond_the_cap_gets_503_and_the_others_are_kept() -> None:
    loop = asyncio.get_running_loop()
    state = ServerState()
    limits = HttpLimits(max_connections=2)
    first = [connect(loop, limits, state) for _ in range(2)]
    extra, extra_transport = connect(loop, limits, state)
    assert status(extra_transport) == 503
    assert b"at most 2 at once (--http-max-connections)" in extra_transport.written
    assert extra_transport.eof
    protocol, transport = first[0]
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0.01)
    assert status(transport) == 200
    for protocol, _ in [*first, (extra, extra_transport)]:
        protocol.connection_lost(None)


async def test_an_over_long_pipelined_head_only_cuts_the_connection() -> None:
    """Answering 431 while the first request is still with the app would look like its answer."""
    loop = asyncio.get_running_loop()
    protocol, transport = connect(loop)
    slow = asyncio.Event()

    async def waiting_app(scope: Scope, receive: Receive, send: Send) -> None:
        await slow.wait()

    protocol.app = waiting_app
    protocol.data_received(b"GET / HTTP/1.1\r\nHost: t\r\n\r\n")
    await asyncio.sleep(0)  # the first request is with the app
    protocol.data_received(b"GET / HTTP/1.1\r\nX: " + b"a" * 70_000)
    assert transport.closed
    assert transport.written == b""
    protocol.connection_lost(None)
    slow.set()
    await asyncio.sleep(0.01)
