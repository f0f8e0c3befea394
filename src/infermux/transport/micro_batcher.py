"""The front end's micro-batches in flight: collected, written, answered (what travels together,
and how an answer is cut back, is :mod:`~infermux.transport.grouping`).

A :class:`MicroBatcher` belongs to one
:class:`~infermux.transport.executor_client.RemoteExecutor` and sends over its channel; the first
request of a micro-batch leads it (gathers the others, then writes them), every member awaits its
own future.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Protocol

from infermux.errors import UnavailableError
from infermux.ipc import Block
from infermux.ipc.wire import (
    Answer,
    Cancel,
    Failure,
    Infer,
    Regroup,
    ToFrontend,
    WireTensor,
    encode,
    raise_failure,
    read_tensor,
)
from infermux.types import InferRequest, InferResponse

from .grouping import (
    HOLD_SECONDS,
    HOLD_WHILE_IN_FLIGHT,
    UNGROUPED_SECONDS,
    GroupKey,
    Kind,
    Member,
    MicroBatch,
    group_key,
    stack_into,
    stacked_bytes,
)
from .link import Link

logger = logging.getLogger(__name__)


class Channel(Protocol):
    """What a micro-batcher uses of its executor's channel (a ``RemoteExecutor``)."""

    @property
    def link(self) -> Link | None: ...

    @property
    def why_detached(self) -> str: ...

    def require(self) -> Link: ...

    async def infer_one(self, link: Link, request: InferRequest) -> InferResponse: ...

    def next_seq(self) -> int: ...

    def in_flight(self) -> int: ...

    def poll_if_alone(self, link: Link) -> None: ...

    def free(self, link: Link, offsets: list[int]) -> None: ...


class MicroBatcher:
    """Micro-batches to one executor: ``limit`` requests each at most (0 or 1: none)."""

    def __init__(self, channel: Channel, limit: int) -> None:
        self._channel = channel
        self._group_limit = limit
        self._open: dict[GroupKey, MicroBatch] = {}  # collecting in this loop iteration
        self._sent: dict[int, MicroBatch] = {}  # by seq, until the executor answers
        self._ungrouped: dict[tuple[str, Kind], float] = {}  # (model, kind) -> until: alone
        self._tasks: set[asyncio.Task[None]] = set()  # micro-batches being written
        self._wake: dict[GroupKey, asyncio.Future[None]] = {}  # leaders holding their batch

    @property
    def sent(self) -> int:
        """Micro-batches sent and not answered yet."""
        return len(self._sent)

    def key(self, request: InferRequest) -> GroupKey | None:
        """The micro-batch ``request`` may join (None: it goes alone)."""
        if self._group_limit < 2:
            return None
        key = group_key(request)
        if key is None or self._alone((request.model_name, key[0])):
            return None
        return key

    def fail_all(self, error: Exception) -> None:
        """The channel went away: every member of a micro-batch sent on it fails (and holding
        batches leave, to fail as the channel is gone)."""
        self.released()
        sent, self._sent = self._sent, {}
        for batch in sent.values():
            for member in batch.members:
                member.fail(error)

    def _alone(self, what: tuple[str, Kind]) -> bool:
        until = self._ungrouped.get(what)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._ungrouped[what]
        return False

    async def infer(self, key: GroupKey, request: InferRequest) -> InferResponse:
        """``request``'s answer, travelling in a micro-batch of ``key``."""
        loop = asyncio.get_running_loop()
        member = Member(request, loop.create_future())
        batch = self._open.get(key)
        if batch is not None and len(batch.members) < self._group_limit:
            batch.members.append(member)
            if len(batch.members) >= self._group_limit:
                self._release_leader(key)  # full: it need not wait any longer
            return await self._answer_of(batch, member)
        # The first request of a micro-batch leads it: it waits while others join, then sends.
        batch = self._open[key] = MicroBatch(key[0])
        batch.members.append(member)
        try:
            await self._gather(key, batch)
        except asyncio.CancelledError:
            member.future.cancel()
            self._close_batch(key, batch)
            self._send_live(batch)  # those who joined still go
            raise
        self._close_batch(key, batch)
        if len(batch.live()) == 1 and not batch.lone_as_batch:  # alone: sent as it always was
            return await self._channel.infer_one(self._channel.require(), request)
        self._send_live(batch)
        return await self._answer_of(batch, member)

    async def _gather(self, key: GroupKey, batch: MicroBatch) -> None:
        """Let the requests of this loop iteration join ``batch``; while the executor holds
        enough of this front end's work (:data:`~.grouping.HOLD_WHILE_IN_FLIGHT`), until an
        answer frees a place, the batch is full, or :data:`~.grouping.HOLD_SECONDS` passed.
        gRPC hands each call to the loop in an iteration of its own, so one iteration rarely
        finds a second request: under load, micro-batches grow with the time the executor
        takes, as batches do in its own queue."""
        await asyncio.sleep(0)  # one loop iteration
        if (
            len(batch.members) >= self._group_limit
            or self._channel.in_flight() < HOLD_WHILE_IN_FLIGHT
        ):
            return
        wake = self._wake[key] = asyncio.get_running_loop().create_future()
        try:
            await asyncio.wait_for(wake, HOLD_SECONDS)
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
            pass
        finally:
            if self._wake.get(key) is wake:
                del self._wake[key]

    def _release_leader(self, key: GroupKey) -> None:
        wake = self._wake.pop(key, None)
        if wake is not None and not wake.done():
            wake.set_result(None)

    def released(self) -> None:
        """An answer came from the executor (a place is free): every holding batch leaves."""
        for key in list(self._wake):
            self._release_leader(key)

    def _close_batch(self, key: GroupKey, batch: MicroBatch) -> None:
        if self._open.get(key) is batch:
            del self._open[key]

    def _send_live(self, batch: MicroBatch) -> None:
        live = batch.live()
        if len(live) == 1 and not batch.lone_as_batch:
            self._alone_after_all(live[0])
        elif live:
            batch.members = live
            self._keep(asyncio.ensure_future(self._send_batch(batch)))

    async def _answer_of(self, batch: MicroBatch, member: Member) -> InferResponse:
        try:
            return await member.future
        except asyncio.CancelledError:
            if member.task is not None:
                member.task.cancel()
            link = self._channel.link
            if batch.seq and not batch.cancel_sent and batch.abandoned() and link is not None:
                batch.cancel_sent = True  # nobody waits: let it leave the model's queue
                link.send(encode(Cancel(batch.seq)))
            raise

    def _keep(self, task: asyncio.Task[None]) -> None:
        """Hold a reference to ``task`` until it ends (the loop keeps only weak ones)."""
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _alone_after_all(self, member: Member) -> None:
        """Send ``member`` on its own, its caller still awaiting its future."""

        async def forward() -> None:
            try:
                response = await self._channel.infer_one(self._channel.require(), member.request)
            except Exception as exc:
                member.fail(exc)
                return
            if not member.future.done():
                member.future.set_result(response)

        member.task = asyncio.ensure_future(forward())
        self._keep(member.task)

    async def _send_batch(self, batch: MicroBatch) -> None:
        members = batch.members
        first = members[0].request
        try:
            link = self._channel.require()
            arena = link.endpoint.arena
            rows = [m.rows for m in members]
            inputs = []
            if batch.inputs_apart:  # shared-memory references: the executor reads them
                inputs = [
                    WireTensor(t.name, t.datatype, t.shape, t.parameters)
                    for m in members
                    for t in m.request.inputs
                ]
            for index, tensor in enumerate(() if batch.inputs_apart else first.inputs):
                parts = [m.request.inputs[index] for m in members]
                size = sum(stacked_bytes(t) for t in parts)
                block = await link.allocate(size, f"input '{tensor.name}'")
                batch.blocks.append(block)
                view = arena.buffer(block.offset, block.size)
                try:
                    stack_into(view, parts)
                finally:
                    view.release()
                shape = (sum(rows), *tensor.shape[1:])
                inputs.append(
                    WireTensor(
                        tensor.name, tensor.datatype, shape, tensor.parameters, block.offset, size
                    )
                )
            if link.closed:  # detached while waiting for arena space
                raise UnavailableError(f"not ready: {self._channel.why_detached}")
        except BaseException as exc:
            for block in batch.blocks:
                self._release(block)
            for member in members:
                member.fail(exc if isinstance(exc, Exception) else UnavailableError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        batch.seq = seq = self._channel.next_seq()
        self._sent[seq] = batch
        wanted = [m.request for m in members] if batch.outputs_apart else [first]
        outputs = [(o.name, o.parameters) for r in wanted for o in r.outputs]
        link.send(
            encode(
                Infer(
                    seq,
                    first.model_name,
                    first.model_version,
                    "",
                    first.parameters,  # alike in every member (the group's key)
                    inputs,
                    outputs,
                    rows=rows,
                    inputs_apart=batch.inputs_apart,
                    outputs_apart=batch.outputs_apart,
                )
            )
        )
        self._channel.poll_if_alone(link)
        if batch.abandoned() and not batch.cancel_sent:  # every caller left while it was written
            batch.cancel_sent = True
            link.send(encode(Cancel(seq)))

    def _release(self, block: Block) -> None:
        link = self._channel.link
        if link is not None:
            link.release(block)

    def answered(self, link: Link, message: ToFrontend) -> bool:
        """Take the executor's answer to a micro-batch (False: ``message`` is not one)."""
        batch = self._sent.pop(message.seq, None)
        if batch is None:
            return False
        self._answer(link, batch, message)
        return True

    def _answer(self, link: Link, batch: MicroBatch, message: ToFrontend) -> None:
        for block in batch.blocks:  # the executor no longer reads the inputs
            link.release(block)
        batch.blocks.clear()
        if isinstance(message, Regroup):
            if message.lasting:
                logger.info("not grouping requests for a while: %s", message.why)
                model = batch.members[0].request.model_name
                self._ungrouped[(model, batch.kind)] = time.monotonic() + UNGROUPED_SECONDS
            else:  # one request's fault: it fails alone, and the next micro-batch may go
                logger.debug("a micro-batch goes one by one: %s", message.why)
            for member in batch.live():
                self._alone_after_all(member)
        elif isinstance(message, Failure):
            error = raise_failure(message)
            for member in batch.members:
                member.fail(error)
        elif isinstance(message, Answer):
            try:
                outputs = [
                    read_tensor(link.endpoint.peer_arena, o, copy=True) for o in message.outputs
                ]
            finally:
                self._channel.free(link, [o.offset for o in message.outputs])
            batch.answer(message.model, message.version, outputs, message.parameters)
