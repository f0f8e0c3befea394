"""Per model version inference statistics with Triton's semantics (the statistics extension).

The scheduler records each execution (batch size and durations); the data plane records each
request's outcome. Everything runs on the event loop thread, so no locking is needed.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from infermux.types import INFER_STAT_KEYS, BatchStats, Duration, MemoryUsage, ModelStats


class _BatchDurations:
    __slots__ = ("compute_infer", "compute_input", "compute_output")

    def __init__(self) -> None:
        self.compute_input = Duration()
        self.compute_infer = Duration()
        self.compute_output = Duration()


class ModelStatistics:
    """Counters of one model version; :meth:`snapshot` gives Triton's ``ModelStatistics``."""

    def __init__(
        self,
        name: str,
        version: int,
        memory: Callable[[], tuple[MemoryUsage, ...]] | None = None,
    ) -> None:
        self.name = name
        self.version = version
        # Asked on each snapshot: buffers may grow after load (an unexpectedly large batch).
        self._memory = memory
        self._inference_count = 0
        self._execution_count = 0
        self._last_inference_ms = 0
        self._stats = {key: Duration() for key in INFER_STAT_KEYS}
        self._batches: dict[int, _BatchDurations] = {}

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int
    ) -> None:
        """One ``execute`` call of ``batch_size`` rows."""
        self._execution_count += 1
        batch = self._batches.get(batch_size)
        if batch is None:
            batch = self._batches[batch_size] = _BatchDurations()
        batch.compute_input.add(input_ns)
        batch.compute_infer.add(infer_ns)
        batch.compute_output.add(output_ns)

    def record_success(
        self,
        *,
        batch_size: int,
        request_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
    ) -> None:
        """A request that succeeded; its durations count once per request, as in Triton."""
        self._inference_count += batch_size
        self._last_inference_ms = time.time_ns() // 1_000_000
        stats = self._stats
        stats["success"].add(request_ns)
        stats["queue"].add(queue_ns)
        stats["compute_input"].add(input_ns)
        stats["compute_infer"].add(infer_ns)
        stats["compute_output"].add(output_ns)

    def record_failure(self, request_ns: int) -> None:
        """A request that reached this model version and failed."""
        self._stats["fail"].add(request_ns)

    def snapshot(self) -> ModelStats:
        """A copy of the counters (safe to serialise while requests keep running)."""
        return ModelStats(
            name=self.name,
            version=str(self.version),
            last_inference=self._last_inference_ms,
            inference_count=self._inference_count,
            execution_count=self._execution_count,
            inference_stats={k: Duration(d.count, d.ns) for k, d in self._stats.items()},
            batch_stats=tuple(
                BatchStats(
                    size,
                    Duration(b.compute_input.count, b.compute_input.ns),
                    Duration(b.compute_infer.count, b.compute_infer.ns),
                    Duration(b.compute_output.count, b.compute_output.ns),
                )
                for size, b in sorted(self._batches.items())
            ),
            memory_usage=self._memory() if self._memory is not None else (),
        )
