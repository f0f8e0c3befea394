"""HTTP plumbing under the V2 handlers: ASGI types, bounded body reading, compression, replies."""

from __future__ import annotations

import asyncio
import zlib
from collections.abc import AsyncIterator, Awaitable, Callable, MutableMapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

from infermux.errors import ErrorCode, InfermuxError, InvalidArgumentError
from infermux.frontends.http import codec

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
T = TypeVar("T")

STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}
"""Triton's ``HttpCodeFromError``; every other code is 400."""

JSON_TYPE = (b"content-type", b"application/json")


class HttpError(InfermuxError):
    """An HTTP-only failure with its own status (413, 404 for unknown paths, 405, ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class Reply:
    """A response to send. Only inference replies are ``compressible``: as in Triton, clients
    (tritonclient's aio client among them) advertise gzip but decompress nothing else."""

    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] = field(default_factory=list)
    compressible: bool = False
    events: AsyncIterator[bytes] | None = None
    """A streamed body (server-sent events) sent after ``body``, chunk by chunk, as it comes:
    see :func:`send_streamed`."""

    @classmethod
    def json(cls, doc: Any) -> Reply:
        return cls(200, codec.dumps(doc), [JSON_TYPE])

    @classmethod
    def error(cls, status: int, message: str) -> Reply:
        return cls(status, codec.error_body(message), [JSON_TYPE])

    @classmethod
    def of_exception(cls, exc: InfermuxError) -> Reply:
        status = exc.status if isinstance(exc, HttpError) else STATUS_OF.get(exc.code, 400)
        return cls.error(status, exc.message)


@dataclass(slots=True)
class Request:
    """What handlers see of an HTTP request; the body is read on demand, bounded."""

    method: str
    path: str
    headers: dict[str, str]
    receive: Receive
    max_body: int

    @classmethod
    def from_scope(cls, scope: Scope, receive: Receive, max_body: int) -> Request:
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        return cls(scope["method"], scope["path"], headers, receive, max_body)

    def allow(self, method: str) -> None:
        if self.method != method:
            raise HttpError(405, f"Method Not Allowed: use {method}")

    async def body(self) -> bytes:
        """The whole body, decompressed; 413 beyond ``max_body`` (before or after inflating)."""
        limit = self.max_body
        declared = self.headers.get("content-length")
        if (
            declared is not None
            and declared.isascii()
            and declared.isdigit()
            and int(declared) > limit
        ):
            raise HttpError(
                413, f"request body of {declared} bytes exceeds the limit of {limit} bytes"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await self.receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"request body exceeds the limit of {limit} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = self.headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return body
        return _decompress(body, encoding, limit)

    async def unless_disconnected(self, work: Awaitable[T]) -> T:
        """Await ``work``, cancelling it if the client disconnects first (it leaves the queue)."""
        task = asyncio.ensure_future(work)
        watcher = asyncio.ensure_future(self._disconnected())
        try:
            await asyncio.wait((task, watcher), return_when=asyncio.FIRST_COMPLETED)
        finally:
            if not task.done():
                # Only asked to stop: it is not done yet, so its result must not be read. If
                # it ends in an error rather than cancelled, that error is moot (nobody to
                # answer) and is retrieved here so that asyncio does not log it.
                task.cancel()
                task.add_done_callback(_retrieve)
            watcher.cancel()
        if not task.done() or task.cancelled():
            raise HttpError(499, "client disconnected before the response was ready")
        return task.result()

    async def disconnected(self) -> None:
        """Return once the client has gone (call it after the whole body was read)."""
        await self._disconnected()

    async def _disconnected(self) -> None:
        # After the whole body was read, the server's next message is the disconnect.
        while (await self.receive())["type"] != "http.disconnect":
            pass

    async def json_object(self) -> dict[str, Any]:
        """The body as a JSON object; an empty body is ``{}``."""
        body = await self.body()
        if not body.strip():
            return {}
        doc = codec.parse_json(body, "the request body")
        if not isinstance(doc, dict):
            raise InvalidArgumentError("the request body must be a JSON object")
        return doc


def _retrieve(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()


def _decompress(body: bytes, encoding: str, limit: int) -> bytes:
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
    if wbits is None:
        raise HttpError(415, f"unsupported Content-Encoding '{encoding}' (use gzip or deflate)")
    decompressor = zlib.decompressobj(wbits)
    try:
        data = decompressor.decompress(body, limit + 1)
    except zlib.error as exc:
        raise InvalidArgumentError(f"body is not valid {encoding} data: {exc}") from None
    if len(data) > limit or decompressor.unconsumed_tail:
        raise HttpError(413, f"decompressed request body exceeds the limit of {limit} bytes")
    if not decompressor.eof:
        raise InvalidArgumentError(f"body is truncated {encoding} data")
    return data


def _compress(body: bytes, accept: str) -> tuple[bytes, bytes | None]:
    accepted = {part.split(";")[0].strip().lower() for part in accept.split(",")}
    if "gzip" in accepted:
        compressor = zlib.compressobj(wbits=16 + zlib.MAX_WBITS)
        return compressor.compress(body) + compressor.flush(), b"gzip"
    if "deflate" in accepted:
        return zlib.compress(body), b"deflate"
    return body, None


async def send_reply(send: Send, reply: Reply, accept_encoding: str) -> None:
    headers = list(reply.headers)
    body = reply.body
    if body and accept_encoding and reply.compressible:
        body, encoding = _compress(body, accept_encoding)
        if encoding is not None:
            headers.append((b"content-encoding", encoding))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_streamed(send: Send, reply: Reply, request: Request) -> None:
    """Send a reply whose body streams from ``reply.events``. A client that disconnects stops
    the stream: the iterator is closed at once (which gives its request up), not drained."""
    events = reply.events
    if events is None:
        raise ValueError("send_streamed needs a reply with events")
    await send({"type": "http.response.start", "status": reply.status, "headers": reply.headers})
    pump = asyncio.ensure_future(_pump(send, reply.body, events))
    watcher = asyncio.ensure_future(request.disconnected())
    try:
        await asyncio.wait((pump, watcher), return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (pump, watcher):
            task.cancel()
        await asyncio.gather(pump, watcher, return_exceptions=True)
        aclose = getattr(events, "aclose", None)
        if aclose is not None:
            await aclose()
    if pump.done() and not pump.cancelled() and pump.exception() is None:
        await send({"type": "http.response.body", "body": b""})


async def _pump(send: Send, first: bytes, events: AsyncIterator[bytes]) -> None:
    if first:
        await send({"type": "http.response.body", "body": first, "more_body": True})
    async for chunk in events:
        await send({"type": "http.response.body", "body": chunk, "more_body": True})
