"""The executor's side of the front ends' micro-batch hold: held micro-batches asked for when an
instance falls free.

A front end holds a micro-batch while the executor is busy with its work
(``transport/grouping.py``) and publishes how many it holds in a word of its request ring's
header; it sends them when an answer comes back, or when the executor sends
:class:`~infermux.ipc.wire.Wanted`. The executor sends that to every front end holding one when
a batcher's instance falls free with less than a full batch queued (``scheduling/demand.py``):
else a front end none of whose requests were in the batch that just ended would keep its
micro-batch while the free instance forms a small batch without it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable

from infermux.ipc.wire import Wanted, encode
from infermux.scheduling.demand import DEMAND

from .link import Link

WANTED = encode(Wanted())


class HeldBatches:
    """Asks the front ends at the other end of ``links()`` for their held micro-batches whenever
    an instance of this process falls free, from :meth:`start` until :meth:`stop`."""

    def __init__(self, links: Callable[[], Iterable[Link]]) -> None:
        self._links = links
        self._due = False

    def start(self) -> None:
        DEMAND.listen(self._instance_free)

    def stop(self) -> None:
        DEMAND.ignore(self._instance_free)

    def _instance_free(self) -> None:
        # Once this loop iteration is over, after the answers of the batch that ended (one
        # doorbell for both); several instances falling free in one iteration ask once.
        if not self._due:
            self._due = True
            asyncio.get_running_loop().call_soon(self._ask)

    def _ask(self) -> None:
        self._due = False
        for link in self._links():
            if not link.closed and link.endpoint.inbox.load():  # it holds one
                link.send(WANTED)
