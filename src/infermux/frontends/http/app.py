"""The KServe V2 HTTP API (plus Triton's extensions) as a raw ASGI application.

No web framework: a table of regular expressions, as in Triton's own HTTP server, maps each
path to a handler of a few lines that decodes, calls the data plane and encodes
(``docs/decisions.md`` says why raw ASGI). Plumbing (bodies, compression) is in ``transport.py``,
JSON documents in ``documents.py``, inference bodies in ``codec.py``.
"""

from __future__ import annotations

import base64
import binascii
import logging
import re
from collections.abc import Awaitable, Callable
from importlib import resources
from typing import Any

from infermux.dataplane import Operations
from infermux.errors import InfermuxError, InvalidArgumentError
from infermux.frontends.access import OPEN, Access, Denied, Kind
from infermux.frontends.http import codec, documents, generate_routes, traffic
from infermux.frontends.http.transport import (
    JSON_TYPE,
    HttpError,
    Receive,
    Reply,
    Request,
    Scope,
    Send,
    send_reply,
    send_streamed,
)
from infermux.frontends.model_first import unknown_model_first
from infermux.observability import tracing
from infermux.repository.overrides import FILE_PREFIX
from infermux.routing.router import ROUTING_KEY_HEADER, ROUTING_KEY_PARAMETER
from infermux.tensor_bytes import count_bytes_elements
from infermux.types import InferRequest, element_size

logger = logging.getLogger(__name__)

# The committed description of every route below (tests keep the two in step), served as is.
OPENAPI_DOCUMENT = (resources.files("infermux.frontends.http") / "openapi.json").read_bytes()

HEADER_LENGTH = "inference-header-content-length"
DEFAULT_MAX_BODY = 64 * 1024 * 1024

Handler = Callable[[Request, "re.Match[str]"], Awaitable[Reply]]
Classify = Callable[[Request, "re.Match[str]"], Kind]


def _always(kind: Kind) -> Classify:
    return lambda request, match: kind


def _changes_traffic(request: Request, match: re.Match[str]) -> Kind:
    # GET is the report; POST/DELETE on the policy, promote and rollback change it.
    return Kind.INFERENCE if request.method == "GET" and match.group(2) is None else Kind.ADMIN


def _registers(request: Request, match: re.Match[str]) -> Kind:
    return Kind.INFERENCE if match.group(2) == "status" else Kind.ADMIN


class HttpApp:
    """ASGI application over the data plane's :class:`Operations`; ``max_body`` bounds a
    request body in bytes."""

    def __init__(
        self,
        dataplane: Operations,
        *,
        max_body: int = DEFAULT_MAX_BODY,
        access: Access = OPEN,
    ) -> None:
        self._dp = dataplane
        self._max_body = max_body
        self._access = access
        inference = _always(Kind.INFERENCE)
        # Order matters: "/v2/models/stats" must win over a model named "stats".
        self._routes: list[tuple[re.Pattern[str], Handler, Classify]] = [
            (re.compile(r"^/v2/health/(live|ready)$"), self._health, _always(Kind.HEALTH)),
            (re.compile(r"^/openapi\.json$"), self._openapi, _always(Kind.HEALTH)),
            (re.compile(r"^/v2/?$"), self._server_metadata, inference),
            (re.compile(r"^/v2/models/stats$"), self._all_statistics, inference),
            (traffic.PATTERN, self._traffic, _changes_traffic),
            (
                re.compile(
                    r"^/v2/models/([^/]+)(?:/versions/([0-9]+))?"
                    r"(?:/(infer|ready|config|stats|generate|generate_stream))?$"
                ),
                self._model,
                inference,
            ),
            (re.compile(r"^/v2/repository(?:/[^/]+)?/index$"), self._repository_index, inference),
            (re.compile(r"^/v2/logging$"), self._logging, _always(Kind.ADMIN)),
            (
                re.compile(r"^/v2(?:/models/([^/]+)(?:/versions/[0-9]+)?)?/trace/setting$"),
                self._trace,
                _always(Kind.ADMIN),
            ),
            (
                re.compile(r"^/v2/repository(?:/[^/]+)?/models/([^/]+)/(load|unload)$"),
                self._repository_control,
                _always(Kind.ADMIN),
            ),
            (
                re.compile(
                    r"^/v2/systemsharedmemory(?:/region/([^/]+))?/(status|register|unregister)$"
                ),
                self._system_shared_memory,
                _registers,
            ),
            (
                re.compile(
                    r"^/v2/cudasharedmemory(?:/region/([^/]+))?/(status|register|unregister)$"
                ),
                self._cuda_shared_memory,
                _registers,
            ),
        ]

    @property
    def route_patterns(self) -> list[re.Pattern[str]]:
        """Every path this app serves (``openapi.json`` must describe each; a test checks)."""
        return [pattern for pattern, _, _ in self._routes]

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":  # lifespan and websocket are not served
            return
        request = Request.from_scope(scope, receive, self._max_body)
        try:
            reply = await self._dispatch(request)
        except InfermuxError as exc:
            reply = Reply.of_exception(exc)
        except Exception as exc:
            logger.exception("unhandled error serving %s %s", request.method, request.path)
            reply = Reply.error(500, f"internal error: {exc}")
        if reply.events is not None:
            await send_streamed(send, reply, request)
            return
        await send_reply(send, reply, request.headers.get("accept-encoding", ""))

    async def _dispatch(self, request: Request) -> Reply:
        for pattern, handler, classify in self._routes:
            match = pattern.match(request.path)
            if match:
                if not self._access.open:
                    try:
                        kind = classify(request, match)
                        self._access.check(kind, request.headers.get("authorization"))
                    except Denied as denied:
                        return _denied(denied)
                return await handler(request, match)
        raise HttpError(404, "Not Found")

    # -- health, metadata, config, statistics -----------------------------------------------------

    async def _health(self, request: Request, match: re.Match[str]) -> Reply:
        request.allow("GET")
        ok = self._dp.live() if match.group(1) == "live" else await self._dp.ready()
        return Reply(200 if ok else 400)

    async def _openapi(self, request: Request, match: re.Match[str]) -> Reply:
        request.allow("GET")
        return Reply(200, OPENAPI_DOCUMENT, [JSON_TYPE], compressible=True)

    async def _server_metadata(self, request: Request, match: re.Match[str]) -> Reply:
        request.allow("GET")
        return Reply.json(documents.server_metadata(self._dp.server_metadata()))

    async def _all_statistics(self, request: Request, match: re.Match[str]) -> Reply:
        request.allow("GET")
        return Reply.json(documents.statistics(await self._dp.model_statistics()))

    async def _traffic(self, request: Request, match: re.Match[str]) -> Reply:
        return await traffic.handle(self._dp, request, match)

    async def _model(self, request: Request, match: re.Match[str]) -> Reply:
        name, version, action = match.group(1), match.group(2) or "", match.group(3)
        dp = self._dp
        if action == "infer":
            request.allow("POST")
            return await self._infer(request, name, version)
        if action == "generate":
            request.allow("POST")
            return await generate_routes.handle_generate(self._dp, request, name, version)
        if action == "generate_stream":
            request.allow("POST")
            return await generate_routes.handle_stream(self._dp, request, name, version)
        request.allow("GET")
        if action == "ready":
            if await dp.model_ready(name, version):
                return Reply(200)
            return Reply.error(400, "Model version not ready")
        if action == "config":
            return Reply.json((await dp.model_config(name, version)).to_json_dict())
        if action == "stats":
            return Reply.json(documents.statistics(await dp.model_statistics(name, version)))
        return Reply.json(documents.model_metadata(await dp.model_metadata(name, version)))

    # -- inference --------------------------------------------------------------------------------

    async def _infer(self, request: Request, name: str, version: str) -> Reply:
        body = await request.body()
        try:
            header_length = _header_length(request.headers)
            if header_length == 0:
                infer_request = await self._raw_request(name, version, body)
            else:
                infer_request = codec.decode_infer_request(body, header_length, name, version)
        except InvalidArgumentError as exc:
            await unknown_model_first(self._dp, name, version, exc)
        infer_request.trace_context = tracing.carrier(request.headers)
        key = request.headers.get(ROUTING_KEY_HEADER)
        if key is not None:
            infer_request.parameters.setdefault(ROUTING_KEY_PARAMETER, key)
        response = await request.unless_disconnected(self._dp.infer(infer_request))
        encoded = codec.encode_infer_response(
            response, codec.request_output_parameters(infer_request), infer_request.parameters
        )
        if encoded.header_length is None:
            return Reply(200, encoded.body, [JSON_TYPE], compressible=True)
        headers = [
            (b"content-type", b"application/octet-stream"),
            (HEADER_LENGTH.encode(), str(encoded.header_length).encode()),
        ]
        return Reply(200, encoded.body, headers, compressible=True)

    async def _raw_request(self, name: str, version: str, body: bytes) -> InferRequest:
        config = await self._dp.model_config(name, version)
        if len(config.inputs) != 1:
            raise InvalidArgumentError(
                f"a raw binary request (Inference-Header-Content-Length: 0) needs a model with "
                f"exactly one input; '{name}' has {len(config.inputs)}"
            )
        spec = config.inputs[0]
        dims = list(spec.dims)
        if -1 in dims:
            if dims.count(-1) > 1:
                raise InvalidArgumentError(
                    f"a raw binary request cannot infer the shape {dims} of input '{spec.name}'"
                )
            known = 1
            for d in dims:
                known *= d if d != -1 else 1
            size = element_size(spec.datatype)
            total = count_bytes_elements(body) if size == 0 else len(body) // size
            dims[dims.index(-1)] = total // known
        shape = ((1,) if config.batching else ()) + tuple(dims)
        return codec.decode_raw_request(
            body,
            model_name=name,
            model_version=version,
            input_name=spec.name,
            datatype=spec.datatype,
            shape=shape,
        )

    # -- logging extension ------------------------------------------------------------------------

    async def _logging(self, request: Request, match: re.Match[str]) -> Reply:
        if request.method == "GET":
            return Reply.json(await self._dp.log_settings())
        request.allow("POST")
        return Reply.json(await self._dp.log_settings(await request.json_object()))

    # -- trace extension --------------------------------------------------------------------------

    async def _trace(self, request: Request, match: re.Match[str]) -> Reply:
        model = match.group(1) or ""  # a version in the path is Triton's, and ignored as there
        if request.method == "GET":
            return Reply.json(await self._dp.trace_settings(model))
        request.allow("POST")
        return Reply.json(await self._dp.trace_settings(model, await request.json_object()))

    # -- model repository extension ---------------------------------------------------------------

    async def _repository_index(self, request: Request, match: re.Match[str]) -> Reply:
        request.allow("POST")
        ready = (await request.json_object()).get("ready", False)
        if not isinstance(ready, bool):
            raise InvalidArgumentError("field 'ready' must be a boolean")
        return Reply.json(
            [documents.index_row(e) for e in await self._dp.repository_index(ready_only=ready)]
        )

    async def _repository_control(self, request: Request, match: re.Match[str]) -> Reply:
        request.allow("POST")
        name, action = match.groups()
        params: Any = (await request.json_object()).get("parameters", {})
        if not isinstance(params, dict):
            raise InvalidArgumentError("field 'parameters' must be an object")
        if action == "unload":
            await self._dp.unload_model(name)
            return Reply(200)
        override = params.get("config")
        if override is not None and not isinstance(override, str):
            raise InvalidArgumentError(
                f"failed to load '{name}': parameter 'config' must be a ModelConfig JSON string"
            )
        files: dict[str, bytes] = {}
        for key, value in params.items():
            if not key.startswith(FILE_PREFIX):
                continue
            try:
                if not isinstance(value, str):
                    raise ValueError
                files[key.removeprefix(FILE_PREFIX)] = base64.b64decode(value, validate=True)
            except (ValueError, binascii.Error):
                raise InvalidArgumentError(
                    f"failed to load '{name}': load parameter '{key}' must be the file's "
                    "content in base64"
                ) from None
        await self._dp.load_model(name, config_override=override, files=files or None)
        return Reply(200)

    # -- shared memory extensions -----------------------------------------------------------------

    async def _system_shared_memory(self, request: Request, match: re.Match[str]) -> Reply:
        region, action = match.group(1) or "", match.group(2)
        if action == "status":
            request.allow("GET")
            return Reply.json(documents.shm_status(await self._dp.shm_status(region)))
        request.allow("POST")
        if action == "unregister":
            await self._dp.shm_unregister(region)
            return Reply(200)
        if not region:
            raise HttpError(404, "Not Found")
        doc = await request.json_object()
        key = doc.get("key")
        if not isinstance(key, str):
            raise InvalidArgumentError("field 'key' must be a string")
        offset, byte_size = _integer(doc, "offset", 0), _integer(doc, "byte_size", None)
        await self._dp.shm_register(region, key, offset, byte_size)
        return Reply(200)

    async def _cuda_shared_memory(self, request: Request, match: re.Match[str]) -> Reply:
        region, action = match.group(1) or "", match.group(2)
        if action == "status":
            request.allow("GET")
            return Reply.json(documents.cuda_shm_status(await self._dp.cuda_shm_status(region)))
        request.allow("POST")
        if action == "unregister":
            await self._dp.cuda_shm_unregister(region)
            return Reply(200)
        if not region:
            raise HttpError(404, "Not Found")
        doc = await request.json_object()
        handle = doc.get("raw_handle")
        encoded = handle.get("b64") if isinstance(handle, dict) else None
        if not isinstance(encoded, str):
            raise InvalidArgumentError("field 'raw_handle' must be an object {\"b64\": string}")
        try:
            raw = base64.b64decode(encoded, validate=True)
        except (binascii.Error, ValueError):  # ValueError: characters outside ASCII
            raise InvalidArgumentError("field 'raw_handle.b64' is not valid base64") from None
        device_id, byte_size = _integer(doc, "device_id", 0), _integer(doc, "byte_size", None)
        await self._dp.cuda_shm_register(region, raw, device_id, byte_size)
        return Reply(200)


def _header_length(headers: dict[str, str]) -> int | None:
    value = headers.get(HEADER_LENGTH)
    if value is None:
        return None
    value = value.strip()
    if not (value.isascii() and value.isdigit()):  # "¹".isdigit(), but int("¹") fails
        raise InvalidArgumentError(
            "header 'Inference-Header-Content-Length' must be a non-negative integer, "
            f"got {value!r}"
        )
    return int(value)


def _integer(doc: dict[str, Any], field: str, default: int | None) -> int:
    value = doc.get(field, default)
    if not isinstance(value, int) or isinstance(value, bool):
        raise InvalidArgumentError(f"field '{field}' must be an integer")
    return value


def _denied(denied: Denied) -> Reply:
    if not denied.unauthenticated:
        return Reply.error(403, denied.message)
    reply = Reply.error(401, denied.message)
    reply.headers.append((b"www-authenticate", b'Bearer realm="infermux"'))
    return reply
