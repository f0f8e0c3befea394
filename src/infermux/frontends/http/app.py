"""The KServe V2 HTTP API (plus Triton's extensions) as a raw ASGI application.

No web framework: routing is one regular expression per resource, as in Triton's own HTTP server,
and every handler is a few lines that decode, call the data plane and encode (see
``docs/decisions.md`` for why raw ASGI).
"""

from __future__ import annotations

import logging
import re
import zlib
from collections.abc import Awaitable, Callable, MutableMapping
from dataclasses import dataclass
from typing import Any

from infermux.dataplane import DataPlane
from infermux.errors import ErrorCode, InfermuxError, InvalidArgumentError
from infermux.frontends.http import codec
from infermux.frontends.tensor_bytes import count_bytes_elements
from infermux.types import RepositoryIndexEntry, element_size

logger = logging.getLogger(__name__)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

HEADER_LENGTH = "inference-header-content-length"
DEFAULT_MAX_BODY = 64 * 1024 * 1024

STATUS_OF: dict[ErrorCode, int] = {
    ErrorCode.INTERNAL: 500,
    ErrorCode.NOT_FOUND: 404,
    ErrorCode.UNAVAILABLE: 503,
    ErrorCode.UNSUPPORTED: 501,
}
"""Triton's ``HttpCodeFromError``; every other code is 400."""

_MODEL_PATH = re.compile(r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?(?:/(infer|ready|config))?$")
_REPO_PATH = re.compile(r"^/v2/repository(?:/[^/]+)?/models/([^/]+)/(load|unload)$")
_JSON = [(b"content-type", b"application/json")]


class HttpError(InfermuxError):
    """An HTTP-only failure with its own status (413, 404 for unknown paths, 405, ...)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


@dataclass(slots=True)
class _Reply:
    status: int
    body: bytes = b""
    headers: list[tuple[bytes, bytes]] | None = None
    # Only inference responses honour Accept-Encoding, as in Triton: clients (tritonclient's aio
    # client among them) advertise gzip but decompress nothing else.
    compressible: bool = False


class HttpApp:
    """ASGI application over a :class:`DataPlane`. ``max_body`` bounds a request body in bytes."""

    def __init__(self, dataplane: DataPlane, *, max_body: int = DEFAULT_MAX_BODY) -> None:
        self._dp = dataplane
        self._max_body = max_body

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan and websocket are not served
            return
        headers = _headers(scope)
        try:
            reply = await self._route(scope["method"], scope["path"], headers, receive)
        except HttpError as exc:
            reply = _Reply(exc.status, codec.error_body(exc.message), list(_JSON))
        except InfermuxError as exc:
            reply = _Reply(STATUS_OF.get(exc.code, 400), codec.error_body(exc.message), list(_JSON))
        except Exception as exc:
            logger.exception("unhandled error serving %s %s", scope["method"], scope["path"])
            reply = _Reply(500, codec.error_body(f"internal error: {exc}"), list(_JSON))
        await _send(send, reply, headers.get("accept-encoding", ""))

    async def _route(
        self, method: str, path: str, headers: dict[str, str], receive: Receive
    ) -> _Reply:
        dp = self._dp
        if path in ("/v2/health/live", "/v2/health/ready"):
            _allow(method, "GET")
            ok = dp.live() if path.endswith("live") else dp.ready()
            return _Reply(200 if ok else 400)
        if path in ("/v2", "/v2/"):
            _allow(method, "GET")
            server = dp.server_metadata()
            return _json(
                {"name": server.name, "version": server.version, "extensions": server.extensions}
            )
        match = _MODEL_PATH.match(path)
        if match:
            name, version, action = match.group(1), match.group(2) or "", match.group(3)
            if action == "infer":
                _allow(method, "POST")
                body = await self._body(headers, receive)
                return await self._infer(name, version, headers, body)
            _allow(method, "GET")
            if action == "ready":
                if dp.model_ready(name, version):
                    return _Reply(200)
                return _Reply(400, codec.error_body("Model version not ready"), list(_JSON))
            if action == "config":
                return _json(dp.model_config(name, version).to_json_dict())
            meta = dp.model_metadata(name, version)
            return _json(
                {
                    "name": meta.name,
                    "versions": list(meta.versions),
                    "platform": meta.platform,
                    "inputs": [_tensor_meta(t) for t in meta.inputs],
                    "outputs": [_tensor_meta(t) for t in meta.outputs],
                }
            )
        if path == "/v2/repository/index" or re.match(r"^/v2/repository/[^/]+/index$", path):
            _allow(method, "POST")
            doc = await self._json_body(headers, receive)
            ready = doc.get("ready", False)
            if not isinstance(ready, bool):
                raise InvalidArgumentError("field 'ready' must be a boolean")
            return _json([_index_row(e) for e in dp.repository_index(ready_only=ready)])
        match = _REPO_PATH.match(path)
        if match:
            _allow(method, "POST")
            name, action = match.groups()
            doc = await self._json_body(headers, receive)
            params: Any = doc.get("parameters", {})
            if not isinstance(params, dict):
                raise InvalidArgumentError("field 'parameters' must be an object")
            if action == "load":
                files = [k for k in params if k.startswith("file:")]
                if files:
                    raise HttpError(
                        501, f"load parameter '{files[0]}': file overrides are not supported"
                    )
                override = params.get("config")
                if override is not None and not isinstance(override, str):
                    raise InvalidArgumentError("parameter 'config' must be a JSON string")
                await dp.load_model(name, config_override=override)
            else:
                await dp.unload_model(name)
            return _Reply(200)
        raise HttpError(404, "Not Found")

    async def _infer(self, name: str, version: str, headers: dict[str, str], body: bytes) -> _Reply:
        header_length = _header_length(headers)
        if header_length == 0:
            request = self._raw_request(name, version, body)
        else:
            request = codec.decode_infer_request(body, header_length, name, version)
        response = await self._dp.infer(request)
        encoded = codec.encode_infer_response(
            response, codec.request_output_parameters(request), request.parameters
        )
        if encoded.header_length is None:
            return _Reply(200, encoded.body, list(_JSON), compressible=True)
        return _Reply(
            200,
            encoded.body,
            [
                (b"content-type", b"application/octet-stream"),
                (HEADER_LENGTH.encode(), str(encoded.header_length).encode()),
            ],
            compressible=True,
        )

    def _raw_request(self, name: str, version: str, body: bytes) -> Any:
        config = self._dp.model_config(name, version)
        if len(config.inputs) != 1:
            raise InvalidArgumentError(
                f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
                f"exactly one input; '{name}' has {len(config.inputs)}"
            )
        spec = config.inputs[0]
        dims = list(spec.dims)
        if -1 in dims:
            known = 1
            for d in dims:
                known *= d if d != -1 else 1
            if dims.count(-1) > 1:
                raise InvalidArgumentError(
                    f"a raw binary request cannot infer the shape {dims} of input '{spec.name}'"
                )
            size = element_size(spec.datatype)
            total = count_bytes_elements(body) if size == 0 else len(body) // size
            dims[dims.index(-1)] = total // known if known else 0
        shape = ((1,) if config.batching else ()) + tuple(dims)
        return codec.decode_raw_request(
            body,
            model_name=name,
            model_version=version,
            input_name=spec.name,
            datatype=spec.datatype,
            shape=shape,
        )

    async def _json_body(self, headers: dict[str, str], receive: Receive) -> dict[str, Any]:
        body = await self._body(headers, receive)
        if not body.strip():
            return {}
        doc = codec.parse_json(body, "the request body")
        if not isinstance(doc, dict):
            raise InvalidArgumentError("the request body must be a JSON object")
        return doc

    async def _body(self, headers: dict[str, str], receive: Receive) -> bytes:
        declared = headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > self._max_body:
            raise HttpError(
                413, f"request body of {declared} bytes exceeds the limit of {self._max_body} bytes"
            )
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise HttpError(400, "client disconnected before sending the whole body")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self._max_body:
                raise HttpError(413, f"request body exceeds the limit of {self._max_body} bytes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding in ("", "identity"):
            return body
        return _decompress(body, encoding, self._max_body)


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}


def _header_length(headers: dict[str, str]) -> int | None:
    value = headers.get(HEADER_LENGTH)
    if value is None:
        return None
    value = value.strip()
    if not value.isdigit():
        raise InvalidArgumentError(
            "header 'Inference-Header-Content-Length' must be a non-negative integer, "
            f"got {value!r}"
        )
    return int(value)


def _allow(method: str, allowed: str) -> None:
    if method != allowed:
        raise HttpError(405, f"Method Not Allowed: use {allowed}")


def _json(doc: Any) -> _Reply:
    return _Reply(200, codec.dumps(doc), list(_JSON))


def _tensor_meta(t: Any) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def _index_row(entry: RepositoryIndexEntry) -> dict[str, str]:
    # Like Triton, a model that was never loaded is listed by name only.
    row = {"name": entry.name}
    for key in ("version", "state", "reason"):
        value = getattr(entry, key)
        if value:
            row[key] = value
    return row


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


async def _send(send: Send, reply: _Reply, accept_encoding: str) -> None:
    headers = list(reply.headers or [])
    body = reply.body
    if body and accept_encoding and reply.compressible:
        body, encoding = _compress(body, accept_encoding)
        if encoding is not None:
            headers.append((b"content-encoding", encoding))
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": reply.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
