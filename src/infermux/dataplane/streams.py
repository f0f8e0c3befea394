"""The responses of a decoupled model to one request, as the data plane gives them to a front
end: each scheduler :class:`~infermux.scheduling.base.Response` as an ``InferResponse``, and the
request's statistics counted once, when its final response comes (or it is given up)."""

from __future__ import annotations

from collections.abc import AsyncIterator

from infermux.backends.base import ModelRequest
from infermux.errors import FailureReason
from infermux.repository import LoadedModel
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
) -> AsyncIterator[InferResponse]:
    """Schedule ``model_request`` and yield its responses; the last one is ``final``. A request
    whose reader stops before its final response is counted as cancelled."""
    finished = False
    rows = model_request.batch_size if model.config.batching else 1
    try:
        async for part in model.scheduler.submit_stream(model_request):
            if part.final:
                finished = True
                if part.error is None and part.completion is not None:
                    succeeded(model, request, started, part.completion, (rows,), log=log)
                else:
                    reason = part.error.reason if part.error else FailureReason.BACKEND
                    failed(model, request, started, reason, part.error)
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
            failed(model, request, started, FailureReason.CANCELED, None)
