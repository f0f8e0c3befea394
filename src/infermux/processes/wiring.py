"""Which front end has a channel to which executor: the supervisor's wiring.

Every front end gets its own :class:`~infermux.ipc.Channel` to every executor, made fresh
whenever both ends are up (a restarted process never inherits a ring or arena its predecessor
may have left half-written), and dropped when either end goes. A front end that loses its
channel to an executor is told why and lives on; the executor is told when a front end it
served is gone.
"""

from __future__ import annotations

from pathlib import Path

from infermux.ipc import Channel
from infermux.settings import IPC_RING_BYTES

from .children import Slot
from .control import Attach, Detach


class Wiring:
    """The channels between the front ends' ``slots`` and the ``executors``' places, in
    ``directory``, each with an arena of ``arena_bytes``."""

    def __init__(
        self, slots: list[Slot], executors: list[Slot], directory: Path, arena_bytes: int
    ) -> None:
        self._slots = slots
        self._executors = executors
        self._directory = directory
        self._arena_bytes = arena_bytes

    def connect_all(self) -> None:
        for slot in self._slots:
            self.connect(slot)

    def connect(self, slot: Slot) -> None:
        """Give ``slot``'s front end a fresh channel to each executor it has none to, where
        both ends are up."""
        child = slot.child
        if child is None or not child.up:
            return
        for place in self._executors:
            ex = place.child
            if ex is None or not ex.up or place.index in slot.channels:
                continue
            channel = Channel(
                self._directory, ring_bytes=IPC_RING_BYTES, arena_bytes=self._arena_bytes
            )
            slot.channels[place.index] = channel
            ex.control.send(Attach(channel.spec))
            child.control.send(Attach(channel.spec, place.index))

    def retire(self, slot: Slot, reason: str, executor: int | None = None) -> None:
        """Drop ``slot``'s channel to ``executor`` (to every executor when None); with a
        ``reason``, its front end is told (it lives on)."""
        for index in [executor] if executor is not None else list(slot.channels):
            channel = slot.channels.pop(index, None)
            if channel is None:
                continue
            if reason and slot.child is not None:
                slot.child.control.send(Detach(channel.spec.id, reason))
            channel.close()

    def front_end_gone(self, slot: Slot, why: str) -> None:
        """``slot``'s front end exited: each executor it had a channel to is told, and the
        channels go."""
        for index, channel in slot.channels.items():
            ex = self._executors[index].child
            if ex is not None:
                ex.control.send(Detach(channel.spec.id, why))
        self.retire(slot, "")

    def executor_gone(self, index: int, why: str) -> None:
        """Executor ``index`` exited: every front end drops its channel to it and is told
        ``why``."""
        for slot in self._slots:
            self.retire(slot, why, executor=index)

    def close(self) -> None:
        for slot in self._slots:
            self.retire(slot, "")
