"""What the repository manager knows about each model: control modes, version states, and the
per-model entry (served versions, states, errors, whether this executor hosts it)."""

from __future__ import annotations

import asyncio
import enum
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from infermux.repository.layout import Fingerprint, ModelSource
from infermux.repository.loader import LoadedModel


class ControlMode(str, enum.Enum):
    """``--model-control-mode``, with Triton's meaning."""

    NONE = "none"
    POLL = "poll"
    EXPLICIT = "explicit"


class State(str, enum.Enum):
    """A model version's state as the repository index reports it."""

    LOADING = "LOADING"
    READY = "READY"
    UNLOADING = "UNLOADING"
    UNAVAILABLE = "UNAVAILABLE"


@dataclass(slots=True)
class Entry:
    """Everything known about one model name."""

    source: ModelSource | None
    serving: dict[int, LoadedModel] = field(default_factory=dict)
    states: dict[int, tuple[State, str]] = field(default_factory=dict)
    model_error: str = ""  # set when the model failed before any version could be tried
    requested: bool = False  # should be loaded; drives strict readiness
    hosted: bool = True  # False: its instances all belong to other executors (placement.py)
    load_failures: int = 0  # loads that failed (the model or any of its versions), for metrics
    fingerprint: Fingerprint = ()
    overrides: list[Path] = field(default_factory=list)
    """Directories made of load requests' files that served versions were loaded from (the
    newest last); removed once no served version can read them."""
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)


class LoadObserver(Protocol):
    """Told when each model version starts and ends loading (for progress displays)."""

    def started(self, name: str, version: int) -> None: ...

    def finished(self, name: str, version: int, seconds: float, error: str | None) -> None: ...


class Quiet:
    def started(self, name: str, version: int) -> None:
        pass

    def finished(self, name: str, version: int, seconds: float, error: str | None) -> None:
        pass
