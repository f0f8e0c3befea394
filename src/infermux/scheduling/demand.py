"""Instances falling free, told to whoever holds requests back before they reach a queue.

Front ends hold a micro-batch while the executor is busy with their work
(``transport/grouping.py``): it would wait in the model's queue anyway, and it arrives as one
frame instead of many. A held micro-batch leaves when an answer comes back to its front end. But
an instance that falls free forms its next batch from what is queued within
``max_queue_delay_microseconds``, and a front end none of whose requests were in the batch that
just ended keeps holding its own: the batch that forms is smaller than the requests inside the
server allow (at c=256 a third of ResNet-50's batches carried 1-5 rows, each holding its instance
~8 ms while four streams share the GPU: ``docs/benchmarks.md``). So a batcher whose instance
falls free without a full batch queued says so here, and the executor's channel server asks
every front end that holds a micro-batch to send it now (``transport/channel_server.py``).

A process-wide hub, as :data:`~infermux.observability.tracing.TRACING` is: the batchers are made
deep in model loading, and what listens (the channel server) is the process's, not a model's.
Telling is a hint: nothing is lost or reordered by a listener missing it or acting on it twice.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable

Listener = Callable[[], None]


class Demand:
    """Who is told that an instance fell free (:meth:`instance_free`)."""

    def __init__(self) -> None:
        self._listeners: list[Listener] = []

    def listen(self, listener: Listener) -> None:
        """Call ``listener()`` whenever an instance falls free with less than a full batch
        queued (on the event loop, from the batcher's worker: it must not block)."""
        self._listeners.append(listener)

    def ignore(self, listener: Listener) -> None:
        """Stop calling ``listener`` (nothing when it was not listening)."""
        with contextlib.suppress(ValueError):
            self._listeners.remove(listener)

    def instance_free(self) -> None:
        """An instance fell free and its queue holds less than a full batch."""
        for listener in self._listeners:
            listener()


DEMAND = Demand()
"""This process's hub."""
