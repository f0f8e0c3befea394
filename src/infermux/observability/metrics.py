"""Every Prometheus metric infermux publishes, collected at scrape time (the families, Triton's
and infermux's own, are declared in :mod:`infermux.observability.metric_families`).

Nothing is counted twice: the collector reads the model statistics the statistics extension
already keeps (:mod:`infermux.observability.statistics`), the scheduler's queue and NVML, when
Prometheus scrapes; the request path pays nothing for it. It runs on the event loop that owns those
counters (the executor's, with several front-end processes), so metrics stay whole whichever
process answered a request.

Exposition is the Prometheus text format, written by :mod:`infermux.observability.exposition`
(which also merges several executors' families), re-exported here for the callers.
"""

from __future__ import annotations

import collections
import functools
from collections.abc import Iterator, Sequence

from prometheus_client import CollectorRegistry, ProcessCollector
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from infermux.backends.pb_utils.custom_metrics import CUSTOM_METRICS
from infermux.backends.precision import PrecisionReport
from infermux.errors import FailureReason
from infermux.observability.exposition import (
    CONTENT_TYPE,
    MAX_MERGED,
    FamilyData,
    Sample,
    family_data,
    merge,
    number,
    render,
)
from infermux.observability.metric_families import (
    GPU,
    INFERMUX,
    METRICS,
    MODEL,
    TRITON,
    Family,
    Kind,
    names,
)
from infermux.observability.statistics import Histogram
from infermux.repository import LoadedModel, ModelRepository
from infermux.routing.router import Router
from infermux.routing.shadow import ShadowStats
from infermux.runtime.memory import by_component, instance_memory
from infermux.runtime.nvml import NVML, Nvml

__all__ = [  # the exposition's and the catalogue's names too, for callers that reach them here
    "CONTENT_TYPE",
    "GPU",
    "INFERMUX",
    "MAX_MERGED",
    "METRICS",
    "MODEL",
    "TRITON",
    "Family",
    "FamilyData",
    "Kind",
    "Sample",
    "ServerCollector",
    "family_data",
    "merge",
    "names",
    "registry",
    "render",
]

_HISTOGRAMS = {  # family -> (attribute of statistics.Histograms, scale to the exposed unit)
    "infermux_request_duration_seconds": ("request", 1e-9),
    "infermux_queue_duration_seconds": ("queue", 1e-9),
    "infermux_compute_duration_seconds": ("compute", 1e-9),
    "infermux_batch_size": ("batch_size", 1.0),
    "infermux_first_response_duration_seconds": ("first_response", 1e-9),
    "infermux_response_interval_seconds": ("response_interval", 1e-9),
    # Whole milliseconds, its bounds written as Triton writes them (le="100", not "100.0").
    "nv_inference_first_response_histogram_ms": ("first_response_ms", 1),
}
_RESPONSE_OUTCOMES = {  # infermux_responses_total outcome -> Triton response_stats key
    "success": "success",
    "fail": "fail",
    "empty": "empty_response",
    "cancel": "cancel",
}
_DURATIONS = {  # family -> Triton statistics key, in microseconds
    "nv_inference_request_duration_us": "success",
    "nv_inference_queue_duration_us": "queue",
    "nv_inference_compute_input_duration_us": "compute_input",
    "nv_inference_compute_infer_duration_us": "compute_infer",
    "nv_inference_compute_output_duration_us": "compute_output",
}


class ServerCollector(Collector):
    """Reads ``repository`` and ``router`` (and the GPUs through ``nvml`` unless ``gpu`` is
    False) per scrape."""

    def __init__(
        self,
        repository: ModelRepository,
        router: Router | None = None,
        *,
        gpu: bool = True,
        nvml: Nvml = NVML,
    ) -> None:
        self._repository = repository
        self._router = router
        self._nvml = nvml if gpu else None

    def collect(self) -> Iterator[Metric]:
        families = {name: Metric(f.name, f.help, f.kind) for name, f in METRICS.items()}
        for model in self._repository.served():
            _model_samples(families, model)
        for name, failures in self._repository.load_failures().items():
            family = families["infermux_model_load_failures_total"]
            family.add_sample(family.name, {"model": name}, failures)
        if self._router is not None:
            for name, version, stats in self._router.shadow_stats():
                _shadow_samples(families, name, version, stats)
        if self._nvml is not None:
            for gpu in self._nvml.read():
                values = {
                    "nv_gpu_utilization": gpu.utilization,
                    "nv_gpu_memory_total_bytes": gpu.memory_total_bytes,
                    "nv_gpu_memory_used_bytes": gpu.memory_used_bytes,
                    "nv_gpu_power_usage": gpu.power_watts,
                }
                for name, value in values.items():
                    if value is not None:  # a GPU that does not report its power
                        families[name].add_sample(name, {"gpu_uuid": gpu.uuid}, value)
        yield from (f for f in families.values() if f.samples)
        # Families the models defined (Triton's pb_utils.MetricFamily), while they are loaded.
        yield from CUSTOM_METRICS.collect()


def _model_samples(families: dict[str, Metric], model: LoadedModel) -> None:
    stats = model.stats
    snapshot = stats.snapshot()
    labels = {"model": model.name, "version": str(model.version)}

    def add(name: str, value: float, extra: dict[str, str] | None = None) -> None:
        families[name].add_sample(name, {**labels, **extra} if extra else labels, value)

    durations = snapshot.inference_stats
    add("nv_inference_request_success", durations["success"].count)
    for reason in FailureReason:
        add("nv_inference_request_failure", stats.failures[reason], {"reason": reason.value})
    add("nv_inference_count", snapshot.inference_count)
    add("nv_inference_exec_count", snapshot.execution_count)
    for name, key in _DURATIONS.items():
        add(name, durations[key].ns // 1000)
    add("nv_inference_pending_request_count", model.scheduler.queued)
    add("nv_model_load_duration_secs", stats.load_seconds)
    add("infermux_requests_in_flight", model.scheduler.pending)
    if snapshot.response_stats:
        responses = snapshot.response_stats.values()
        for outcome, key in _RESPONSE_OUTCOMES.items():
            count = sum(stats[key].count for stats in responses)
            add("infermux_responses_total", count, {"outcome": outcome})
    for instance, busy in zip(stats.instances, stats.busy_ns, strict=True):
        add("infermux_instance_busy_seconds_total", busy / 1e9, {"instance": instance})
    crashes = [int(getattr(i, "crashes", 0)) for i in model.instances]
    for index, instance in enumerate(stats.instances):
        restarts = {"timeout": stats.timeouts[index]}
        restarts["crash"] = crashes[index] if index < len(crashes) else 0
        for cause, count in restarts.items():
            add("infermux_instance_restarts_total", count, {"instance": instance, "reason": cause})
    memory = by_component(instance_memory(model.instances))
    for (kind, device, component), size in sorted(memory.items()):
        where = {"kind": kind, "device": str(device), "component": component}
        add("infermux_model_memory_bytes", size, where)
    _precision_samples(families, labels, model.instances)
    if stats.histograms is not None:
        for name, (attribute, scale) in _HISTOGRAMS.items():
            _histogram(families[name], labels, getattr(stats.histograms, attribute), scale)


def _precision_samples(
    families: dict[str, Metric], labels: dict[str, str], instances: Sequence[object]
) -> None:
    reports = [getattr(i, "precision_report", None) for i in instances]
    found = [r for r in reports if isinstance(r, PrecisionReport) and r.precision.value != "fp32"]
    if not found:
        return
    caches = collections.Counter(r.cache for r in found if r.cache)
    for result, count in sorted(caches.items()):
        family = families["infermux_calibration_cache_loads_total"]
        family.add_sample(family.name, {**labels, "result": result}, count)
    # Every instance of a version loads the same file at the same settings: one guard's figures.
    report = found[0]
    if report.accuracy is None:
        return
    for output, figures in sorted(report.accuracy.outputs.items()):
        where = {**labels, "precision": report.precision.value, "output": output}
        error = families["infermux_model_precision_error"]
        error.add_sample(error.name, where, figures.relative_error)
        if figures.top1_agreement is not None:
            agreement = families["infermux_model_precision_top1_agreement"]
            agreement.add_sample(agreement.name, where, figures.top1_agreement)


def _shadow_samples(
    families: dict[str, Metric], model: str, version: int, stats: ShadowStats
) -> None:
    labels = {"model": model, "version": str(version)}
    requests = families["infermux_shadow_requests_total"]
    outcomes = {
        "agreed": stats.agreed,
        "disagreed": stats.disagreed,
        "failed": stats.failed,
        "dropped": stats.dropped,
    }
    for outcome, count in outcomes.items():
        requests.add_sample(requests.name, {**labels, "outcome": outcome}, count)
    diffs = families["infermux_shadow_max_abs_diff"]
    for output, diff in sorted(stats.max_abs_diff.items()):
        diffs.add_sample(diffs.name, {**labels, "output": output}, diff)
    delta = families["infermux_shadow_latency_delta_seconds_total"]
    delta.add_sample(delta.name, labels, stats.latency_delta_ns / 1e9)


def _histogram(family: Metric, labels: dict[str, str], histogram: Histogram, scale: float) -> None:
    cumulative = 0
    for le, count in zip(_bucket_bounds(histogram.bounds, scale), histogram.counts, strict=True):
        cumulative += count
        family.add_sample(f"{family.name}_bucket", {**labels, "le": le}, cumulative)
    family.add_sample(f"{family.name}_count", labels, cumulative)
    family.add_sample(f"{family.name}_sum", labels, histogram.sum * scale)


@functools.cache
def _bucket_bounds(bounds: tuple[int, ...], scale: float) -> tuple[str, ...]:
    """The ``le`` label values of a histogram's buckets, ``+Inf`` last (formatted once)."""
    return (*(number(bound * scale) for bound in bounds), "+Inf")


def registry(
    repository: ModelRepository,
    router: Router | None = None,
    *,
    gpu: bool = True,
    process: bool = True,
) -> CollectorRegistry:
    """What ``/metrics`` serves: the server's metrics and the process's (CPU, memory, fds)."""
    result = CollectorRegistry(auto_describe=False)
    result.register(ServerCollector(repository, router, gpu=gpu))
    if process:
        ProcessCollector(registry=result)
    return result
