"""Triton's bidirectional ``ModelStreamInfer``: the requests of one stream run concurrently, each
response is sent as it comes, and memory stays bounded however the client reads
(:func:`serve_stream`)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncGenerator, AsyncIterator
from typing import Any

from tritonclient.grpc import service_pb2

from infermux.dataplane import Operations
from infermux.errors import InfermuxError
from infermux.frontends.grpc import codec
from infermux.frontends.grpc.calls import (
    Context,
    Message,
    deadline_ns,
    decode,
    from_metadata,
    report_malformed,
)
from infermux.frontends.grpc.handlers import Malformed

logger = logging.getLogger(__name__)

EMPTY_FINAL_PARAMETER = "triton_enable_empty_final_response"
"""Request parameter (tritonclient's ``enable_empty_final_response``): flag every stream
response final or not, and send a final flag that came without outputs as an empty response."""
FINAL_PARAMETER = "triton_final_response"
"""Response parameter: this is the last response of its request."""


async def serve_stream(
    dataplane: Operations,
    request_iterator: AsyncIterator[Message],
    context: Context,
    in_flight: int,
) -> AsyncGenerator[Message]:
    """Run the requests of the stream concurrently; send each response as soon as it comes.

    A request gets one response, or, from a decoupled model, zero or more then a final
    flag: responses of one request leave in the order the model sent them. With the request
    parameter ``triton_enable_empty_final_response`` true, a final flag that came without
    outputs is sent as an empty response; otherwise such a flag sends nothing. As in
    Triton's stream handler, every response sent carries ``triton_final_response``.

    Memory is bounded twice. At most ``in_flight`` requests are read and not yet
    finished: past that, the stream is not read until a request's last response has been
    written. At most as many responses wait to be written: past that, the requests stop
    taking responses from the data plane, which holds their models back
    (``backends/responses.py``). grpc.aio writes a response only as the client's
    flow-control window allows, so a client that stops reading meets HTTP/2 flow control
    instead of growing the server's memory.

    A failed response is sent with ``error_message`` and the stream stays open; once the
    client half-closes, the stream ends when the requests still running have finished.
    """
    # (reply, last of its request) or None: the reader is done.
    answers: asyncio.Queue[tuple[Message | None, bool] | None] = asyncio.Queue()
    running: set[asyncio.Task[None]] = set()
    # A slot is taken before a request is read and given back once its last reply is written.
    slots = asyncio.Semaphore(in_flight)
    # A reply takes one of these before it is queued and gives it back once written.
    buffered = asyncio.Semaphore(in_flight)

    metadata = tuple(context.invocation_metadata() or ())
    peer = context.peer()
    deadline = deadline_ns(context)  # the stream's: no request outlives it

    async def answer(message: Message) -> None:
        replies = _replies(dataplane, message, metadata, peer, deadline)
        try:
            async for item in replies:
                await buffered.acquire()
                answers.put_nowait(item)
        finally:
            await replies.aclose()

    async def read() -> None:
        requests = aiter(request_iterator)
        try:
            while True:
                await slots.acquire()
                try:
                    message = await anext(requests)
                except StopAsyncIteration:
                    break
                task = asyncio.create_task(answer(message))
                running.add(task)
                task.add_done_callback(running.discard)
            await asyncio.gather(*running)
        finally:
            answers.put_nowait(None)  # wakes the writer, also when reading failed

    reader = asyncio.create_task(read())
    try:
        while (item := await answers.get()) is not None:
            reply, last = item
            if reply is not None:
                # grpc.aio asks for the next reply only once this one has been sent.
                yield reply
            buffered.release()
            if last:
                slots.release()
        await reader  # surfaces a failed read as the stream's status
    finally:
        # The client went away or the server is stopping: nobody is left to answer.
        reader.cancel()
        for task in list(running):
            task.cancel()


async def _replies(
    dataplane: Operations, message: Message, metadata: tuple[Any, ...], peer: str, deadline: int
) -> AsyncGenerator[tuple[Message | None, bool]]:
    """The replies to one request of a stream, each with whether it is the last (which is
    None for a final flag with nothing to send)."""
    if isinstance(message, Malformed):
        report_malformed("ModelStreamInfer", peer, message)
        yield service_pb2.ModelStreamInferResponse(error_message=message.describe()), True
        return
    flagged = False  # triton_enable_empty_final_response
    try:
        request = await decode(dataplane, message)
        flagged = request.parameters.pop(EMPTY_FINAL_PARAMETER, False) is True
        from_metadata(request, metadata)
        request.deadline_ns = deadline
        async for response in dataplane.infer_stream(request):
            final = response.final
            if response.error is not None:
                yield _stream_error(message, response.error.message, final), final
            elif not response.flag_only or flagged:
                reply = service_pb2.ModelStreamInferResponse()
                encoded = codec.encode_infer_response(response, reply.infer_response)
                # As Triton's stream handler: on every response it writes, whatever the option.
                encoded.parameters[FINAL_PARAMETER].bool_param = final
                yield reply, final
            else:
                yield None, True  # the flag alone: nothing to send, the request is over
    except Exception as exc:
        if isinstance(exc, InfermuxError):
            error = exc.message
        else:
            logger.exception("unhandled error in a gRPC stream request")
            error = f"internal error: {exc}"
        yield _stream_error(message, error, True), True


def _stream_error(message: Message, error: str, final: bool) -> Message:
    """A failed response; it echoes the request's id so that the client can tell which of its
    requests failed."""
    response = service_pb2.ModelInferResponse(
        id=message.id, model_name=message.model_name, model_version=message.model_version
    )
    response.parameters[FINAL_PARAMETER].bool_param = final
    return service_pb2.ModelStreamInferResponse(error_message=error, infer_response=response)
