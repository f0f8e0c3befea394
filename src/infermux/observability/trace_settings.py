"""Triton's trace extension (``/v2[/models/{m}]/trace/setting``, gRPC ``TraceSetting``) over
infermux's OpenTelemetry tracing: the settings a client reads and changes, globally or for one
model, and the sampling they decide.

Values travel as Triton sends them: ``trace_level`` a list of strings, the numbers as strings.
What maps: ``trace_level`` OFF or TIMESTAMPS (spans with their times; TENSORS is refused: an
OpenTelemetry span records no tensors, as in Triton's opentelemetry mode), ``trace_rate`` (one
request in N starts a trace), ``trace_count`` (traces left to start, -1: no limit; shown as
what is left), ``log_frequency`` (after every N traces the spans are handed to the exporter at
once instead of at its next scheduled export; 0: on its schedule). ``trace_file`` cannot be
set (Triton's refusal: infermux exports over OTLP, it writes no file) and ``trace_mode`` is
always ``opentelemetry``.

Scopes, as Triton's ``TraceManager``: the global settings fall back to the command line's, a
model's to the global ones. A model's request is sampled by the model's own :class:`Sampler`
when it has settings of its own, else by the global one; a model that sets ``trace_rate`` counts
its own requests, one that sets ``trace_count`` has its own count, and what it does not set is
the global value at the time (``null`` clears a setting; a model left with none uses the global
settings again).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from infermux.errors import InvalidArgumentError, UnsupportedError

TRACE_MODE = "opentelemetry"
LEVEL, RATE, COUNT, FREQUENCY = "trace_level", "trace_rate", "trace_count", "log_frequency"
NUMBERS = {RATE: 1, COUNT: -1, FREQUENCY: 0}
"""The numeric settings and the least value each may take."""
LEVELS = ("OFF", "TIMESTAMPS")

TraceValue = str | list[str]
Fields = dict[str, Any]
"""Parsed settings of one scope: ``trace_level`` a str, the numbers ints."""


def checked_trace_changes(changes: Mapping[str, object]) -> dict[str, Any]:
    """``changes`` as a client sent them, checked and parsed: setting name -> value (None:
    clear it). Raises an :class:`InfermuxError` naming the setting (Triton's messages where it
    has one): nothing is changed anywhere when one setting is refused."""
    checked: dict[str, Any] = {}
    for name, value in changes.items():
        if name == "trace_file":
            raise UnsupportedError(
                "trace file location can not be updated through network protocol"
            )
        if name == "trace_mode":
            if value not in (None, TRACE_MODE, [TRACE_MODE]):
                raise UnsupportedError(
                    f"trace_mode can not be updated through network protocol "
                    f"(infermux traces with {TRACE_MODE})"
                )
            continue
        if value is None:
            if name not in (LEVEL, *NUMBERS):
                raise InvalidArgumentError(f"unknown trace setting '{name}'")
            checked[name] = None
        elif name == LEVEL:
            checked[name] = _level(value)
        elif name in NUMBERS:
            checked[name] = _number(name, value)
        else:
            raise InvalidArgumentError(f"unknown trace setting '{name}'")
    return checked


def _level(value: object) -> str:
    if not isinstance(value, list) or not value or not all(isinstance(v, str) for v in value):
        raise InvalidArgumentError(
            "trace setting 'trace_level' must be a list of OFF, TIMESTAMPS (null clears it)"
        )
    if "OFF" in value and len(value) > 1:
        raise InvalidArgumentError("Expect only one trace level 'OFF' is specified")
    for level in value:
        if level == "TENSORS":
            raise UnsupportedError(
                "trace level TENSORS is not supported: infermux traces with OpenTelemetry, "
                "whose spans record times, not tensors (use TIMESTAMPS)"
            )
        if level not in LEVELS:
            raise InvalidArgumentError(
                f"trace setting 'trace_level': unknown level {level!r} (OFF, TIMESTAMPS)"
            )
    return "OFF" if value == ["OFF"] else "TIMESTAMPS"


def _number(name: str, value: object) -> int:
    text = value[0] if isinstance(value, list) and len(value) == 1 else value
    least = NUMBERS[name]
    if not isinstance(text, str):
        raise InvalidArgumentError(f"Unable to parse '{name}': expected a string, got {value!r}")
    try:
        number = int(text.strip())
    except ValueError:
        raise InvalidArgumentError(f"Unable to parse '{name}', got: {text}") from None
    if not least <= number < 2**31:
        raise InvalidArgumentError(
            f"Unable to parse '{name}', value is out of range [ {least}, {2**31 - 1} ], got: {text}"
        )
    return number


class Sampler:
    """One scope's settings (the command line's, the global ones, or a model's) and the
    counters of the requests it samples. ``own`` holds what this scope sets; the rest is
    ``parent``'s, read at each request."""

    def __init__(self, own: Fields, parent: Sampler | None = None) -> None:
        self.own: Fields = {}
        self._parent = parent
        self._seen = 0
        self._remaining = -1
        self._unflushed = 0
        self.update(own)

    def update(self, changes: Mapping[str, Any]) -> None:
        """Apply checked ``changes`` (None: back to the parent's value)."""
        for name, value in changes.items():
            if value is None:
                self.own.pop(name, None)
            else:
                self.own[name] = value
            if name == COUNT and value is not None:
                self._remaining = value
            elif name == RATE:
                self._seen = 0

    def value(self, name: str) -> Any:
        if name in self.own or self._parent is None:
            return self.own[name]
        return self._parent.value(name)

    def _counter(self) -> Sampler:
        """The scope whose count this one's traces use up."""
        if COUNT in self.own or self._parent is None:
            return self
        return self._parent._counter()

    @property
    def on(self) -> bool:
        return bool(self.value(LEVEL) != "OFF")

    def sample(self) -> bool:
        """Whether this request starts a trace: one in ``trace_rate``, while the count lasts
        (a request whose caller decided, by its ``traceparent``, is not counted)."""
        if not self.on:
            return False
        self._seen += 1
        if self._seen % self.value(RATE):
            return False
        counter = self._counter()
        if counter._remaining == 0:
            return False
        if counter._remaining > 0:
            counter._remaining -= 1
        return True

    def ended(self) -> bool:
        """A trace it started ended: whether its spans should go to the exporter now
        (``log_frequency`` of them since the last time)."""
        frequency = int(self.value(FREQUENCY))
        if frequency <= 0:
            return False
        self._unflushed += 1
        if self._unflushed < frequency:
            return False
        self._unflushed = 0
        return True

    def settings(self, url: str) -> dict[str, TraceValue]:
        """As the trace extension answers them."""
        return {
            LEVEL: [str(self.value(LEVEL))],
            RATE: str(self.value(RATE)),
            COUNT: str(self._counter()._remaining),
            FREQUENCY: str(self.value(FREQUENCY)),
            "trace_mode": TRACE_MODE,
            "url": url,
        }


class TraceTable:
    """Every scope's :class:`Sampler`: the command line's (``defaults``), the global one and
    those of the models with settings of their own."""

    def __init__(self, level: str, rate: int, url: str) -> None:
        self.url = url
        self._defaults = Sampler({LEVEL: level, RATE: rate, COUNT: -1, FREQUENCY: 0})
        self._global = Sampler({}, self._defaults)
        self._models: dict[str, Sampler] = {}

    def sampler(self, model: str) -> Sampler:
        """The sampler of ``model``'s requests."""
        return self._models.get(model, self._global)

    def settings(self, model: str = "") -> dict[str, TraceValue]:
        return self.sampler(model).settings(self.url)

    def update(self, model: str, changes: Mapping[str, Any]) -> None:
        """Apply checked ``changes`` to the global scope ("") or to ``model``'s."""
        if not model:
            self._global.update(changes)
            return
        sampler = self._models.get(model)
        if sampler is None:
            sampler = self._models[model] = Sampler({}, self._global)
        sampler.update(changes)
        if not sampler.own:
            del self._models[model]

    def any_on(self) -> bool:
        return self._global.on or any(s.on for s in self._models.values())


def specified(before: Mapping[str, Any], changes: Mapping[str, Any]) -> dict[str, Any]:
    """A scope's settings as set by clients, ``before`` plus ``changes`` (None removes one):
    what a restarted executor is given back (``processes/desired.py``)."""
    after = dict(before)
    for name, value in changes.items():
        if value is None:
            after.pop(name, None)
        else:
            after[name] = value
    return after
