"""Per model version inference statistics with Triton's semantics (the statistics extension),
and what the Prometheus metrics add to them (failure reasons, latency and batch-size histograms,
instance busy time, load time).

The scheduler records each execution (batch size and durations); the data plane records each
request's outcome. Everything runs on the event loop thread, so no locking is needed, and the
metrics endpoint (on the same loop) reads these counters at scrape time: serving metrics costs
the request path nothing but the histogram increments, and those only with metrics on.
"""

from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Sequence

from infermux.errors import FailureReason
from infermux.types import (
    INFER_STAT_KEYS,
    RESPONSE_STAT_KEYS,
    BatchStats,
    Duration,
    MemoryUsage,
    ModelStats,
)

# From 50 µs (a no-op model in process) to 10 s (a large model under load), about 2.5x apart.
LATENCY_BUCKETS_NS = tuple(
    int(seconds * 1e9)
    for seconds in (
        0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
        0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
    )
)  # fmt: skip
BATCH_SIZE_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
FIRST_RESPONSE_BUCKETS_MS = (100, 500, 2000, 5000)
"""Triton's default buckets of ``nv_inference_first_response_histogram_ms`` (milliseconds)."""


class Histogram:
    """Counts per bucket (upper bounds inclusive, as Prometheus' ``le``) plus the sum; the
    last count is the overflow above every bound."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: Sequence[int]) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.sum = 0

    def observe(self, value: int, times: int = 1) -> None:
        """``value`` seen ``times`` times (the requests of a micro-batch share their figures)."""
        self.counts[bisect.bisect_left(self.bounds, value)] += times
        self.sum += value * times

    @property
    def count(self) -> int:
        return sum(self.counts)


class Histograms:
    """The metrics' histograms of one model version: per request (request and queue time, time
    to its first response, twice: Triton's milliseconds and infermux's finer buckets), per
    execution (compute time and batch size), and between a decoupled model's responses."""

    __slots__ = (
        "batch_size",
        "compute",
        "first_response",
        "first_response_ms",
        "queue",
        "request",
        "response_interval",
    )

    def __init__(self) -> None:
        self.request = Histogram(LATENCY_BUCKETS_NS)
        self.queue = Histogram(LATENCY_BUCKETS_NS)
        self.compute = Histogram(LATENCY_BUCKETS_NS)
        self.batch_size = Histogram(BATCH_SIZE_BUCKETS)
        self.first_response = Histogram(LATENCY_BUCKETS_NS)
        self.first_response_ms = Histogram(FIRST_RESPONSE_BUCKETS_MS)
        self.response_interval = Histogram(LATENCY_BUCKETS_NS)


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
        *,
        instances: Sequence[str] = (),
        histograms: bool = False,
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
        self._responses: dict[int, dict[str, Duration]] = {}  # by index in the request
        self.failures = dict.fromkeys(FailureReason, 0)
        """Failed requests by reason (they add up to the ``fail`` count)."""
        self.instances = tuple(instances)
        self.busy_ns = [0] * len(self.instances)
        """Per instance: time it was taken by a batch (dispatch to result), for occupancy."""
        self.timeouts = [0] * len(self.instances)
        """Per instance: executions cut by the execution timeout (each replaced the instance)."""
        self.histograms = Histograms() if histograms else None
        """None when metrics are off, so that the request path skips them."""
        self.load_seconds = 0.0

    def record_execution(
        self, batch_size: int, input_ns: int, infer_ns: int, output_ns: int, instance: int = 0
    ) -> None:
        """One ``execute`` call of ``batch_size`` rows on instance number ``instance``."""
        self._execution_count += 1
        if instance < len(self.busy_ns):
            self.busy_ns[instance] += input_ns + infer_ns
        if self.histograms is not None:
            self.histograms.compute.observe(input_ns + infer_ns + output_ns)
            self.histograms.batch_size.observe(batch_size)
        batch = self._batches.get(batch_size)
        if batch is None:
            batch = self._batches[batch_size] = _BatchDurations()
        batch.compute_input.add(input_ns)
        batch.compute_infer.add(infer_ns)
        batch.compute_output.add(output_ns)

    def record_timeout(self, instance: int) -> None:
        """Instance number ``instance`` overran the execution timeout."""
        if instance < len(self.timeouts):
            self.timeouts[instance] += 1

    def record_success(
        self,
        *,
        batch_size: int,
        request_ns: int,
        queue_ns: int,
        input_ns: int,
        infer_ns: int,
        output_ns: int,
        requests: int = 1,
    ) -> None:
        """``requests`` requests that succeeded with these same durations (the members of a
        micro-batch; ``batch_size``: their rows together); the durations count once per
        request, as in Triton."""
        self._inference_count += batch_size
        self._last_inference_ms = time.time_ns() // 1_000_000
        stats = self._stats
        stats["success"].add(request_ns * requests, requests)
        stats["queue"].add(queue_ns * requests, requests)
        stats["compute_input"].add(input_ns * requests, requests)
        stats["compute_infer"].add(infer_ns * requests, requests)
        stats["compute_output"].add(output_ns * requests, requests)
        if self.histograms is not None:
            self.histograms.request.observe(request_ns, requests)
            self.histograms.queue.observe(queue_ns, requests)

    def record_failure(self, request_ns: int, reason: FailureReason = FailureReason.OTHER) -> None:
        """A request that reached this model version and failed."""
        self._stats["fail"].add(request_ns)
        self.failures[reason] += 1

    def record_first_response(self, request_ns: int, requests: int = 1) -> None:
        """``requests`` requests' first responses left ``request_ns`` after they arrived (every
        model: the only response of a non-decoupled one; only the metrics keep it)."""
        if self.histograms is not None:
            self.histograms.first_response.observe(request_ns, requests)
            # Triton observes whole milliseconds (its duration divided by 10^6).
            self.histograms.first_response_ms.observe(request_ns // 1_000_000, requests)

    def record_response(self, index: int, outcome: str, infer_ns: int, output_ns: int) -> None:
        """Response number ``index`` (0: the first) of a request to a decoupled model, as
        Triton's response statistics count it: ``outcome`` is ``success``, ``fail`` or
        ``empty_response``; ``infer_ns`` the time the model took to send it (since its previous
        response, or its batch's start), ``output_ns`` the time its outputs took."""
        stats = self._response(index)
        stats["compute_infer"].add(infer_ns)
        if outcome == "success" or output_ns:  # a failed or empty one made no outputs
            stats["compute_output"].add(output_ns)
        stats[outcome].add(infer_ns + output_ns)
        if index and self.histograms is not None:
            self.histograms.response_interval.observe(infer_ns)

    def record_response_cancel(self, index: int, waited_ns: int) -> None:
        """The request was given up while response number ``index`` was awaited, ``waited_ns``
        after its previous response (or its batch's start)."""
        self._response(index)["cancel"].add(waited_ns)

    def _response(self, index: int) -> dict[str, Duration]:
        stats = self._responses.get(index)
        if stats is None:
            stats = self._responses[index] = {key: Duration() for key in RESPONSE_STAT_KEYS}
        return stats

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
            response_stats={
                str(index): {k: Duration(d.count, d.ns) for k, d in stats.items()}
                for index, stats in self._responses.items()
            },
        )
