"""The catalogue of every Prometheus metric family infermux publishes: name, type, help and
labels. Triton's come first, named, typed and labelled exactly as tritonserver exposes them, so
that dashboards and alerts written for Triton work unchanged; infermux's own follow
(``infermux_`` prefix). :mod:`infermux.observability.metrics` collects their samples.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

Kind = Literal["counter", "gauge", "histogram"]
MODEL = ("model", "version")


@dataclass(frozen=True, slots=True)
class Family:
    """One metric: its exposed name, type, help text and label names."""

    name: str
    kind: Kind
    help: str
    labels: tuple[str, ...] = MODEL


def _declare(*families: Family) -> dict[str, Family]:
    return {f.name: f for f in families}


# -- Triton's (names, types and labels exactly as tritonserver exposes them) ----------------------
_FAILURE = ("model", "reason", "version")
TRITON = _declare(
    Family("nv_inference_request_success", "counter", "Number of successful inference requests"),
    Family(
        "nv_inference_request_failure", "counter", "Number of failed inference requests", _FAILURE
    ),
    Family("nv_inference_count", "counter", "Number of inferences performed (batch rows)"),
    Family("nv_inference_exec_count", "counter", "Number of model executions performed"),
    Family("nv_inference_request_duration_us", "counter", "Cumulative request duration (µs)"),
    Family("nv_inference_queue_duration_us", "counter", "Cumulative queuing duration (µs)"),
    Family("nv_inference_compute_input_duration_us", "counter", "Cumulative compute input (µs)"),
    Family("nv_inference_compute_infer_duration_us", "counter", "Cumulative compute infer (µs)"),
    Family("nv_inference_compute_output_duration_us", "counter", "Cumulative compute output (µs)"),
    Family("nv_inference_pending_request_count", "gauge", "Requests waiting for an instance"),
    Family("nv_model_load_duration_secs", "gauge", "Model load time in seconds"),
    Family(
        "nv_inference_first_response_histogram_ms",
        "histogram",
        "Duration from request to first response in milliseconds",
    ),
)

# GPU gauges carry gpu_uuid and nothing else: perf_analyzer's --collect-metrics matches
# `name{gpu_uuid="..."} value` literally.
_GPU = ("gpu_uuid",)
GPU = _declare(
    Family("nv_gpu_utilization", "gauge", "GPU utilization rate [0.0 - 1.0)", _GPU),
    Family("nv_gpu_memory_total_bytes", "gauge", "GPU total memory, in bytes", _GPU),
    Family("nv_gpu_memory_used_bytes", "gauge", "GPU used memory, in bytes", _GPU),
    Family("nv_gpu_power_usage", "gauge", "GPU power usage in watts", _GPU),
)

# -- infermux's own ------------------------------------------------------------------------------
_INSTANCE = ("model", "version", "instance")
_SHADOW = ("model", "version", "outcome")
_MEMORY = ("model", "version", "kind", "device", "component")
_PRECISION = ("model", "version", "precision", "output")
INFERMUX = _declare(
    Family(
        "infermux_request_duration_seconds",
        "histogram",
        "Successful request duration, from arrival at the data plane to its response",
    ),
    Family("infermux_queue_duration_seconds", "histogram", "Time a successful request waited"),
    Family(
        "infermux_compute_duration_seconds",
        "histogram",
        "Time one batch took on its instance (compute input + infer + output)",
    ),
    Family("infermux_batch_size", "histogram", "Rows per model execution (batch size)"),
    Family(
        "infermux_first_response_duration_seconds",
        "histogram",
        "Time from a request's arrival at the data plane to its first response",
    ),
    Family(
        "infermux_response_interval_seconds",
        "histogram",
        "Time between consecutive responses of a request to a decoupled model, as the model "
        "sent them",
    ),
    Family(
        "infermux_responses_total",
        "counter",
        "Responses of decoupled models' requests by outcome: success, fail, empty (a final flag "
        "alone) or cancel (the request was given up awaiting it); Triton's response_stats summed",
        ("model", "version", "outcome"),
    ),
    Family("infermux_requests_in_flight", "gauge", "Requests admitted and not yet answered"),
    Family(
        "infermux_instance_busy_seconds_total",
        "counter",
        "Time each instance (its CUDA stream on a GPU) was taken by a batch: its rate is the "
        "instance's occupancy",
        _INSTANCE,
    ),
    Family(
        "infermux_instance_restarts_total",
        "counter",
        "Instances replaced because an execution overran the execution timeout "
        "(reason=timeout), or process-isolated workers restarted after dying (reason=crash)",
        (*_INSTANCE, "reason"),
    ),
    Family(
        "infermux_model_memory_bytes",
        "gauge",
        "Memory a model version holds, by kind (GPU, CPU, CPU_PINNED), device and component "
        "(weights, buffers, graphs, staging)",
        _MEMORY,
    ),
    Family(
        "infermux_model_precision_error",
        "gauge",
        "Relative error of a reduced-precision model version against fp32, per output, measured "
        "by the accuracy guard at load: ||reduced - fp32|| / ||fp32|| over its inputs",
        _PRECISION,
    ),
    Family(
        "infermux_model_precision_top1_agreement",
        "gauge",
        "Share of the accuracy guard's rows whose arg-max (top-1 class) agrees with fp32, per "
        "output with a class axis",
        _PRECISION,
    ),
    Family(
        "infermux_calibration_cache_loads_total",
        "counter",
        "Instance loads of a reduced-precision model version by calibration cache result: hit "
        "(reused), miss (calibrated now) or corrupt (discarded, calibrated again)",
        ("model", "version", "result"),
    ),
    Family(
        "infermux_model_load_failures_total",
        "counter",
        "Failed loads of a model or one of its versions (the old version keeps serving a failed "
        "reload; the repository index says why)",
        ("model",),
    ),
    Family(
        "infermux_shadow_requests_total",
        "counter",
        "Requests mirrored to a shadow version (label version), by outcome: agreed or disagreed "
        "with the primary's answer, failed, or dropped (not run)",
        _SHADOW,
    ),
    Family(
        "infermux_shadow_max_abs_diff",
        "gauge",
        "Largest absolute difference seen between a shadow version's output and the primary's",
        ("model", "version", "output"),
    ),
    Family(
        "infermux_shadow_latency_delta_seconds_total",
        "counter",
        "Sum over compared requests of (shadow duration - primary duration)",
    ),
)

METRICS = {**TRITON, **GPU, **INFERMUX}
"""Every metric infermux declares (the process collector's ``process_*`` come on top)."""


def names(families: Sequence[Family] | None = None) -> set[str]:
    """Every series name a family may expose (histograms as _bucket/_count/_sum too)."""
    result: set[str] = set()
    for family in families if families is not None else METRICS.values():
        result.add(family.name)
        if family.kind == "histogram":
            result.update(f"{family.name}_{suffix}" for suffix in ("bucket", "count", "sum"))
    return result
