"""uvicorn's httptools protocol, bounded: what one client's connection may hold of the process.

uvicorn (0.54) with httptools bounds none of it: llhttp accepts header lines of any length and
httptools grows each partial header value by concatenation, so one unterminated 40 MiB header
costs its 40 MiB (quadratically copied); a connection that trickles a byte a second is never
closed (uvicorn's keep-alive timer only runs between requests, and any byte cancels it); and
``limit_concurrency`` is load shedding, not a connection cap: once that many connections are
open, *every* request gets 503, the well-behaved ones' included. h11 would bound the head
(``h11_max_incomplete_event_size``) but is several times slower and still has no timeouts, so
this subclass adds, per :class:`~infermux.settings.HttpLimits` (docs/decisions.md):

- head size: the request line (414) and each header line (431) within a line limit, the head
  within a total, header fields within a count (431). A whole head is measured once, when it
  completes; one still arriving (an unterminated line, which httptools buffers out of sight)
  by the bytes received since it began, so at most one read (256 KiB) passes the limit before
  the connection is answered;
- a header timeout: the whole head within N seconds of the connection (or, between requests,
  of its first byte); 408 if some of it came, a silent close if nothing did. Timers are armed
  only for a head or body that spans reads: a request that arrives in one read costs none;
- a body timeout: N seconds without a read of a body the app waits for is 408 and close (not
  while the server itself paused reading: that wait is the server's, not the client's);
- the keep-alive timeout as a float flag;
- a connection cap: a connection beyond it is answered 503 at once and closed, and the open
  ones keep being served.

Refusals are written with ``Connection: close``, then the write side is shut and what the
client still sends is read and dropped for a moment (nginx's lingering close), so that it reads
the answer rather than a reset.
"""

from __future__ import annotations

import asyncio
from typing import Any, ClassVar

import httptools
from uvicorn.protocols.http.httptools_impl import STATUS_LINE, HttpToolsProtocol

from infermux.frontends.http import codec
from infermux.settings import HttpLimits

LINGER_SECONDS = 2.0
"""How long a refused connection's further bytes are read and dropped before it is closed."""


class _Refused(Exception):
    """Raised in a parser callback to stop parsing and answer ``status``."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def _printable(name: bytes) -> str:
    # A client's header name goes into the error message: short and printable only.
    text = name[:64].decode("latin-1")
    return "".join(c if c.isprintable() else "?" for c in text)


class BoundedHttpToolsProtocol(HttpToolsProtocol):
    """uvicorn's ``HttpToolsProtocol`` under :attr:`limits` (set by :func:`protocol_class`)."""

    limits: ClassVar[HttpLimits] = HttpLimits()

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.timeout_keep_alive = self.limits.keep_alive_timeout  # type: ignore[assignment]
        self._head_open = True  # the next bytes belong to a request head
        self._head_received = 0  # bytes received since that head began (an upper bound)
        self._head_deadline: float | None = None  # when the head under way is due
        self._head_timer: asyncio.TimerHandle | None = None
        self._body_timer: asyncio.TimerHandle | None = None
        self._last_read = 0.0
        self._lingering = False

    # -- connection ---------------------------------------------------------------------------

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        over = len(self.connections) >= self.limits.max_connections
        super().connection_made(transport)
        if over:
            self._refuse(
                503,
                f"too many connections: this front end serves at most "
                f"{self.limits.max_connections} at once (--http-max-connections)",
                linger=len(self.connections) <= 2 * self.limits.max_connections,
            )
            return
        # The first head is due within the timeout of the connection, even if no byte comes.
        self._head_deadline = self.loop.time() + self.limits.header_timeout
        self._head_timer = self.loop.call_at(self._head_deadline, self._head_timed_out)

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel_timers()
        super().connection_lost(exc)

    def data_received(self, data: bytes) -> None:
        if self._lingering:
            return  # refused: what still comes is dropped
        self._unset_keepalive_if_required()
        if self._head_open:
            if self._head_deadline is None:  # between requests: the head starts now
                self._head_deadline = self.loop.time() + self.limits.header_timeout
            self._head_received += len(data)
        elif self._body_timer is not None:
            self._last_read = self.loop.time()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserCallbackError as exc:
            refused = exc.__context__
            if isinstance(refused, _Refused):
                self._refuse(refused.status, refused.message)
            else:
                self._bad_request()
            return
        except httptools.HttpParserError:
            self._bad_request()
            return
        except httptools.HttpParserUpgrade:
            if self._should_upgrade():
                self.handle_websocket_upgrade()
            else:
                self._unsupported_upgrade_warning()
            return
        # Timers only for what spans reads: a head or body that came whole costs none.
        if self._head_open:
            if self._head_received > self.limits.max_header_size:
                self._refuse(431, self._head_too_large())
            elif self._head_timer is None and self._head_deadline is not None:
                self._head_timer = self.loop.call_at(self._head_deadline, self._head_timed_out)
        elif self._body_timer is None:
            self._last_read = self.loop.time()
            self._body_timer = self.loop.call_later(self.limits.body_timeout, self._body_timed_out)

    def _bad_request(self) -> None:
        message = "Invalid HTTP request received."
        self.logger.warning(message)
        self.send_400_response(message)

    # -- parser callbacks ---------------------------------------------------------------------

    def on_headers_complete(self) -> None:
        # Lines are measured once the head is whole, not per callback (on the hot path): until
        # then, the bytes received bound them (data_received).
        limits = self.limits
        if len(self.url) > limits.max_header_line_size:
            raise _Refused(
                414,
                f"the request line is longer than {limits.max_header_line_size} bytes "
                "(--http-max-header-line-size)",
            )
        if len(self.headers) > limits.max_header_count:
            raise _Refused(
                431,
                f"the request has more than {limits.max_header_count} header fields "
                "(--http-max-header-count)",
            )
        size = len(self.url)
        for name, value in self.headers:
            line = len(name) + len(value) + 4  # "name: value\r\n"
            if line > limits.max_header_line_size:
                raise _Refused(
                    431,
                    f"header '{_printable(name)}' is longer than {limits.max_header_line_size} "
                    "bytes (--http-max-header-line-size)",
                )
            size += line
        if size > limits.max_header_size:
            raise _Refused(431, self._head_too_large())
        self._head_open = False
        self._head_received = 0
        self._head_deadline = None
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._head_open = True
        self._head_received = 0
        self._head_deadline = None
        if self._body_timer is not None:
            self._body_timer.cancel()
            self._body_timer = None

    # -- timeouts -----------------------------------------------------------------------------

    def _head_timed_out(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        if self.cycle is not None and not self.cycle.response_complete:
            # A response is under way (the slow head is a pipelined next request): the
            # connection closes once that response is sent.
            self.cycle.keep_alive = False
            return
        if self._head_received == 0:
            self.transport.close()  # nothing came: no request to answer
            return
        self._refuse(
            408,
            f"the request head did not arrive within {self.limits.header_timeout:g} s "
            "(--http-header-timeout)",
        )

    def _body_timed_out(self) -> None:
        timeout, now = self.limits.body_timeout, self.loop.time()
        if self.flow.read_paused:
            # The server stopped reading (the app has not taken the body so far): that wait
            # is not the client's.
            self._last_read = now
        idle = now - self._last_read
        if idle < timeout:
            self._body_timer = self.loop.call_later(timeout - idle, self._body_timed_out)
            return
        self._body_timer = None
        if self.transport.is_closing():
            return
        cycle = self.cycle
        if cycle.response_started:
            self.transport.close()
            return
        # The app waits for the rest of the body: it sees a disconnect, and its answer, if it
        # still gives one, is dropped for this one.
        cycle.disconnected = True
        cycle.message_event.set()
        self._refuse(408, f"no request body bytes arrived for {timeout:g} s (--http-body-timeout)")

    def _cancel_timers(self) -> None:
        for timer in (self._head_timer, self._body_timer):
            if timer is not None:
                timer.cancel()
        self._head_timer = self._body_timer = None

    # -- refusals -----------------------------------------------------------------------------

    def _head_too_large(self) -> str:
        return (
            f"the request head is larger than {self.limits.max_header_size} bytes "
            "(--http-max-header-size)"
        )

    def _refuse(self, status: int, message: str, *, linger: bool = True) -> None:
        """Answer ``status`` and close (a request still being answered is only cut: the answer
        would be taken for its own)."""
        self._cancel_timers()
        self._lingering = True
        transport = self.transport
        cycle = self.cycle
        if cycle is not None and not cycle.response_complete and not cycle.disconnected:
            transport.close()
            return
        self.logger.info("HTTP %d to %s: %s", status, self.client, message)
        body = codec.error_body(message)
        head = b"".join(
            [
                STATUS_LINE[status],
                b"content-type: application/json\r\n",
                b"content-length: %d\r\n" % len(body),
                b"connection: close\r\n\r\n",
            ]
        )
        transport.write(head + body)
        if not linger or not transport.can_write_eof():  # TLS cannot half-close
            transport.close()
            return
        transport.write_eof()
        self.flow.resume_reading()
        self.loop.call_later(LINGER_SECONDS, transport.close)


def protocol_class(limits: HttpLimits) -> type[BoundedHttpToolsProtocol]:
    """The protocol class uvicorn instantiates per connection, under ``limits``."""

    class Bounded(BoundedHttpToolsProtocol):
        pass

    Bounded.limits = limits
    return Bounded
