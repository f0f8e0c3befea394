"""The scheduler seam: the data plane submits requests; a scheduler decides when and where."""

from __future__ import annotations

from collections.abc import AsyncGenerator, Callable
from dataclasses import dataclass
from typing import Protocol

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.errors import InfermuxError
from infermux.types import Tensor

Finisher = Callable[[ModelRequest, ExecuteResult], list[Tensor]]
"""Turns one request's raw result into its output tensors, or raises that request's error."""


@dataclass(frozen=True, slots=True)
class Completion:
    """A finished request: its outputs and where its time went (nanoseconds).

    ``compute_input``/``compute_infer`` are those of the batch the request ran in (as Triton counts
    them); ``compute_output`` is this request's own output handling.
    """

    outputs: list[Tensor]
    queue_ns: int
    compute_input_ns: int
    compute_infer_ns: int
    compute_output_ns: int


@dataclass(frozen=True, slots=True)
class Response:
    """One response of a request to a decoupled model: outputs, or this response's error
    (the stream may go on after it), and whether it is the request's last. The final one
    carries the request's :class:`Completion` (its times; no outputs) when the request ran."""

    outputs: list[Tensor]
    error: InfermuxError | None = None
    final: bool = False
    completion: Completion | None = None
    flag_only: bool = False
    """No response came with this flag (the model sent the final flag alone)."""
    compute_infer_ns: int = 0
    """From the model's previous response (the first: from its batch's start) to this one."""
    compute_output_ns: int = 0
    """Turning this response's result into output tensors."""


class Scheduler(Protocol):
    """Queues requests for one model version and runs them on that version's instances."""

    async def submit(self, request: ModelRequest) -> Completion:
        """Run ``request`` and return its outputs, or raise the request's own error.

        Raises :class:`infermux.errors.UnavailableError` once :meth:`close` has begun, and the
        error of the whole batch if the instance failed outside any one request.

        Cancelling the caller takes a queued request out of the queue (it never runs); one in a
        running batch is not interrupted: the cancellation completes when that batch ends (the
        model may read the request's inputs until then) and the result is dropped.
        """
        ...

    def submit_stream(self, request: ModelRequest) -> AsyncGenerator[Response]:
        """Run ``request`` on a decoupled model: its responses in the order the model sent
        them, the last one final. A failure before the model answered (queue, batch) is a
        final response with that error. Closing the generator early (``aclose``) cancels the
        request as cancelling :meth:`submit` does: the request is marked ``cancelled`` for the
        model to see, and the model's later responses are dropped."""
        ...

    @property
    def pending(self) -> int:
        """Requests admitted but not yet finished (queued or executing)."""
        ...

    @property
    def queued(self) -> int:
        """Requests admitted and still waiting for an instance (Triton's pending count)."""
        ...

    async def close(self) -> None:
        """Stop admitting, finish every admitted request, then close the instances."""
        ...
