"""Messages between the supervisor and the processes it runs, over one socket per child.

Rare and small (a channel to attach, a process that is ready), so they take the simplest path:
length-prefixed msgpack over a socketpair, read with asyncio streams. The hot path never
touches this socket; it uses the shared-memory channels these messages hand out.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import struct
from collections.abc import Callable
from typing import Any

import msgspec

from infermux.errors import InfermuxError
from infermux.ipc import ChannelSpec
from infermux.observability.logs import update_log_settings

from .desired import Desired

_LENGTH = struct.Struct("<I")


class Attach(msgspec.Struct, tag=True):
    """Supervisor -> child: serve (executor) or use (front end) this channel; ``executor``:
    which executor is at the other end (front ends with ``--executors N``)."""

    spec: ChannelSpec
    executor: int = 0


class Detach(msgspec.Struct, tag=True):
    """Supervisor -> child: the other end of ``channel`` is gone (``reason`` says why)."""

    channel: str
    reason: str


class Stop(msgspec.Struct, tag=True):
    """Supervisor -> child: shut down gracefully."""


class Started(msgspec.Struct, tag=True):
    """Front end -> supervisor: listening (``grpc_port`` is the TCP port gRPC got, if any)."""

    grpc_port: int | None


class Ready(msgspec.Struct, tag=True):
    """Executor -> supervisor: models loaded (``models``: ``name:version`` of each ready one),
    channels can be attached."""

    models: list[str]


class Failed(msgspec.Struct, tag=True):
    """Child -> supervisor: it cannot start, and exits; ``message`` says why."""

    message: str


class Scrape(msgspec.Struct, tag=True):
    """Supervisor -> executor (with several executors): send your metric families."""

    seq: int


class Scraped(msgspec.Struct, tag=True):
    """Executor -> supervisor: the families of :class:`Scrape` ``seq``, as
    :data:`~infermux.observability.metrics.FamilyData`."""

    seq: int
    families: list[tuple[str, str, str, list[tuple[str, dict[str, str], float]]]]


class Changed(msgspec.Struct, tag=True):
    """Executor -> supervisor: a client's call of :data:`~.desired.CHANGES` (a load, an
    unload, a shared-memory registration) succeeded here; the supervisor keeps it for the
    executor's successors (:mod:`.desired` says why the executor is the one that reports)."""

    method: str
    args: list[Any]
    kwargs: dict[str, Any]


class Restore(msgspec.Struct, tag=True):
    """Supervisor -> executor, after its :class:`Ready`: what clients changed while it was
    starting (another executor served them); answered by :class:`Restored`."""

    desired: Desired


class Restored(msgspec.Struct, tag=True):
    """Executor -> supervisor: the last :class:`Restore` is in effect."""


class LogChanges(msgspec.Struct, tag=True):
    """Supervisor -> child: log settings a client changed (through any process), to apply here
    too; sent again to a child that (re)started after them."""

    changes: dict[str, Any]


class Ping(msgspec.Struct, tag=True):
    """Supervisor -> child: are you there? (the heartbeat, :mod:`.heartbeat`)"""


class Pong(msgspec.Struct, tag=True):
    """Child -> supervisor: the answer to :class:`Ping`, sent from the child's event loop (a
    stopped or blocked process sends none)."""


Message = (
    Attach
    | Detach
    | Stop
    | Started
    | Ready
    | Failed
    | Scrape
    | Scraped
    | Changed
    | Restore
    | Restored
    | LogChanges
    | Ping
    | Pong
)
_decode = msgspec.msgpack.Decoder(Message).decode
_encode = msgspec.msgpack.Encoder().encode


class Control:
    """One end of a control socket."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader = reader
        self._writer = writer

    @classmethod
    async def open(cls, sock: socket.socket) -> Control:
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        return cls(reader, writer)

    def send(self, message: Message) -> None:
        """Queue ``message`` (a dead peer is noticed by the reader, not here)."""
        if self._writer.is_closing():
            return
        body = _encode(message)
        self._writer.write(_LENGTH.pack(len(body)) + body)

    async def receive(self) -> Message | None:
        """The next message, or None once the peer has gone."""
        try:
            size = _LENGTH.unpack(await self._reader.readexactly(_LENGTH.size))[0]
            return _decode(await self._reader.readexactly(size))
        except (asyncio.IncompleteReadError, ConnectionError):
            return None

    async def drain(self) -> None:
        with contextlib.suppress(ConnectionError):
            await self._writer.drain()

    def close(self) -> None:
        self._writer.close()


async def follow(
    control: Control,
    on_attach: Callable[[Attach], None],
    on_detach: Callable[[Detach], None],
    on_scrape: Callable[[Scrape], None] | None = None,
    on_restore: Callable[[Restore], None] | None = None,
    *,
    on_log: Callable[[dict[str, Any]], object] = update_log_settings,
) -> None:
    """Hand the supervisor's messages to a child's handlers (and answer its heartbeat); return
    on :class:`Stop` or once the supervisor is gone (either way the child shuts down)."""
    while (message := await control.receive()) is not None:
        if isinstance(message, Ping):
            control.send(Pong())
        elif isinstance(message, Attach):
            on_attach(message)
        elif isinstance(message, Detach):
            on_detach(message)
        elif isinstance(message, Scrape) and on_scrape is not None:
            on_scrape(message)
        elif isinstance(message, Restore) and on_restore is not None:
            on_restore(message)
        elif isinstance(message, LogChanges):
            with contextlib.suppress(InfermuxError):  # checked before: cannot fail here
                on_log(message.changes)
        elif isinstance(message, Stop):
            return
