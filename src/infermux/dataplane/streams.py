"""The responses of a decoupled model to one request, as the data plane gives them to a front
end: each scheduler :class:`~infermux.scheduling.base.Response` as an ``InferResponse``; the
request's statistics counted once, when its final response comes (or it is given up); and each
response in Triton's per-response statistics and the time-to-first-response metrics."""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator

from infermux.backends.base import ModelRequest
from infermux.errors import FailureReason
from infermux.repository import LoadedModel
from infermux.scheduling.base import Response
from infermux.types import InferRequest, InferResponse

from .outcomes import failed, succeeded


def decoupled_refusal(name: str) -> str:
    """Why a single-answer inference call cannot reach a decoupled model (as Triton refuses)."""
    return (
        f"model '{name}' is decoupled (model_transaction_policy.decoupled): its responses come "
        "over a stream (gRPC ModelStreamInfer), not a single-response inference call"
    )


async def answers(
    model: LoadedModel,
    request: InferRequest,
    model_request: ModelRequest,
    started: int,
    log: bool,
) -> AsyncGenerator[InferResponse]:
    """Schedule ``model_request`` and yield its responses; the last one is ``final``. A request
    whose reader stops before its final response is counted as cancelled."""
    finished = False
    rows = model_request.batch_size if model.config.batching else 1
    index = 0  # of the next response in the request
    try:
        # aclosing: a reader that stops gives the request up now, not when the generator is
        # collected (the model sees the cancellation at once).
        async with contextlib.aclosing(model.scheduler.submit_stream(model_request)) as parts:
            async for part in parts:
                _record_response(model, model_request, part, index, started)
                index += 1
                if part.final:
                    finished = True
                    if part.error is None and part.completion is not None:
                        done = part.completion
                        succeeded(model, request, started, done, (rows,), log=log, first=False)
                    else:
                        reason = part.error.reason if part.error else FailureReason.BACKEND
                        failed(model, request, started, reason, part.error, first=False)
                yield InferResponse(
                    model_name=model.name,
                    model_version=str(model.version),
                    outputs=part.outputs,
                    id=request.id,
                    final=part.final,
                    error=part.error,
                    flag_only=part.flag_only,
                )
    finally:
        if not finished:
            failed(model, request, started, FailureReason.CANCELED, None, first=False)
            stream = model_request.responses
            if stream is not None and stream.started_ns:  # it ran: Triton counts a cancel
                waited = time.perf_counter_ns() - max(stream.progress_ns, stream.started_ns)
                model.stats.record_response_cancel(index, waited)


def _record_response(
    model: LoadedModel, model_request: ModelRequest, part: Response, index: int, started: int
) -> None:
    """Triton's statistics of one response; the first one's time in the metrics."""
    if index == 0 and not part.flag_only:  # a final flag alone is no response (as Triton)
        model.stats.record_first_response(time.perf_counter_ns() - started)
    stream = model_request.responses
    if stream is None or not stream.started_ns:
        return  # failed before it ran (its queue): the model sent nothing
    if part.error is not None:
        outcome = "fail"
    elif part.flag_only:
        outcome = "empty_response"
    else:
        outcome = "success"
    model.stats.record_response(index, outcome, part.compute_infer_ns, part.compute_output_ns)
