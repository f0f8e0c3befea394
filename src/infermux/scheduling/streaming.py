"""A request to a decoupled model as the scheduler gives it back: its responses, read from its
:class:`~infermux.backends.responses.ResponseStream` while the request is queued, batched and run
as any other (``DynamicBatcher.submit_stream``)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncGenerator, Callable, Coroutine
from typing import Any

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.backends.responses import ResponseStream
from infermux.errors import FailureReason, InfermuxError, InternalError
from infermux.scheduling.base import Completion, Finisher, Response

logger = logging.getLogger("infermux.scheduling.batcher")  # the lines keep their logger's name


async def stream_responses(
    name: str,
    request: ModelRequest,
    submit: Callable[[ModelRequest], Coroutine[Any, Any, Completion]],
    finish: Finisher,
) -> AsyncGenerator[Response]:
    """Submit ``request`` (with a fresh response stream) and yield its responses as the model
    sends them; the last one is final. Closing the generator early gives the request up: the
    stream is closed (the model's later sends are dropped, ``cancelled`` is set for it to see)
    and the request is cancelled as a cancelled :meth:`submit` is."""
    stream = request.responses = ResponseStream()
    loop = asyncio.get_running_loop()
    # The request is queued and batched as any other; its answers do not wait for the
    # batch to end (the model sends them while it runs, and may go on after it).
    task = loop.create_task(submit(request))
    task.add_done_callback(lambda done: _end_stream(request, stream, done))
    finished = False
    previous = 0  # when the model sent the previous response (0: none yet)
    try:
        while True:
            result, final, sent_ns = await stream.get_stamped()
            # compute_infer of a response: from the previous one (the first: from its batch's
            # start) to when the model sent it, as Triton counts a decoupled response.
            infer_ns = max(0, sent_ns - (previous or stream.started_ns or sent_ns))
            previous = sent_ns
            if final:
                finished = True
                yield await _last(name, request, result, task, finish=finish, infer_ns=infer_ns)
                return
            yield _response(name, request, result, finish, infer_ns)
    finally:
        if not finished:
            request.cancelled = True  # before the close: a model polling either sees it
        stream.close()
        if not task.done():
            task.cancel()
            with contextlib.suppress(BaseException):
                await task


def _response(
    name: str, request: ModelRequest, result: ExecuteResult | None, finish: Finisher, infer_ns: int
) -> Response:
    if result is None:
        return Response([], flag_only=True, compute_infer_ns=infer_ns)
    begin = time.perf_counter_ns()
    try:
        outputs = finish(request, result)
    except InfermuxError as exc:
        error = _from_backend(exc)
    except Exception as exc:
        logger.exception("model '%s': handling a response failed", name)
        error = _from_backend(InternalError(f"model '{name}': {exc}"))
    else:
        output_ns = time.perf_counter_ns() - begin
        return Response(outputs, compute_infer_ns=infer_ns, compute_output_ns=output_ns)
    return Response([], error, compute_infer_ns=infer_ns)


async def _last(
    name: str,
    request: ModelRequest,
    result: ExecuteResult | None,
    task: asyncio.Task[Completion],
    *,
    finish: Finisher,
    infer_ns: int,
) -> Response:
    try:
        completion = await asyncio.shield(task)  # the batch it ran in is over
    except InfermuxError as exc:  # the request failed (queue, batch, its own result)
        return Response([], exc, final=True, compute_infer_ns=infer_ns)
    response = _response(name, request, result, finish, infer_ns)
    return Response(
        response.outputs,
        response.error,
        final=True,
        completion=completion,
        flag_only=response.flag_only,
        compute_infer_ns=response.compute_infer_ns,
        compute_output_ns=response.compute_output_ns,
    )


def _from_backend(error: InfermuxError) -> InfermuxError:
    """``error`` came from running the model (raised, or a result that could not be used)."""
    error.reason = FailureReason.BACKEND
    return error


def _end_stream(
    request: ModelRequest, stream: ResponseStream, submitted: asyncio.Task[Completion]
) -> None:
    """A decoupled request failed before its model sent its final response: end it so."""
    if submitted.cancelled():
        return
    error = submitted.exception()
    if error is not None:
        request.cancelled = True  # nobody reads what the model may still send
        stream.end(error if isinstance(error, Exception) else InternalError(str(error)))
