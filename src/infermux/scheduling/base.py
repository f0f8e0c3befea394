"""The scheduler seam: the data plane submits requests; a scheduler decides when and where."""

from __future__ import annotations

from typing import Protocol

from infermux.backends.base import ExecuteResult, ModelRequest


class Scheduler(Protocol):
    """Queues requests for one model version and runs them on that version's instances."""

    async def submit(self, request: ModelRequest) -> ExecuteResult:
        """Run ``request`` and return its result (outputs or the request's own error).

        Raises :class:`infermux.errors.UnavailableError` once :meth:`close` has begun, and the
        error of the whole batch if the instance failed outside any one request.
        """
        ...

    @property
    def pending(self) -> int:
        """Requests admitted but not yet finished (queued or executing)."""
        ...

    async def close(self) -> None:
        """Stop admitting, finish every admitted request, then close the instances."""
        ...
