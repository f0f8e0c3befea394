"""Stopping the supervisor's children (:func:`infermux.processes.children.stop`) with real
processes: one that stopped is not reported hung, even when another thread reaped it first; one
that does not stop is killed after the timeout."""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import time
from typing import Any, cast

import pytest

from infermux.processes.children import Child, stop
from infermux.processes.control import Control, Message, Stop


class FakeControl:
    def __init__(self) -> None:
        self.sent: list[Message] = []
        self.closed = False

    def send(self, message: Message) -> None:
        self.sent.append(message)

    def close(self) -> None:
        self.closed = True


def sleeper(seconds: float) -> multiprocessing.process.BaseProcess:
    process = multiprocessing.get_context("spawn").Process(target=time.sleep, args=(seconds,))
    process.start()
    return process


def child_of(process: multiprocessing.process.BaseProcess) -> Child:
    return Child("frontend", 4, process, cast(Control, FakeControl()))


def hung_warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if "did not stop" in r.getMessage()]


async def test_a_child_reaped_by_another_thread_is_not_reported_hung(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # The supervisor's watcher of each child joins it from a thread of its own as soon as its
    # control socket closes; when that thread reaps the process before stop() looks, the
    # process is gone, and must not be reported (or killed) as one that did not stop.
    process = sleeper(0.1)
    # The watcher's join, caught between reaping the process and recording that it did.
    assert process.pid is not None
    await asyncio.to_thread(os.waitpid, process.pid, 0)
    child = child_of(process)
    caplog.set_level(logging.WARNING, logger="infermux")
    await stop([child], 30)
    assert hung_warnings(caplog) == []
    assert any(isinstance(m, Stop) for m in cast(Any, child.control).sent)
    assert cast(FakeControl, child.control).closed


async def test_a_child_that_does_not_stop_is_killed_after_the_timeout(
    caplog: pytest.LogCaptureFixture,
) -> None:
    process = sleeper(60)  # ignores the Stop message: it never reads it
    child = child_of(process)
    caplog.set_level(logging.WARNING, logger="infermux")
    started = time.monotonic()
    await stop([child], 1.0)
    assert time.monotonic() - started >= 1.0
    assert hung_warnings(caplog) == ["frontend-4 did not stop in 1 s; killing it"]
    assert not process.is_alive()
    assert process.exitcode == -9
