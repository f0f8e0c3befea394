"""The handlers of Triton's generate extension: ``/generate`` (one JSON answer) and
``/generate_stream`` (server-sent events, one per response), both over the data plane's
``infer_stream``, so that they serve decoupled models as well as the others."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from infermux.dataplane import Operations
from infermux.errors import InfermuxError, InvalidArgumentError
from infermux.frontends.http import codec, generate
from infermux.frontends.http.transport import JSON_TYPE, STATUS_OF, Reply, Request
from infermux.observability import tracing
from infermux.routing.router import ROUTING_KEY_HEADER, ROUTING_KEY_PARAMETER
from infermux.types import InferRequest, InferResponse

logger = logging.getLogger(__name__)

EVENT_STREAM_TYPE = (b"content-type", b"text/event-stream; charset=utf-8")


async def _request(dp: Operations, request: Request, name: str, version: str) -> InferRequest:
    body = await request.body()
    config = await dp.model_config(name, version)  # an unknown model is a 404 before the body
    doc = codec.parse_json(body, "the generate request") if body.strip() else {}
    infer_request = generate.decode_request(doc, config, version)
    infer_request.trace_context = tracing.carrier(request.headers)
    key = request.headers.get(ROUTING_KEY_HEADER)
    if key is not None:
        infer_request.parameters.setdefault(ROUTING_KEY_PARAMETER, key)
    return infer_request


async def _next(responses: AsyncIterator[InferResponse]) -> InferResponse | None:
    """The next response that carries something (a final flag alone does not); None at the end."""
    async for response in responses:
        if not response.flag_only:
            return response
    return None


def _status(error: InfermuxError) -> int:
    return STATUS_OF.get(error.code, 400)


async def handle_generate(dp: Operations, request: Request, name: str, version: str) -> Reply:
    """``/generate``: the model's only response; 400 where it gives none or several, as Triton."""
    responses = dp.infer_stream(await _request(dp, request, name, version))
    try:
        first = await request.unless_disconnected(_next(responses))
        if first is not None and first.error is not None:
            return Reply.error(_status(first.error), first.error.message)
        if first is None or (not first.final and await _next(responses) is not None):
            raise InvalidArgumentError(generate.MULTIPLE_RESPONSES)
    finally:
        await _close(responses)
    return Reply(200, generate.encode_response(first), [JSON_TYPE])


async def handle_stream(dp: Operations, request: Request, name: str, version: str) -> Reply:
    """``/generate_stream``: an event per response. A failure before the first response is a
    plain JSON error; a failed first response sets the status (Triton sets it from the first
    event); after an error event the stream ends."""
    responses = dp.infer_stream(await _request(dp, request, name, version))
    try:
        first = await request.unless_disconnected(_next(responses))
    except BaseException:
        await _close(responses)
        raise
    if first is None:  # no response at all, only the final flag: an empty stream
        await _close(responses)
        return Reply(200, b"", [EVENT_STREAM_TYPE], events=_nothing())
    status = 200 if first.error is None else _status(first.error)
    headers = [EVENT_STREAM_TYPE, (b"cache-control", b"no-cache")]
    done = first.final or first.error is not None
    rest = _nothing() if done else _events(responses)
    if done:
        await _close(responses)
    return Reply(status, generate.event(first), headers, events=rest)


async def _events(responses: AsyncIterator[InferResponse]) -> AsyncIterator[bytes]:
    try:
        while (response := await _next(responses)) is not None:
            yield generate.event(response)
            if response.final or response.error is not None:
                return  # an error ends the stream: the rest of the request is given up
    except InfermuxError as exc:
        yield generate.error_event(exc.message)
    except Exception as exc:
        logger.exception("generate_stream failed mid-stream")
        yield generate.error_event(f"internal error: {exc}")
    finally:
        await _close(responses)


async def _close(responses: AsyncIterator[InferResponse]) -> None:
    # Closing gives the request up where it has not ended (the data plane's contract).
    aclose = getattr(responses, "aclose", None)
    if aclose is not None:
        await aclose()


async def _nothing() -> AsyncIterator[bytes]:
    return
    yield  # pragma: no cover  # an async generator that yields nothing
