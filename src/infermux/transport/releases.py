"""Answer blocks a front end has read, handed back to the executor.

An answer's outputs lie in the executor's arena until the front end has copied them out. The
front end says so with a :class:`~infermux.ipc.wire.Release` frame, one per loop iteration for
every answer read in it (under load, dozens: one frame instead of dozens), sent without a
wake-up: the executor reads it with its next frames, and looks for it itself when its arena is
full (``link.py``).
"""

from __future__ import annotations

import asyncio

from infermux.ipc.wire import NO_DATA, Release, encode

from .link import Link


class Releases:
    """The answer blocks of the current loop iteration, per link, not yet handed back."""

    def __init__(self) -> None:
        # The list the next Release frame sends, and the link it goes over. Each scheduled send
        # owns its list: offsets freed on a link that replaced another one in the same iteration
        # (an executor restart) start a list of their own, never one meant for the old link.
        self._open: tuple[Link, list[int]] | None = None

    def free(self, link: Link, offsets: list[int]) -> None:
        """Hand back the blocks at ``offsets`` (:data:`~infermux.ipc.wire.NO_DATA`: none) of
        the executor at the other end of ``link``, at the end of this loop iteration."""
        taken = [o for o in offsets if o != NO_DATA]
        if not taken:
            return
        if self._open is None or self._open[0] is not link:
            self._open = (link, [])
            asyncio.get_running_loop().call_soon(self._send, *self._open)
        self._open[1].extend(taken)

    def _send(self, link: Link, offsets: list[int]) -> None:
        if self._open is not None and self._open[1] is offsets:
            self._open = None
        if not link.closed:  # else its executor is gone, and its arena with it
            link.send(encode(Release(offsets)), wake=False)
