"""Python's cyclic garbage collector, set for a server that has finished starting.

Serving allocates and frees many small containers per request (tasks, futures, frames' tensors,
dicts), nearly all freed by reference counting; but with CPython's default thresholds the
collector still runs a young collection every 700 net allocations, and each of its full
collections walks every object the process holds -- a few hundred thousand once torch and the
models are imported. In the executor under load that was 12-14% of its loop's time
(``docs/decisions.md``, *The garbage collector in serving processes*). Once a process is
serving, :func:`settle` moves everything it holds into the permanent generation
(``gc.freeze``: never walked again) and lets young collections wait for
:data:`YOUNG_THRESHOLD` net allocations.

Frozen objects are never collected, so whatever frees a large part of the heap (a model
unloaded: its objects sit in reference cycles) collects through :func:`collect`, which thaws
them first and freezes what is left again.
"""

from __future__ import annotations

import gc
import threading

YOUNG_THRESHOLD = 10_000
"""Net allocations of tracked objects between young collections (CPython's default: 700). At
c=256 the executor's steady state stayed below it for seconds; cyclic garbage a request leaves
(an exception's traceback) waits at most this many allocations."""


class _Collector:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.settled = False


_COLLECTOR = _Collector()


def settle() -> None:
    """This process has started: collect once, freeze what survives, collect young objects
    less often. Idempotent; the collector stays on."""
    with _COLLECTOR.lock:
        gc.collect()
        gc.freeze()
        _, middle, old = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, middle, old)
        _COLLECTOR.settled = True


def collect() -> int:
    """A full collection that also reaches frozen objects (after a model was unloaded), then
    the survivors frozen again when the process had settled; returns what ``gc.collect``
    found unreachable. Safe from any thread (the repository runs it off the event loop)."""
    with _COLLECTOR.lock:
        if not _COLLECTOR.settled:
            return gc.collect()
        gc.unfreeze()
        found = gc.collect()
        gc.freeze()
        return found
