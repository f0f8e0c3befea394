"""The supervisor: runs N front-end processes and one executor, and keeps them connected.

It binds the HTTP sockets once (every front end accepts on them, so a front end that dies loses
no queued connection), starts the executor and the front ends, and gives each front end a
fresh :class:`~infermux.ipc.Channel` to the executor whenever both ends are up. It restarts
whatever dies: a dead front end costs only its own requests in flight; while the executor is
down, front ends stay up and answer 503 (not ready) until the new one has loaded its models.
A process that keeps dying is restarted with growing delays (up to 10 s), never given up on,
except at start-up, where a failure is the server's failure (bad repository, busy port).
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import platform
import shutil
import socket
import tempfile
import time
from collections.abc import Coroutine
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess
from pathlib import Path
from typing import Any, Literal

from infermux import __version__
from infermux.errors import StartupError
from infermux.frontends import unix_socket
from infermux.frontends.metrics import metrics_socket
from infermux.frontends.serving import http_endpoints, http_sockets
from infermux.ipc import Channel
from infermux.ipc.ring import ORDERED_STORES
from infermux.settings import (
    DISABLED_PORT,
    IPC_RING_BYTES,
    ServerSettings,
    channel_bytes,
    shared_memory_free,
)

from . import executor, frontend
from .control import Attach, Control, Detach, Failed, Message, Ready, Started, Stop

logger = logging.getLogger("infermux")

_MAX_BACKOFF = 10.0
_STABLE_SECONDS = 10.0  # a process up this long resets its restart delay
_KILL_GRACE = 5.0


@dataclass(eq=False)
class _Child:
    role: Literal["executor", "frontend"]
    index: int
    process: BaseProcess
    control: Control
    started_at: float = field(default_factory=time.monotonic)
    up: bool = False  # Started (front end) / Ready (executor) received
    stopping: bool = False

    @property
    def name(self) -> str:
        return "executor" if self.role == "executor" else f"frontend-{self.index}"


@dataclass(eq=False)
class _Slot:
    """A front-end position: the process now filling it, its channel, its restart delay."""

    index: int
    child: _Child | None = None
    channel: Channel | None = None
    backoff: float = 0.0


class Supervisor:
    """Runs the server as processes. ``run`` serves until :meth:`request_shutdown`."""

    def __init__(self, settings: ServerSettings) -> None:
        self.settings = settings
        self._context = multiprocessing.get_context("spawn")
        self._stop = asyncio.Event()
        self._events: asyncio.Queue[tuple[_Child, Message | None]] = asyncio.Queue()
        self._slots = [_Slot(i) for i in range(settings.frontends)]
        self._executor: _Child | None = None
        self._executor_backoff = 0.0
        self._sockets: list[socket.socket] = []
        self._metrics_sock: socket.socket | None = None
        self._grpc_port = settings.grpc_port
        self._directory = Path(tempfile.mkdtemp(prefix="infermux-"))
        self._pending: set[asyncio.Task[None]] = set()
        self.endpoints: list[str] = []

    def request_shutdown(self) -> None:
        if not self._stop.is_set():
            logger.info("shutting down: finishing in-flight requests")
        self._stop.set()

    # -- running ----------------------------------------------------------------------------------

    async def run(self) -> None:
        if not ORDERED_STORES:
            raise StartupError(
                f"--frontends {self.settings.frontends}: several front-end processes need the "
                f"shared-memory ring, which needs x86-64 (this is {platform.machine()}); "
                "use --frontends 1"
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
            stopped = asyncio.ensure_future(self._stop.wait())
            while not self._stop.is_set():
                event = asyncio.ensure_future(self._events.get())
                await asyncio.wait({event, stopped}, return_when=asyncio.FIRST_COMPLETED)
                if event.done():
                    await self._handle(*event.result())
                else:
                    event.cancel()
        finally:
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
        self._executor = await self._spawn_executor()
        first = self._slots[0]
        first.child = await self._spawn_frontend(first.index)
        started = await self._expect(first.child, Started)
        assert isinstance(started, Started)
        if self._grpc_port != DISABLED_PORT and started.grpc_port is not None:
            self._grpc_port = started.grpc_port  # port 0: the others take the port it got
        for slot in self._slots[1:]:
            slot.child = await self._spawn_frontend(slot.index)
        for slot in self._slots[1:]:
            assert slot.child is not None
            await self._expect(slot.child, Started)
        ready = await self._expect(self._executor, Ready)
        assert isinstance(ready, Ready)
        self._connect_all()
        self._announce(ready.models)

    async def _expect(self, child: _Child, kind: type[Started] | type[Ready]) -> Started | Ready:
        """Wait for ``child``'s first message at start-up, which must be ``kind``; news of the
        other children is kept, in order, for later."""
        deferred: list[tuple[_Child, Message | None]] = []
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
        self.endpoints = http_endpoints(s.host, self._sockets)
        if s.allow_grpc and self._grpc_port != DISABLED_PORT:
            self.endpoints.append(f"gRPC on {s.host}:{self._grpc_port}")
        if s.allow_grpc and s.grpc_uds is not None:
            self.endpoints.append(f"gRPC on unix:{s.grpc_uds}")
        if self._metrics_sock is not None:
            host, port = self._metrics_sock.getsockname()[:2]
            self.endpoints.append(f"metrics on http://{host}:{port}/metrics")
        # The same line as the one-process server's, which scripts and tests wait for.
        logger.info(
            "infermux %s ready: %s (models: %s; %d front-end processes, executor pid %d)",
            __version__,
            ", ".join(self.endpoints),
            ", ".join(models) or "none",
            len(self._slots),
            self._executor.process.pid or 0 if self._executor else 0,
        )

    # -- processes --------------------------------------------------------------------------------

    async def _spawn_executor(self) -> _Child:
        ours, theirs = socket.socketpair()
        process = self._context.Process(
            target=executor.main,
            args=(self.settings, theirs, self._metrics_sock),
            name="infermux-executor",
        )
        return await self._launch("executor", 0, process, ours, theirs)

    async def _spawn_frontend(self, index: int) -> _Child:
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
    ) -> _Child:
        process.start()
        theirs.close()
        child = _Child(role, index, process, await Control.open(ours))
        self._watch(child)
        logger.debug("started %s (pid %s)", child.name, process.pid)
        return child

    def _watch(self, child: _Child) -> None:
        async def follow() -> None:
            while (message := await child.control.receive()) is not None:
                self._events.put_nowait((child, message))
            # The socket closed: the process is exiting; reap it off the loop.
            await asyncio.to_thread(child.process.join)
            self._events.put_nowait((child, None))

        self._background(follow())

    def _background(self, work: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(work)
        self._pending.add(task)
        task.add_done_callback(self._pending.discard)

    # -- events -----------------------------------------------------------------------------------

    async def _handle(self, child: _Child, message: Message | None) -> None:
        if child.stopping:
            return
        if message is None:
            await self._died(child)
        elif isinstance(message, Ready) and child is self._executor:
            child.up = True
            logger.info("executor ready again; reconnecting front ends")
            self._connect_all()
        elif isinstance(message, Started):
            child.up = True
            slot = self._slots[child.index]
            if slot.child is child:
                self._connect(slot)
        elif isinstance(message, Failed):
            logger.error("%s cannot start: %s", child.name, message.message)

    async def _died(self, child: _Child) -> None:
        code = child.process.exitcode
        if child.role == "executor":
            if child is not self._executor:
                return
            logger.error("executor exited (code %s); front ends answer 503 until it is back", code)
            for slot in self._slots:
                self._retire(slot, f"the executor exited (code {code}); it is restarting")
            self._executor_backoff = _next_backoff(self._executor_backoff, child)
            self._executor = None
            self._background(self._respawn_executor(self._executor_backoff))
            return
        slot = self._slots[child.index]
        if slot.child is not child:
            return
        logger.error("%s exited (code %s); restarting it", child.name, code)
        if slot.channel is not None and self._executor is not None:
            self._executor.control.send(Detach(slot.channel.spec.id, f"{child.name} exited"))
        self._retire(slot, "")
        slot.child = None
        slot.backoff = _next_backoff(slot.backoff, child)
        self._background(self._respawn_frontend(slot))

    async def _respawn_executor(self, delay: float) -> None:
        await asyncio.sleep(delay)
        if not self._stop.is_set():
            self._executor = await self._spawn_executor()

    async def _respawn_frontend(self, slot: _Slot) -> None:
        await asyncio.sleep(slot.backoff)
        if not self._stop.is_set():
            slot.child = await self._spawn_frontend(slot.index)

    # -- channels ---------------------------------------------------------------------------------

    def _connect_all(self) -> None:
        for slot in self._slots:
            self._connect(slot)

    def _connect(self, slot: _Slot) -> None:
        """Give ``slot``'s front end a fresh channel to the executor, if both are up."""
        ex, child = self._executor, slot.child
        if ex is None or not ex.up or child is None or not child.up or slot.channel is not None:
            return
        channel = Channel(
            self._directory,
            ring_bytes=IPC_RING_BYTES,
            arena_bytes=self.settings.ipc_arena_mb * 2**20,
        )
        slot.channel = channel
        ex.control.send(Attach(channel.spec))
        child.control.send(Attach(channel.spec))

    def _retire(self, slot: _Slot, reason: str) -> None:
        """Drop ``slot``'s channel; with a ``reason``, its front end is told (it lives on)."""
        if slot.channel is None:
            return
        if reason and slot.child is not None:
            slot.child.control.send(Detach(slot.channel.spec.id, reason))
        slot.channel.close()
        slot.channel = None

    # -- shutdown ---------------------------------------------------------------------------------

    async def _shutdown(self) -> None:
        """Front ends first (they finish their requests, the executor still answering them),
        then the executor (it drains its queues and unloads)."""
        fronts = [s.child for s in self._slots if s.child is not None]
        await self._stop_children(fronts)
        if self._executor is not None:
            await self._stop_children([self._executor])
        for slot in self._slots:
            self._retire(slot, "")
        for task in list(self._pending):
            task.cancel()

    async def _stop_children(self, children: list[_Child]) -> None:
        for child in children:
            child.stopping = True
            child.control.send(Stop())
        deadline = self.settings.exit_timeout_secs + _KILL_GRACE
        await asyncio.gather(*(self._reap(c, deadline) for c in children))

    async def _reap(self, child: _Child, timeout: float) -> None:
        await asyncio.to_thread(child.process.join, timeout)
        if child.process.is_alive():
            logger.warning("%s did not stop in %.0f s; killing it", child.name, timeout)
            child.process.kill()
            await asyncio.to_thread(child.process.join)
        child.control.close()


def check_shared_memory(settings: ServerSettings, free: int | None = None) -> None:
    """Refuse to start when /dev/shm cannot hold every channel. Shared memory is allocated as
    it is touched, so an undersized /dev/shm (Docker's default is 64 MiB) would not fail here
    but kill a process with SIGBUS under load; better a clear error now."""
    needed = settings.frontends * channel_bytes(settings.ipc_arena_mb)
    free = shared_memory_free() if free is None else free
    if free is not None and needed > free:
        raise StartupError(
            f"--frontends {settings.frontends} with --ipc-arena-mb {settings.ipc_arena_mb} needs "
            f"{needed / 2**20:,.0f} MiB of shared memory but /dev/shm has {free / 2**20:,.0f} "
            "MiB free; lower --ipc-arena-mb or --frontends, or enlarge /dev/shm (Docker: "
            "--shm-size)"
        )


def _next_backoff(current: float, child: _Child) -> float:
    if time.monotonic() - child.started_at > _STABLE_SECONDS:
        return 0.0
    return min(_MAX_BACKOFF, max(0.5, current * 2))


__all__ = ["Supervisor"]
