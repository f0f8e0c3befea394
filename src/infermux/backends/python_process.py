"""Process isolation for Python models: ``parameters { key: "isolation" value: { string_value:
"process" } }`` runs each instance's ``model.py`` in a worker process of its own.

A model that segfaults, calls ``os._exit`` or is killed takes down only its worker: the batch it
was running fails at once with UNAVAILABLE (503), and the worker is restarted straight away (a
watcher thread waits on the process, so an idle crash is repaired before the next request);
requests queued meanwhile wait for the new worker. Every other model, and the server, carry on.
The price is one copy of the tensors each way through a pipe (pickled by infermux's own code at
both ends; the worker sends exceptions as plain text, ``python_worker.RemoteFailure``).
"""

from __future__ import annotations

import dataclasses
import logging
import multiprocessing
import multiprocessing.popen_spawn_posix  # eagerly: see below
import signal
import threading
import time
from collections.abc import Sequence
from multiprocessing.connection import Connection, wait
from multiprocessing.process import BaseProcess

from infermux.backends import python_worker
from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest
from infermux.backends.python_worker import RemoteFailure
from infermux.errors import ErrorCode, InfermuxError, ModelLoadError, UnavailableError

# multiprocessing.popen_spawn_posix is imported above, with this module, not lazily by the first
# Process.start() on an instance thread: two isolated instances starting at once on two loader
# threads raced that import once in CI ("Can't pickle <class 'multiprocessing.popen_spawn_posix.
# _DupFd'>: it's not the same object").

logger = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0  # import and initialize() of a real model can take minutes
CLOSE_TIMEOUT_S = 10.0
RESTART_BACKOFF_S = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)


class ProcessInstance:
    """One Python model instance living in its own worker process."""

    def __init__(self, context: ModelContext) -> None:
        self._context = context
        self._label = f"model '{context.config.name}' instance '{context.instance_name}'"
        self._lock = threading.Lock()  # one exchange on the pipe at a time; restarts under it
        self._closing = threading.Event()
        self._aborted = False
        self._last_error = ""
        self.crashes = 0
        """Workers that died on their own (not killed by an execution timeout) and were
        restarted."""
        self.pid = 0
        self._process: BaseProcess | None
        self._conn: Connection | None
        self._process, self._conn = self._start()
        self._watcher = threading.Thread(
            target=self._watch, name=f"{context.instance_name}-watch", daemon=True
        )
        self._watcher.start()

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        with self._lock:
            if self._process is None or not self._process.is_alive():
                self._restart()
            if self._process is None or self._conn is None:
                raise UnavailableError(
                    f"{self._label}: its worker process could not be restarted: {self._last_error}"
                )
            process, conn = self._process, self._conn
            try:
                conn.send(("execute", list(requests)))
                reply = conn.recv()
            except (EOFError, OSError):
                process.join(timeout=1.0)
                raise UnavailableError(
                    f"{self._label}: its worker process {_ended(process, self._aborted)} while "
                    "running this request; it is being restarted"
                ) from None
        if reply[0] == "raised":
            raise _rebuild(reply[1])
        return [_rebuild(r) if isinstance(r, RemoteFailure) else r for r in reply[1]]

    def abort(self) -> None:
        """Kill the worker (its execution overran the timeout); it is restarted."""
        process = self._process
        if process is not None and process.is_alive():
            self._aborted = True
            process.kill()

    def close(self) -> None:
        self._closing.set()
        with self._lock:
            process, conn = self._process, self._conn
            self._process = self._conn = None
        if process is None or conn is None:
            return
        try:
            conn.send(("close",))
            if conn.poll(CLOSE_TIMEOUT_S):
                conn.recv()
        except (EOFError, OSError):
            pass
        process.join(CLOSE_TIMEOUT_S)
        if process.is_alive():
            logger.warning("%s: finalize() did not return; killing the worker", self._label)
            process.kill()
            process.join()
        conn.close()

    # -- the worker process -----------------------------------------------------------------------

    def _start(self) -> tuple[BaseProcess, Connection]:
        """Start a worker and wait until it has loaded the model; raises ModelLoadError. A worker
        that dies before saying anything (not a load error of the model's: those it reports) is
        tried once more, so one lost start does not leave the model unavailable."""
        try:
            return self._start_once()
        except _DiedStarting as exc:
            logger.warning("%s: %s; starting it once more", self._label, exc)
        try:
            return self._start_once()
        except _DiedStarting as exc:
            raise ModelLoadError(f"{self._label}: {exc}") from None

    def _start_once(self) -> tuple[BaseProcess, Connection]:
        context = multiprocessing.get_context("spawn")  # fork would copy the server's threads
        ours, theirs = context.Pipe()
        process = context.Process(
            target=python_worker.main,
            # The server's handle for BLS stays here: a worker cannot call into the server.
            args=(theirs, dataclasses.replace(self._context, server=None)),
            name=f"infermux-model-{self._context.instance_name}",
            daemon=True,  # terminated with the executor when it exits normally
        )
        process.start()
        theirs.close()
        problem = ""
        try:
            if ours.poll(START_TIMEOUT_S):
                message = ours.recv()
                if message[0] == "ready":
                    self.pid = int(message[1])
                    return process, ours
                problem = message[1].message  # the load error, as the in-process backend says it
            else:
                problem = f"{self._label}: worker did not load the model in {START_TIMEOUT_S:g} s"
        except (EOFError, OSError):
            process.join(timeout=1.0)
            ours.close()
            raise _DiedStarting(f"worker process {_ended(process, False)} while loading") from None
        ours.close()
        process.join(timeout=CLOSE_TIMEOUT_S)
        if process.is_alive():
            process.kill()
            process.join()
        raise ModelLoadError(problem)

    def _restart(self) -> None:
        """Replace a dead worker (lock held); on failure leave none and remember why."""
        old, aborted = self._process, self._aborted
        if old is not None:
            old.join(timeout=1.0)
            if not aborted:
                self.crashes += 1
            logger.warning(
                "%s: worker process (pid %d) %s; restarting it",
                self._label,
                self.pid,
                _ended(old, aborted),
            )
        if self._conn is not None:
            self._conn.close()
        self._process = self._conn = None
        self._aborted = False
        started = time.monotonic()
        try:
            self._process, self._conn = self._start()
        except ModelLoadError as exc:
            self._last_error = str(exc)
            logger.error("%s: restarting the worker failed: %s", self._label, exc)
            return
        logger.info(
            "%s: worker restarted (pid %d) in %.2f s",
            self._label,
            self.pid,
            time.monotonic() - started,
        )

    def _watch(self) -> None:
        # Restart a worker that died while idle, so that the next request does not wait for it;
        # with no worker (a restart failed) try again with back-off.
        failures = 0
        while not self._closing.is_set():
            process = self._process
            if process is not None:
                wait([process.sentinel])
            else:
                time.sleep(RESTART_BACKOFF_S[min(failures, len(RESTART_BACKOFF_S) - 1)])
            with self._lock:
                if self._closing.is_set():
                    return
                if self._process is process:  # nobody restarted it meanwhile
                    self._restart()
                failures = 0 if self._process is not None else failures + 1


class _DiedStarting(Exception):
    """The worker ended before reporting whether the model loaded."""


def _ended(process: BaseProcess, aborted: bool) -> str:
    if aborted:
        return "was killed after overrunning its execution timeout"
    code = process.exitcode
    if code is None:
        return "stopped answering"
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


_types: dict[str, type[Exception]] = {}


def _rebuild(failure: RemoteFailure) -> Exception:
    """The worker's exception as the in-process backend would have shown it: same class name and
    message (an InfermuxError keeps the code the model chose)."""
    if failure.code is not None:
        return InfermuxError(failure.message, ErrorCode(failure.code))
    kind = failure.kind if failure.kind.isidentifier() else "Exception"
    cls = _types.get(kind)
    if cls is None:
        cls = _types[kind] = type(kind, (Exception,), {})
    return cls(failure.message)
