"""The supervisor: runs N front-end processes and M executors, and keeps them connected.

It binds the HTTP sockets once (every front end accepts on them, so a front end that dies loses
no queued connection), starts the executors and the front ends, and gives each front end a
fresh :class:`~infermux.ipc.Channel` to each executor whenever both ends are up (:mod:`.wiring`).
It restarts whatever dies: a dead front end costs only its own requests in flight; while an
executor is down, front ends stay up and answer 503 (not ready) until the new one has loaded its
models and been given back what clients changed (:mod:`.desired`; with several executors, the
models the others host keep serving). A process that stops answering its heartbeat is killed
(:mod:`.heartbeat`). With several executors it also serves the metrics endpoint (:mod:`.scrapes`).
A process that keeps dying is restarted with growing delays (up to 10 s), never given up on,
except at start-up, where a failure is the server's failure (bad repository, busy port).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import multiprocessing
import platform
import shutil
import socket
import tempfile
from collections.abc import Coroutine
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Literal, TypeVar

from infermux import __version__
from infermux.errors import InfermuxError, StartupError
from infermux.frontends import unix_socket
from infermux.frontends.metrics import MetricsEndpoint, metrics_socket
from infermux.frontends.serving import http_endpoints, http_sockets
from infermux.ipc.ring import ORDERED_STORES
from infermux.observability.logs import update_log_settings
from infermux.settings import DISABLED_PORT, ServerSettings

from . import executor, frontend
from .children import KILL_GRACE, Child, Slot, next_backoff, stop
from .common import check_shared_memory
from .control import (
    Changed,
    Control,
    Failed,
    LogChanges,
    Message,
    Pong,
    Ready,
    Restore,
    Restored,
    Scraped,
    Started,
)
from .desired import Desired
from .heartbeat import Heartbeat
from .scrapes import Scrapes
from .wiring import Wiring

logger = logging.getLogger("infermux")

_First = TypeVar("_First", Started, Ready)
"""What a child says first: a front end that it started, an executor that it is ready."""


class Supervisor:
    """Runs the server as processes. ``run`` serves until :meth:`request_shutdown`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._stop = asyncio.Event()
        self._events: asyncio.Queue[tuple[Child, Message | None]] = asyncio.Queue()
        self._slots = [Slot(i) for i in range(settings.frontends)]
        self._executors = [Slot(i) for i in range(settings.executors)]
        self._scrapes = Scrapes()
        self._metrics: MetricsEndpoint | None = None
        self._sockets: list[socket.socket] = []
        self._metrics_sock: socket.socket | None = None
        self._grpc_port = settings.grpc_port
        self._directory = Path(tempfile.mkdtemp(prefix="infermux-"))
        self._wiring = Wiring(
            self._slots, self._executors, self._directory, settings.ipc_arena_mb * 2**20
        )
        self._pending: set[asyncio.Task[None]] = set()
        self._log_changes: dict[str, Any] = {}  # what clients changed of the log settings
        self._desired = Desired()  # what clients changed, for restarted executors (.desired)
        self._heartbeat = Heartbeat(
            {
                "frontend": settings.frontend_heartbeat_timeout_secs,
                "executor": settings.executor_heartbeat_timeout_secs,
            }
        )
        self.endpoints: list[str] = []

    def request_shutdown(self) -> None:
        if not self._stop.is_set():
            logger.info("shutting down: finishing in-flight requests")
        self._stop.set()

    # -- running ----------------------------------------------------------------------------------

    async def run(self) -> None:
        if not ORDERED_STORES:
            raise StartupError(
                f"--frontends {self.settings.frontends} --executors {self.settings.executors}: "
                "several processes need the shared-memory ring, which needs x86-64 (this is "
                f"{platform.machine()}); use --frontends 1 --executors 1"
            )
        check_shared_memory(self.settings)
        sockets, socket_files = http_sockets(self.settings)
        self._sockets = sockets
        try:
            self._metrics_sock = metrics_socket(self.settings)
        except StartupError:
            for sock in sockets:
                sock.close()
            raise
        try:
            await self._start()
            if self._metrics is not None:
                await self._metrics.start()
            self._background(self._heartbeat.run(self._children))
            stopped = asyncio.ensure_future(self._stop.wait())
            while not self._stop.is_set():
                event = asyncio.ensure_future(self._events.get())
                await asyncio.wait({event, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if event.done():
                    await self._handle(*event.result())
                else:
                    event.cancel()
        finally:
            if self._metrics is not None:
                await self._metrics.stop()  # closes the listener too
                self._metrics_sock = None
            await self._shutdown()
            for sock in sockets:
                sock.close()
            if self._metrics_sock is not None:
                self._metrics_sock.close()
            for path in socket_files:
                unix_socket.remove(path)
            shutil.rmtree(self._directory, ignore_errors=True)
            logger.info("infermux stopped")

    async def _start(self) -> None:
        """Start everything; any failure before the first ready is a start-up error."""
        executors = []
        for slot in self._executors:
            slot.child = await self._spawn_executor(slot.index)
            executors.append(slot.child)
        first = self._slots[0]
        first.child = await self._spawn_frontend(first.index)
        started = await self._expect(first.child, Started)
        if self._grpc_port != DISABLED_PORT and started.grpc_port is not None:
            self._grpc_port = started.grpc_port  # port 0: the others take the port it got
        others = []
        for slot in self._slots[1:]:
            slot.child = await self._spawn_frontend(slot.index)
            others.append(slot.child)
        for child in others:
            await self._expect(child, Started)
        models: dict[str, None] = {}
        for child in executors:
            ready = await self._expect(child, Ready)
            models.update(dict.fromkeys(ready.models))
        if self._metrics_sock is not None and len(self._executors) > 1:
            self._metrics = MetricsEndpoint(
                self.settings, None, None, self._metrics_sock, source=self._scrape
            )
        self._wiring.connect_all()
        self._announce(sorted(models))

    async def _expect(self, child: Child, kind: type[_First]) -> _First:
        """Wait for ``child``'s first message at start-up, which must be ``kind`` (anything
        else is a :class:`StartupError` naming it); news of the other children is kept, in
        order, for later."""
        deferred: list[tuple[Child, Message | None]] = []
        try:
            while True:
                who, message = await self._events.get()
                if who is not child:  # e.g. the executor's Ready while front ends start
                    deferred.append((who, message))
                    continue
                if isinstance(message, kind):
                    child.up = True
                    return message
                if isinstance(message, Failed):
                    raise StartupError(message.message)
                code = child.process.exitcode
                raise StartupError(f"the {child.name} process exited during start-up (code {code})")
        finally:
            for event in deferred:
                self._events.put_nowait(event)

    def _announce(self, models: list[str]) -> None:
        s = self.settings
        https = s.tls_cert is not None and s.tls_http
        self.endpoints = http_endpoints(s.host, self._sockets, tls=https)
        if s.allow_grpc and self._grpc_port != DISABLED_PORT:
            self.endpoints.append(f"gRPC on {s.host}:{self._grpc_port}")
        if s.allow_grpc and s.grpc_uds is not None:
            self.endpoints.append(f"gRPC on unix:{s.grpc_uds}")
        if self._metrics_sock is not None:
            host, port = self._metrics_sock.getsockname()[:2]
            self.endpoints.append(f"metrics on http://{host}:{port}/metrics")
        # The same line as the one-process server's, which scripts and tests wait for.
        pids = [str(s.child.process.pid) for s in self._executors if s.child is not None]
        logger.info(
            "infermux %s ready: %s (models: %s; %d front-end processes, executor %s %s)",
            __version__,
            ", ".join(self.endpoints),
            ", ".join(models) or "none",
            len(self._slots),
            "pid" if len(pids) == 1 else "pids",
            ", ".join(pids),
        )

    # -- processes --------------------------------------------------------------------------------

    async def _spawn_executor(self, index: int, *, restart: bool = False) -> Child:
        ours, theirs = socket.socketpair()
        # --exit-on-error is about start-up: a restarted executor serves what it can load.
        settings = dataclasses.replace(self.settings, exit_on_error=False) if restart else None
        # One executor serves the metrics socket itself; several are asked by the supervisor.
        metrics = self._metrics_sock if len(self._executors) == 1 else None
        given = self._desired.copy()
        process = self._context.Process(
            target=executor.main,
            args=(settings or self.settings, index, theirs, metrics, given),
            name=f"infermux-executor-{index}",
        )
        child = await self._launch("executor", index, process, ours, theirs)
        child.given = given
        return child

    async def _spawn_frontend(self, index: int) -> Child:
        ours, theirs = socket.socketpair()
        process = self._context.Process(
            target=frontend.main,
            args=(self.settings, index, theirs, self._sockets, self._grpc_port),
            name=f"infermux-frontend-{index}",
        )
        return await self._launch("frontend", index, process, ours, theirs)

    async def _launch(
        self,
        role: Literal["executor", "frontend"],
        index: int,
        process: BaseProcess,
        ours: socket.socket,
        theirs: socket.socket,
    ) -> Child:
        process.start()
        theirs.close()
        only = role == "executor" and len(self._executors) == 1
        child = Child(role, index, process, await Control.open(ours), only=only)
        self._watch(child)
        logger.debug("started %s (pid %s)", child.name, process.pid)
        return child

    def _watch(self, child: Child) -> None:
        async def follow() -> None:
            while (message := await child.control.receive()) is not None:
                self._events.put_nowait((child, message))
            # The socket closed: the process is exiting; reap it off the loop.
            await asyncio.to_thread(child.process.join)
            self._events.put_nowait((child, None))

        self._background(follow())

    def _children(self) -> list[Child]:
        return [s.child for s in self._slots + self._executors if s.child is not None]

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    # -- events -----------------------------------------------------------------------------------

    async def _handle(self, child: Child, message: Message | None) -> None:
        if child.stopping:
            return
        if message is None:
            await self._died(child)
        elif isinstance(message, Pong):
            self._heartbeat.answered(child)
        elif isinstance(message, Changed) and message.method == "log_settings":
            self._log_changed(message.args[0] if message.args else message.kwargs["changes"])
        elif isinstance(message, Changed):
            # The executor's successors get it; so does this one's record of what it was
            # given (a region its restore dropped is not sent to it again).
            self._desired.record(message.method, message.args, message.kwargs)
            child.given.record(message.method, message.args, message.kwargs)
        elif isinstance(message, Scraped):
            self._scrapes.answered(child, message)
        elif isinstance(message, Ready | Restored) and self._executors[child.index].child is child:
            if isinstance(message, Ready):
                self._tell_log_changes(child)
            self._executor_ready(child)
        elif isinstance(message, Started):
            self._tell_log_changes(child)
            child.up = True
            slot = self._slots[child.index]
            if slot.child is child:
                logger.info("%s started again (pid %s)", child.name, child.process.pid)
                self._wiring.connect(slot)
        elif isinstance(message, Failed):
            logger.error("%s cannot start: %s", child.name, message.message)

    def _log_changed(self, changes: dict[str, Any]) -> None:
        """A client changed log settings through some process: every process applies them
        (the supervisor too, it logs), and those started later are told at their start."""
        self._log_changes.update(changes)
        with contextlib.suppress(InfermuxError):  # checked by the front end that took them
            update_log_settings(changes)
        for place in [*self._slots, *self._executors]:
            if place.child is not None:
                place.child.control.send(LogChanges(changes))

    def _tell_log_changes(self, child: Child) -> None:
        if self._log_changes:
            child.control.send(LogChanges(dict(self._log_changes)))

    def _executor_ready(self, child: Child) -> None:
        """A restarted executor has loaded what it was given at spawn (or restored what it was
        sent since): front ends are attached to it once it holds what clients changed, which
        other executors may have changed while it started (the change went to them alone)."""
        if child.given != self._desired:
            child.given = self._desired.copy()
            logger.info("%s ready; restoring what clients changed while it started", child.name)
            child.control.send(Restore(child.given))
            return
        child.up = True
        logger.info("%s ready again; reconnecting front ends", child.name)
        self._wiring.connect_all()

    async def _died(self, child: Child) -> None:
        code = child.process.exitcode
        if child.role == "executor":
            place = self._executors[child.index]
            if place.child is not child:
                return
            logger.error(
                "%s exited (code %s); its models answer 503 until it is back", child.name, code
            )
            self._wiring.executor_gone(
                child.index, f"{child.name} exited (code {code}); it is restarting"
            )
            self._scrapes.gone(child.index)
            place.backoff = next_backoff(place.backoff, child)
            place.child = None
            self._background(self._respawn_executor(place))
            return
        slot = self._slots[child.index]
        if slot.child is not child:
            return
        logger.error("%s exited (code %s); restarting it", child.name, code)
        self._wiring.front_end_gone(slot, f"{child.name} exited")
        slot.child = None
        slot.backoff = next_backoff(slot.backoff, child)
        self._background(self._respawn_frontend(slot))

    async def _respawn_executor(self, place: Slot) -> None:
        await asyncio.sleep(place.backoff)
        if not self._stop.is_set():
            place.child = await self._spawn_executor(place.index, restart=True)

    async def _respawn_frontend(self, slot: Slot) -> None:
        await asyncio.sleep(slot.backoff)
        if not self._stop.is_set():
            slot.child = await self._spawn_frontend(slot.index)

    async def _scrape(self) -> bytes:
        """``/metrics`` with several executors (:mod:`.scrapes`)."""
        return await self._scrapes.collect(
            p.child for p in self._executors if p.child is not None and p.child.up
        )

    # -- shutdown ---------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Front ends first (they finish their requests, the executor still answering them),
        then the executor (it drains its queues and unloads)."""
        timeout = self.settings.exit_timeout_secs + KILL_GRACE
        await stop([s.child for s in self._slots if s.child is not None], timeout)
        await stop([s.child for s in self._executors if s.child is not None], timeout)
        self._wiring.close()
        for task in list(self._pending):
            task.cancel()


__all__ = ["Supervisor"]
