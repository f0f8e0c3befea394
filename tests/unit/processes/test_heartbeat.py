"""The supervisor's heartbeat (:mod:`infermux.processes.heartbeat`), with stand-in children:
who is pinged, who is killed, and when nobody is."""

from __future__ import annotations

from typing import Any, Literal, cast

from infermux.processes.children import Child
from infermux.processes.control import Control, Message, Ping
from infermux.processes.heartbeat import INTERVAL, Heartbeat


class FakeControl:
    def __init__(self) -> None:
        self.sent: list[Message] = []

    def send(self, message: Message) -> None:
        self.sent.append(message)


class FakeProcess:
    pid = 4242

    def __init__(self) -> None:
        self.killed = False

    def kill(self) -> None:
        self.killed = True


def child(role: Literal["executor", "frontend"] = "frontend", index: int = 1) -> Child:
    made = Child(role, index, cast(Any, FakeProcess()), cast(Control, FakeControl()))
    made.up = True
    return made


def pings(c: Child) -> int:
    return sum(isinstance(m, Ping) for m in cast(FakeControl, c.control).sent)


def killed(c: Child) -> bool:
    return cast(FakeProcess, c.process).killed


def test_a_child_that_answers_lives_and_one_that_does_not_is_killed() -> None:
    heartbeat = Heartbeat({"frontend": 3.0, "executor": 0.0})
    answering, silent, executor = child(index=0), child(index=1), child("executor", 0)
    everyone = [answering, silent, executor]
    for second in range(4):
        assert heartbeat.beat(everyone, now=100.0 + second) == []
        heartbeat.answered(answering)
    assert pings(answering) == pings(silent) == 4
    assert pings(executor) == 0  # timeout 0: never watched
    assert heartbeat.beat(everyone, now=104.0) == [silent]
    assert killed(silent)
    assert silent.hung
    assert not killed(answering)
    assert heartbeat.beat(everyone, now=105.0) == []  # killed once; its death does the rest
    assert not killed(executor)


def test_children_not_up_or_stopping_are_left_alone() -> None:
    heartbeat = Heartbeat({"frontend": 1.0})
    starting, stopping = child(index=0), child(index=1)
    starting.up = False
    stopping.stopping = True
    for second in range(10):
        heartbeat.beat([starting, stopping], now=float(second))
    assert not killed(starting)
    assert not killed(stopping)
    assert pings(starting) == pings(stopping) == 0
    # Once up, its silence counts from then, not from its start.
    starting.up = True
    assert heartbeat.beat([starting], now=10.0) == []
    assert heartbeat.beat([starting], now=11.0) == []
    assert heartbeat.beat([starting], now=12.5) == [starting]


def test_a_stalled_supervisor_kills_nobody_for_its_own_delay() -> None:
    heartbeat = Heartbeat({"frontend": 2.0})
    front = child()
    heartbeat.beat([front], now=0.0)
    # The supervisor itself did not run for a while: answers may be waiting unread.
    assert heartbeat.beat([front], now=10 * INTERVAL) == []
    assert not killed(front)
    assert heartbeat.beat([front], now=10 * INTERVAL + 1) == []
    assert heartbeat.beat([front], now=10 * INTERVAL + 2.5) == [front]
