"""The supervisor's wiring on its own: a fresh channel per front end and executor where both
are up, told to both ends; dropped (and the survivor told why) when either end exits."""

from __future__ import annotations

from pathlib import Path
from typing import Any, cast

from infermux.processes.children import Child, Slot
from infermux.processes.control import Attach, Control, Detach, Message
from infermux.processes.wiring import Wiring


class FakeControl:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, message: Message) -> None:
        self.sent.append(message)


def child(role: Any, index: int, *, up: bool = True) -> Child:
    made = Child(role, index, cast(Any, None), cast(Control, FakeControl()))
    made.up = up
    return made


def sent(made: Child | None) -> list[Message]:
    assert made is not None
    return cast(FakeControl, made.control).sent


def wiring(
    tmp_path: Path, fronts: int = 2, executors: int = 2
) -> tuple[Wiring, list[Slot], list[Slot]]:
    slots = [Slot(i, child("frontend", i)) for i in range(fronts)]
    places = [Slot(i, child("executor", i)) for i in range(executors)]
    return Wiring(slots, places, tmp_path, 1 << 20), slots, places


def test_every_front_end_gets_its_own_channel_to_every_executor(tmp_path: Path) -> None:
    wires, slots, places = wiring(tmp_path)
    wires.connect_all()
    ids = {(s.index, e): c.spec.id for s in slots for e, c in s.channels.items()}
    assert sorted(ids) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(set(ids.values())) == 4
    for slot in slots:  # the front end hears of each channel with its executor's index
        assert [(m.spec.id, m.executor) for m in sent(slot.child) if isinstance(m, Attach)] == [
            (slot.channels[0].spec.id, 0),
            (slot.channels[1].spec.id, 1),
        ]
    for place in places:
        assert {m.spec.id for m in sent(place.child) if isinstance(m, Attach)} == {
            s.channels[place.index].spec.id for s in slots
        }
    wires.connect_all()  # already wired: nothing new
    assert sum(len(sent(s.child)) for s in slots + places) == 8
    wires.close()


def test_nothing_is_wired_to_a_process_that_is_not_up(tmp_path: Path) -> None:
    wires, slots, places = wiring(tmp_path)
    assert places[1].child is not None
    places[1].child.up = False
    slots[1].child = None
    wires.connect_all()
    assert list(slots[0].channels) == [0]
    assert slots[1].channels == {}
    wires.close()


def test_an_executor_exiting_drops_its_channels_and_tells_the_front_ends(tmp_path: Path) -> None:
    wires, slots, _ = wiring(tmp_path)
    wires.connect_all()
    gone = {s.index: s.channels[1].spec.id for s in slots}
    wires.executor_gone(1, "executor-1 exited (code 9); it is restarting")
    for slot in slots:
        assert list(slot.channels) == [0]
        assert sent(slot.child)[-1] == Detach(
            gone[slot.index], "executor-1 exited (code 9); it is restarting"
        )
    wires.close()


def test_a_front_end_exiting_tells_each_executor_and_drops_its_channels(tmp_path: Path) -> None:
    wires, slots, places = wiring(tmp_path)
    wires.connect_all()
    ids = {e: c.spec.id for e, c in slots[0].channels.items()}
    before = len(sent(slots[0].child))
    wires.front_end_gone(slots[0], "frontend-0 exited")
    assert slots[0].channels == {}
    assert len(sent(slots[0].child)) == before  # it is gone: nothing is sent to it
    for place in places:
        assert sent(place.child)[-1] == Detach(ids[place.index], "frontend-0 exited")
    assert sorted(slots[1].channels) == [0, 1]  # the other front end keeps its channels
    wires.close()
