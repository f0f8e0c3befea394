"""``pb_utils.MetricFamily``: metrics a model defines, exported on the server's ``/metrics``
beside infermux's own (``observability/metrics.py`` reads :data:`CUSTOM_METRICS` per scrape).

A family belongs to the model instances that created it (two instances, or two models, naming
the same family share it, as in Triton); it leaves ``/metrics`` when the last of them closes,
that is when its model is unloaded.
"""

from __future__ import annotations

import bisect
import math
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

from prometheus_client.metrics_core import Metric as PromFamily

from infermux.backends.pb_utils.errors import TritonModelException

_NAME = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_RESERVED = ("nv_", "infermux_")  # the server's own families

COUNTER = 0
GAUGE = 1
HISTOGRAM = 2
_KIND_NAMES = {COUNTER: "counter", GAUGE: "gauge", HISTOGRAM: "histogram"}


@dataclass(slots=True)
class _Series:
    labels: dict[str, str]
    value: float = 0.0
    buckets: tuple[float, ...] = ()
    counts: list[int] = field(default_factory=list)
    observed: int = 0


@dataclass(slots=True)
class _Family:
    name: str
    description: str
    kind: int
    owners: set[str] = field(default_factory=set)
    series: dict[tuple[tuple[str, str], ...], _Series] = field(default_factory=dict)


class CustomMetrics:
    """Every family models created in this process, and who created each."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._families: dict[str, _Family] = {}
        self._owner = threading.local()

    def set_owner(self, owner: str) -> str:
        """Families created on this thread from now on belong to ``owner`` (a model instance);
        returns the previous owner, to put back."""
        previous: str = getattr(self._owner, "name", "")
        self._owner.name = owner
        return previous

    def release(self, owner: str) -> None:
        """``owner`` closed: drop the families no other instance holds."""
        with self._lock:
            for name, family in list(self._families.items()):
                family.owners.discard(owner)
                if not family.owners:
                    del self._families[name]

    def family(self, name: str, description: str, kind: int) -> _Family:
        if not isinstance(name, str) or not _NAME.fullmatch(name):
            raise TritonModelException(f"invalid metric family name {name!r}")
        if name.startswith(_RESERVED):
            raise TritonModelException(
                f"metric family name {name!r} is reserved for the server's own metrics"
            )
        if kind not in _KIND_NAMES:
            raise TritonModelException(
                f"metric family kind must be COUNTER, GAUGE or HISTOGRAM, got {kind!r}"
            )
        owner = getattr(self._owner, "name", "")
        with self._lock:
            family = self._families.get(name)
            if family is None:
                family = self._families[name] = _Family(name, description, kind)
            elif family.kind != kind:
                raise TritonModelException(
                    f"metric family {name!r} exists as a {_KIND_NAMES[family.kind]}, not a "
                    f"{_KIND_NAMES[kind]}"
                )
            family.owners.add(owner)
            return family

    def series(self, family: _Family, labels: dict[str, str], buckets: Sequence[float]) -> _Series:
        for name, value in labels.items():
            if (
                not isinstance(name, str)
                or not _LABEL.fullmatch(name)
                or not isinstance(value, str)
            ):
                raise TritonModelException(f"invalid label {name!r}: {value!r} (str: str)")
        if family.kind == HISTOGRAM:
            if not buckets or list(buckets) != sorted(set(buckets)):
                raise TritonModelException("a histogram needs increasing buckets")
        elif buckets:
            raise TritonModelException("buckets are only for a HISTOGRAM family")
        key = tuple(sorted(labels.items()))
        with self._lock:
            found = family.series.get(key)
            if found is None:
                bounds = tuple(float(b) for b in buckets)
                counts = [0] * (len(bounds) + 1) if bounds else []
                found = family.series[key] = _Series(dict(labels), 0.0, bounds, counts)
            return found

    def add(self, family: _Family, series: _Series, amount: float) -> None:
        with self._lock:
            series.value += amount

    def put(self, series: _Series, value: float) -> None:
        with self._lock:
            series.value = value

    def observe(self, series: _Series, value: float) -> None:
        with self._lock:
            series.counts[bisect.bisect_left(series.buckets, value)] += 1
            series.observed += 1
            series.value += value

    def collect(self) -> list[PromFamily]:
        """The families as Prometheus families (for ``/metrics``)."""
        result = []
        with self._lock:
            for family in self._families.values():
                out = PromFamily(family.name, family.description, _KIND_NAMES[family.kind])
                for series in family.series.values():
                    if family.kind != HISTOGRAM:
                        out.add_sample(family.name, series.labels, series.value)
                        continue
                    total = 0
                    bounds = (*series.buckets, math.inf)
                    for bound, count in zip(bounds, series.counts, strict=True):
                        total += count
                        le = "+Inf" if bound == math.inf else _bound(bound)
                        out.add_sample(f"{family.name}_bucket", {**series.labels, "le": le}, total)
                    out.add_sample(f"{family.name}_count", series.labels, series.observed)
                    out.add_sample(f"{family.name}_sum", series.labels, series.value)
                result.append(out)
        return result


def _bound(value: float) -> str:
    return str(int(value)) if value.is_integer() else repr(value)


CUSTOM_METRICS = CustomMetrics()
"""This process's model-defined metrics."""


class MetricFamily:
    """``MetricFamily(name, description, kind)``: a named metric with one series per label set."""

    COUNTER: ClassVar[int] = COUNTER
    GAUGE: ClassVar[int] = GAUGE
    HISTOGRAM: ClassVar[int] = HISTOGRAM

    def __init__(self, name: str, description: str, kind: int) -> None:
        self._family = CUSTOM_METRICS.family(name, description, kind)

    def Metric(
        self, labels: dict[str, str] | None = None, buckets: Sequence[float] | None = None
    ) -> Metric:
        """The series of this family with ``labels`` (the same one for the same labels);
        ``buckets``, upper bounds in increasing order, for a HISTOGRAM family."""
        series = CUSTOM_METRICS.series(self._family, labels or {}, buckets or ())
        return Metric(self._family, series)


class Metric:
    """One series: ``increment`` (COUNTER, GAUGE), ``set`` (GAUGE), ``observe`` (HISTOGRAM)."""

    def __init__(self, family: _Family, series: _Series) -> None:
        self._family = family
        self._series = series

    def increment(self, value: float) -> None:
        if self._family.kind == HISTOGRAM:
            raise TritonModelException("increment() is not supported for a HISTOGRAM; observe()")
        if self._family.kind == COUNTER and value < 0:
            raise TritonModelException("a COUNTER cannot be incremented by a negative value")
        CUSTOM_METRICS.add(self._family, self._series, float(value))

    def set(self, value: float) -> None:
        if self._family.kind != GAUGE:
            raise TritonModelException("set() is only supported for a GAUGE")
        CUSTOM_METRICS.put(self._series, float(value))

    def observe(self, value: float) -> None:
        if self._family.kind != HISTOGRAM:
            raise TritonModelException("observe() is only supported for a HISTOGRAM")
        CUSTOM_METRICS.observe(self._series, float(value))

    def value(self) -> float:
        if self._family.kind == HISTOGRAM:
            raise TritonModelException("value() is not supported for a HISTOGRAM")
        return self._series.value
