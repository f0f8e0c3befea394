"""The child side of a process-isolated Python model (``backends/python_process.py``).

It loads the user's ``model.py`` exactly as the in-process backend does, then answers the
parent's messages over a private pipe until told to close or the parent goes away. Results go
back as the model returned them, except exceptions, which are sent as (kind, code, text) so that
the parent never has to unpickle an exception class of the user's.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

from infermux.backends.base import ModelContext
from infermux.backends.python_model import load_in_process
from infermux.errors import InfermuxError

PARENT_POLL_S = 1.0


@dataclass(frozen=True, slots=True)
class RemoteFailure:
    """An exception from the worker: ``code`` is an ErrorCode value when the model raised an
    InfermuxError (it chose the status), else None; ``kind`` is the exception's class name."""

    kind: str
    code: str | None
    message: str


def describe(exc: BaseException) -> RemoteFailure:
    if isinstance(exc, InfermuxError):
        return RemoteFailure(type(exc).__name__, exc.code.value, exc.message)
    return RemoteFailure(type(exc).__name__, None, str(exc))


def main(conn: Connection, context: ModelContext) -> None:
    """Process entry point: load the model, then serve ``execute`` and ``close``."""
    _exit_with_parent(os.getppid())
    try:
        instance = load_in_process(context)
    except BaseException as exc:
        conn.send(("failed", describe(exc)))
        return
    conn.send(("ready", os.getpid()))
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            return  # the parent closed the pipe or died
        if message[0] == "close":
            try:
                instance.close()
            finally:
                conn.send(("closed",))
            return
        _, requests = message
        try:
            results = instance.execute(requests)
            reply: tuple[Any, ...] = (
                "results",
                [describe(r) if isinstance(r, BaseException) else r for r in results],
            )
        except BaseException as exc:
            reply = ("raised", describe(exc))
        try:
            conn.send(reply)
        except Exception as exc:  # e.g. an output that cannot be pickled
            failure = RemoteFailure(type(exc).__name__, None, f"result not sent: {exc}")
            conn.send(("raised", failure))


def _exit_with_parent(parent: int) -> None:
    # A worker stuck in model code never sees the pipe close; this thread ends it when the
    # executor that started it is gone (re-parented), so no orphan keeps a GPU or a core.
    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(PARENT_POLL_S)
        os._exit(70)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()
