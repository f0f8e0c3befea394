"""What the data plane records when a request ends: the model's statistics (Triton's
success and failure counters, per request of a micro-batch) and a debug line."""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from infermux.errors import FailureReason, InfermuxError
from infermux.repository import LoadedModel
from infermux.scheduling.base import Completion
from infermux.types import InferRequest

logger = logging.getLogger("infermux.dataplane.plane")  # the lines keep their logger's name


def succeeded(
    model: LoadedModel,
    request: InferRequest,
    started: int,
    done: Completion,
    rows: Sequence[int],
    *,
    log: bool,
    first: bool = True,
) -> None:
    """Statistics for each request answered (one, or each of a micro-batch's); with ``log``
    (``--log-verbose 2``), a line per request. ``first``: this answer is also the request's
    first response (False for a decoupled model's, counted as they come)."""
    elapsed = time.perf_counter_ns() - started
    # A micro-batch's requests share every figure: recorded once, counted per request.
    requests = len(rows)
    if first:
        model.stats.record_first_response(elapsed, requests)
    model.stats.record_success(
        batch_size=sum(rows),
        request_ns=elapsed,
        queue_ns=done.queue_ns,
        input_ns=done.compute_input_ns,
        infer_ns=done.compute_infer_ns,
        output_ns=done.compute_output_ns,
        requests=requests,
    )
    if log:
        logger.debug(
            "request %r to %s:%d done in %d us",
            request.id,
            model.name,
            model.version,
            elapsed // 1000,
            extra={"request_id": request.id, "model": model.name, "version": model.version},
        )


def failed(
    model: LoadedModel,
    request: InferRequest,
    started: int,
    reason: FailureReason,
    error: InfermuxError | None,
    *,
    first: bool = True,
) -> None:
    """Statistics for a failed (or cancelled: ``error`` None) request; a debug line. A failure
    the model answered (``BACKEND``) was the request's first response, unless ``first`` is
    False (a decoupled model's, counted as they come)."""
    elapsed = time.perf_counter_ns() - started
    model.stats.record_failure(elapsed, reason)
    if first and reason is FailureReason.BACKEND:
        model.stats.record_first_response(elapsed)
    if not logger.isEnabledFor(logging.DEBUG):
        return
    logger.debug(
        "request %r to %s:%d failed (%s): %s",
        request.id,
        model.name,
        model.version,
        reason.value,
        error if error is not None else "cancelled",
        extra={
            "request_id": request.id,
            "model": model.name,
            "version": model.version,
            "reason": reason.value,
        },
    )
