"""The queue in front of a model version: priority levels with Triton's queue policies.

Level 1 is the highest priority. Each level is FIFO and has its own policy (timeout, what a timeout
does, a size bound). A request that times out under ``DELAY`` keeps its place in line only behind
every request that has not timed out, as Triton does; under ``REJECT`` it fails with UNAVAILABLE.
"""

from __future__ import annotations

import asyncio
import collections
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from infermux.backends.base import ModelRequest
from infermux.errors import RejectedError
from infermux.model_config import DynamicBatchingConfig, QueuePolicyConfig
from infermux.scheduling.base import Completion
from infermux.types import Parameter, non_negative_int

FULL = "Exceeds maximum queue size"  # Triton's wording; clients match on it
TIMED_OUT = "Request timeout expired"

_NO_POLICY = QueuePolicyConfig()


@dataclass(slots=True, eq=False)
class Pending:
    """An admitted request waiting for (or in) a batch."""

    request: ModelRequest
    future: asyncio.Future[Completion]
    level: int
    rows: int
    enqueued_ns: int = field(default_factory=time.perf_counter_ns)
    deadline_ns: int = 0  # 0: no queue timeout
    queued: bool = True
    batch_done: asyncio.Future[None] | None = None
    """Set when the request is taken into a batch; resolved when that batch is over (one future
    per batch): a cancelled request waits on it, since the model may read its inputs until then."""
    trace: object = None
    """The request's span context when it is traced (infermux.observability.tracing)."""


class RequestQueue:
    """Admits, orders, times out and hands out requests of one model version."""

    def __init__(self, batching: DynamicBatchingConfig | None) -> None:
        self._config = batching
        levels = batching.priority_levels if batching is not None else 0
        self._levels: dict[int, collections.deque[Pending]] = {
            level: collections.deque() for level in (range(1, levels + 1) if levels else (0,))
        }
        self._delayed: collections.deque[Pending] = collections.deque()
        self._default_level = batching.default_priority_level if levels and batching else 0
        self._size = dict.fromkeys(self._levels, 0)
        self._earliest = 0  # lower bound of the pending deadlines (0: none); scans only when due
        self.rows = 0
        self.count = 0

    def __bool__(self) -> bool:
        return self.count > 0

    def policy(self, level: int) -> QueuePolicyConfig:
        return self._config.policy(level) if self._config is not None else _NO_POLICY

    def level_of(self, parameters: dict[str, Parameter]) -> int:
        """The priority level a request asks for (0 or out of range: the default level)."""
        priority = _non_negative(parameters, "priority")
        if self._default_level == 0:
            return 0  # one level: priorities are ignored, as in Triton
        if priority == 0 or priority > len(self._levels):
            return self._default_level
        return priority

    def admit(self, pending: Pending) -> None:
        """Queue ``pending`` or raise UNAVAILABLE when its level is full."""
        policy = self.policy(pending.level)
        if policy.max_queue_size and self._size[pending.level] >= policy.max_queue_size:
            raise RejectedError(FULL)
        timeout_us = policy.default_timeout_microseconds
        requested = _non_negative(pending.request.parameters, "timeout")
        if (
            policy.allow_timeout_override
            and requested
            and (not timeout_us or requested < timeout_us)
        ):
            timeout_us = requested  # a request may only shorten the timeout
        if timeout_us:
            pending.deadline_ns = pending.enqueued_ns + timeout_us * 1000
            if not self._earliest or pending.deadline_ns < self._earliest:
                self._earliest = pending.deadline_ns
        self._levels[pending.level].append(pending)
        self._size[pending.level] += 1
        self.rows += pending.rows
        self.count += 1

    def remove(self, pending: Pending) -> None:
        """Take a request out of the queue (its client went away)."""
        if not pending.queued:
            return
        for line in (self._levels[pending.level], self._delayed):
            try:
                line.remove(pending)
            except ValueError:
                continue
            self._forget(pending)
            return

    def oldest_ns(self) -> int:
        """When the longest-waiting queued request arrived (the queue must not be empty)."""
        return min(line[0].enqueued_ns for line in self._lines() if line)

    def next_deadline(self) -> int:
        """When the next queue timeout may be due (0: none); possibly early, never late."""
        return self._earliest

    def expire(self, now_ns: int) -> list[Pending]:
        """Apply timeouts due at ``now_ns``; returns the rejected requests (already dequeued)."""
        if not self._earliest or now_ns < self._earliest:
            return []
        rejected = []
        for level, line in self._levels.items():
            if not any(p.deadline_ns and p.deadline_ns <= now_ns for p in line):
                continue
            keep: collections.deque[Pending] = collections.deque()
            for pending in line:
                if not pending.deadline_ns or pending.deadline_ns > now_ns:
                    keep.append(pending)
                elif self.policy(level).timeout_action == "DELAY":
                    pending.deadline_ns = 0
                    self._delayed.append(pending)
                else:
                    self._forget(pending)
                    rejected.append(pending)
            self._levels[level] = keep
        deadlines = [p.deadline_ns for line in self._levels.values() for p in line if p.deadline_ns]
        self._earliest = min(deadlines, default=0)
        return rejected

    def take(
        self, max_rows: int, compatible: Callable[[ModelRequest, ModelRequest], bool] | None
    ) -> list[Pending]:
        """The next batch: by priority, FIFO within a level, at most ``max_rows`` rows.

        The batch ends at the first request that does not fit (or cannot be stacked with the
        first one), so nobody is overtaken by a later request of its own level.
        """
        batch: list[Pending] = []
        rows = 0
        for line in self._lines():
            while line:
                head = line[0]
                if head.future.done():  # cancelled while queued
                    line.popleft()
                    self._forget(head)
                    continue
                if batch and (
                    rows + head.rows > max_rows
                    or (compatible is not None and not compatible(batch[0].request, head.request))
                ):
                    return batch
                line.popleft()
                self._forget(head)
                batch.append(head)
                rows += head.rows
                if rows >= max_rows:
                    return batch
        return batch

    def _lines(self) -> list[collections.deque[Pending]]:
        return [*self._levels.values(), self._delayed]

    def _forget(self, pending: Pending) -> None:
        pending.queued = False
        self._size[pending.level] -= 1
        self.rows -= pending.rows
        self.count -= 1


def _non_negative(parameters: dict[str, Parameter], key: str) -> int:
    return non_negative_int(parameters.get(key, 0), f"parameter '{key}'")
