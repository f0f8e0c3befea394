"""The Prometheus text exposition of infermux's metrics, and the merge of several executors'
families into one exposition (``--executors N``).

Counter names are written as declared: prometheus-client's own writer appends ``_total`` to
every counter, which would rename Triton's ``nv_inference_request_success`` (see
docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

Sample = tuple[str, dict[str, str], float]
FamilyData = tuple[str, str, str, list[Sample]]
"""A family as plain data (name, help, type, samples), to cross processes."""

MAX_MERGED = frozenset({"nv_model_load_duration_secs", "infermux_shadow_max_abs_diff"})
"""Gauges merged over executors by their largest value; every other sample is summed."""


def family_data(source: CollectorRegistry) -> list[FamilyData]:
    """One executor's families as plain data, for the supervisor to merge."""
    return [(f.name, f.documentation, f.type, [(s.name, s.labels, s.value) for s in f.samples])
            for f in source.collect()]  # fmt: skip


def merge(parts: Iterable[list[FamilyData]]) -> list[Metric]:
    """Every executor's families as one exposition (several executors: ``--executors N``).
    A model version hosted by several executors has its counters, durations, histogram buckets
    and gauges summed (what one process serving all of it would show), load time and largest
    shadow difference maximised. GPU and process families come from executor 0 alone."""
    families: dict[str, Metric] = {}
    values: dict[str, dict[tuple[str, tuple[tuple[str, str], ...]], Sample]] = {}
    for part in parts:
        for name, documentation, kind, samples in part:
            if name not in families:
                families[name] = Metric(name, documentation, kind)
                values[name] = {}
            held = values[name]
            for sample_name, labels, value in samples:
                key = (sample_name, tuple(labels.items()))
                if key not in held:
                    held[key] = (sample_name, labels, value)
                elif name in MAX_MERGED:
                    held[key] = (sample_name, labels, max(held[key][2], value))
                else:
                    held[key] = (sample_name, labels, held[key][2] + value)
    for name, family in families.items():
        for sample_name, labels, value in values[name].values():
            family.add_sample(sample_name, labels, value)
    return list(families.values())


def render(source: CollectorRegistry | Iterable[Metric]) -> bytes:
    """The Prometheus text exposition of every family in ``source``."""
    families = source.collect() if isinstance(source, CollectorRegistry) else source
    lines: list[str] = []
    for family in families:
        name, kind = family.name, family.type
        # prometheus-client strips `_total` from the counters it makes (ProcessCollector's
        # process_cpu_seconds_total); declared names are exposed as they are.
        if kind == "counter" and any(s.name == f"{name}_total" for s in family.samples):
            name = f"{name}_total"
        lines.append(f"# HELP {name} {_escape_help(family.documentation)}")
        lines.append(f"# TYPE {name} {kind if kind != 'unknown' else 'untyped'}")
        lines.extend(_sample_line(s.name, s.labels, s.value) for s in family.samples)
    lines.append("")
    return "\n".join(lines).encode()


def _sample_line(name: str, labels: dict[str, str], value: float) -> str:
    if not labels:
        return f"{name} {number(value)}"
    # Labels in the order they were added (model, version, then the family's own), which
    # Prometheus accepts; a scrape formats thousands of samples on the event loop, so no sorting.
    text = ",".join([f'{key}="{_escape_label(v)}"' for key, v in labels.items()])
    return f"{name}{{{text}}} {number(value)}"


def number(value: float) -> str:
    """A value as Prometheus writes it (``+Inf``, ``1e+06``; integers as integers)."""
    if type(value) is int:
        return str(value)
    return str(floatToGoString(value))  # type: ignore[no-untyped-call]  # untyped in the library


def _escape_help(text: str) -> str:
    return text.replace("\\", r"\\").replace("\n", r"\n")


def _escape_label(text: str) -> str:
    if "\\" not in text and "\n" not in text and '"' not in text:
        return text  # nearly always: model names, versions, reasons
    return text.replace("\\", r"\\").replace("\n", r"\n").replace('"', r"\"")
