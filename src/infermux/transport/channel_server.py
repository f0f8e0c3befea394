"""The executor's side of the front-end channels: requests off the rings, into the data plane.

Every front-end process has its own channel. Frames are drained as their doorbell rings (on the
executor's event loop, beside the batcher) and each request runs as its own task on the one
:class:`~infermux.dataplane.plane.DataPlane`, so requests from every front end meet in the same
queues and batches. Input tensors are read in place from the front end's arena (a GPU instance
copies them to the device from there; other backends stack them, once); outputs are written once
into this side's arena.

When a front end goes away its channel is detached: its requests still running finish (they are
admitted; the model's state and statistics stay consistent) but their answers are dropped, and
the channel is unmapped when the last one is done. Its streams are given up (nobody reads them
any more, and a decoupled model may stream for as long as it likes).

A request the front end gives up on (a :class:`~infermux.ipc.wire.Cancel` frame) or whose
deadline passes has its task cancelled, as the in-process front ends cancel theirs: a queued
request leaves the queue and never runs; one already in a running batch cannot be interrupted,
so its cancellation completes when the batch ends (the scheduler's contract: only then are its
input views in the front end's arena unused) and its result is dropped. A request whose
deadline passed before it arrived is not started. Each is answered by a CANCELLED failure,
which tells the front end that its input blocks are free; output blocks already placed for an
answer never sent are released here.

A streamed request (a decoupled model's: ``Infer.window`` > 0) runs the data plane's
``infer_stream`` and sends each response as a :class:`~infermux.ipc.wire.Part` frame as it comes,
within the front end's credit (``streams.py``); giving it up closes that stream, as an
in-process front end does, so that the model sees its request cancelled.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import AsyncIterator, Callable, Coroutine
from typing import Any

from infermux.dataplane.micro_batches import Ungroupable
from infermux.dataplane.plane import DataPlane
from infermux.errors import InfermuxError, InternalError
from infermux.ipc import Block, ChannelSpec, Endpoint
from infermux.ipc.wire import (
    Answer,
    Call,
    Cancel,
    Credit,
    Forget,
    Forgotten,
    Infer,
    Regroup,
    Release,
    Result,
    WireTensor,
    cancelled,
    encode,
    failure,
    part,
    read_tensor,
    to_executor,
)
from infermux.model_config import ModelConfig
from infermux.runtime.host_memory import HOST_MEMORY
from infermux.settings import DEFAULT_CHANNEL_POLL_US
from infermux.types import InferRequest, RequestedOutput, Tensor

from . import streams
from .calls import CALLS, FILE_BLOCKS
from .link import Link
from .low_load import ExecutorLoad

logger = logging.getLogger(__name__)


FORGET_TIMEOUT_S = 5.0
"""How long an unregistration waits for each front end to drop its copy of the region: one that
does not answer in time is stalled (or gone) and reads nothing meanwhile."""

CallObserver = Callable[[str, list[Any], dict[str, Any]], None]
"""Told of each call (not inference) that succeeded: method, positional and keyword arguments."""


class _Client:
    """One attached front end: its link, its requests in flight, its answer blocks."""

    def __init__(self, link: Link) -> None:
        self.link = link
        self.tasks: set[asyncio.Task[None]] = set()
        self.inferring: dict[int, asyncio.Task[None]] = {}  # by seq, for Cancel frames
        self.credits: dict[int, streams.Credit] = {}  # streamed requests' room, by seq
        self.blocks: dict[int, Block] = {}  # answer blocks the front end has not released


class ChannelServer:
    """Serves every attached front-end channel from one :class:`DataPlane`."""

    def __init__(
        self,
        plane: DataPlane,
        on_call: CallObserver | None = None,
        *,
        poll_seconds: float = DEFAULT_CHANNEL_POLL_US / 1e6,
    ) -> None:
        self._plane = plane
        self._on_call = on_call
        self._clients: dict[str, _Client] = {}
        self._forgets = itertools.count(1)
        # Forget frames not answered yet, by seq: whose, and what the unregistration awaits.
        self._forgetting: dict[int, tuple[_Client, asyncio.Future[None]]] = {}
        self._load = ExecutorLoad(poll_seconds, lambda: (c.link for c in self._clients.values()))
        plane.on_shm_forgotten(self._forget)

    @property
    def channels(self) -> list[str]:
        return list(self._clients)

    def attach(self, spec: ChannelSpec) -> None:
        """Start serving the front end at the other end of ``spec``."""
        client: _Client | None = None

        def on_frames(frames: list[bytes]) -> None:
            assert client is not None
            self._dispatch(client, frames)

        client = _Client(Link(Endpoint(spec, "executor"), on_frames))
        self._clients[spec.id] = client
        # Requests' input rows lie in the front end's arena for as long as they run: a GPU
        # instance may copy them to the device from there (pinned on first use), unstaged.
        arena = client.link.endpoint.peer_arena
        HOST_MEMORY.offer(arena.address, arena.size, f"front-end channel {spec.id}'s arena")
        logger.debug("serving front-end channel %s", spec.id)

    async def detach(self, channel_id: str) -> None:
        """Stop serving a channel whose front end is gone; returns when its requests are done."""
        client = self._clients.pop(channel_id, None)
        if client is None:
            return
        client.link.mute()  # answers of what still runs are dropped
        for seq in list(client.credits):  # nobody reads its streams: give them up
            _give_up(client, seq)
        for seq, (whose, _) in list(self._forgetting.items()):
            if whose is client:  # gone: it reads no region any more
                _forgot(self._forgetting.pop(seq))
        if client.tasks:
            await asyncio.gather(*client.tasks, return_exceptions=True)
        HOST_MEMORY.withdraw(client.link.endpoint.peer_arena.address)  # no copy from it is left
        client.link.close()

    async def close(self) -> None:
        """Detach every channel (after their requests finish)."""
        await asyncio.gather(*(self.detach(c) for c in list(self._clients)))

    # -- frames -----------------------------------------------------------------------------------

    def _dispatch(self, client: _Client, frames: list[bytes]) -> None:
        for frame in frames:
            try:
                message = to_executor(frame)
            except Exception:  # our own peer wrote it: a bug, not bad client input
                logger.exception("undecodable frame on channel %s", client.link.id)
                continue
            if isinstance(message, Release):
                for offset in message.offsets:
                    block = client.blocks.pop(offset, None)
                    if block is not None:
                        client.link.release(block)
            elif isinstance(message, Credit):
                credit = client.credits.get(message.seq)
                if credit is not None:  # else the stream ended meanwhile
                    credit.grant(message.count)
            elif isinstance(message, Cancel):
                _give_up(client, message.seq)
            elif isinstance(message, Forgotten):
                _forgot(self._forgetting.pop(message.seq, None))
            elif isinstance(message, Infer):
                self._start_infer(client, message)
            else:
                self._track(client, self._call(client, message))

    async def _forget(self, name: str) -> None:
        """Every front end drops system region ``name`` ("": all) before its unregistration is
        answered, so that no front end reads or writes it after the client was told it is gone
        (front ends read regions themselves: ``transport/regions.py``)."""
        loop = asyncio.get_running_loop()
        waiting: dict[int, asyncio.Future[None]] = {}
        for client in self._clients.values():
            seq = next(self._forgets)
            waiting[seq] = loop.create_future()
            self._forgetting[seq] = (client, waiting[seq])
            client.link.send(encode(Forget(seq, name)))
        if not waiting:
            return
        _, late = await asyncio.wait(waiting.values(), timeout=FORGET_TIMEOUT_S)
        for seq in waiting:
            self._forgetting.pop(seq, None)
        if late:
            logger.warning(
                "%d front end(s) did not confirm within %.0f s that they dropped shared memory "
                "region '%s'",
                len(late),
                FORGET_TIMEOUT_S,
                name or "(all)",
            )

    def _track(self, client: _Client, work: Coroutine[Any, Any, None]) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(work)
        client.tasks.add(task)
        task.add_done_callback(client.tasks.discard)
        return task

    def _start_infer(self, client: _Client, message: Infer) -> None:
        seq = message.seq
        loop = asyncio.get_running_loop()
        timer: asyncio.TimerHandle | None = None
        if message.deadline_ns:
            left_s = (message.deadline_ns - time.monotonic_ns()) / 1e9
            if left_s <= 0:
                # It waited in the ring past its deadline (a stalled executor): nobody awaits it.
                client.link.send(encode(cancelled(seq, "the request's deadline passed")))
                return
            timer = loop.call_later(left_s, _give_up, client, seq)
        if message.window:
            credit = client.credits[seq] = streams.Credit(message.window)
            task = loop.create_task(self._stream(client, message, credit))
        else:
            task = loop.create_task(self._infer(client, message))
        client.tasks.add(task)
        client.inferring[seq] = task
        requests = len(message.rows) or 1
        self._load.started(requests)

        # One callback per request does all the bookkeeping: this is the executor's hot path.
        def finished(_: object) -> None:
            client.tasks.discard(task)
            client.inferring.pop(seq, None)
            if message.window:
                client.credits.pop(seq, None)
            if timer is not None:
                timer.cancel()
            if task.cancelled():  # also cancelled before it started: _infer never ran
                client.link.send(encode(cancelled(seq, "the client gave up on the request")))
            self._load.finished(client.link, requests)

        task.add_done_callback(finished)

    async def _infer(self, client: _Client, message: Infer) -> None:
        link = client.link
        placed: list[Block] = []  # output blocks of an answer not sent yet
        try:
            request = _request(link, message, copy=False)
            if message.rows:  # a micro-batch (transport/grouping.py)
                try:
                    response = await self._plane.infer_many(
                        request,
                        message.rows,
                        inputs_apart=message.inputs_apart,
                        outputs_apart=message.outputs_apart,
                    )
                except Ungroupable as exc:  # its requests come back one by one
                    link.send(encode(Regroup(message.seq, str(exc), exc.lasting)))
                    return
            else:
                response = await self._plane.infer(request)
            outputs = [await self._place(client, tensor, placed) for tensor in response.outputs]
        except asyncio.CancelledError:  # answered by _start_infer once the task is done
            self._unplace(client, placed)
            raise
        except Exception as exc:
            self._unplace(client, placed)
            if not isinstance(exc, InfermuxError):
                logger.exception("request %d on channel %s failed", message.seq, link.id)
            link.send(encode(failure(message.seq, exc)))
            return
        link.send(
            encode(
                Answer(
                    message.seq,
                    response.model_name,
                    response.model_version,
                    response.id,
                    response.parameters,
                    outputs,
                )
            )
        )

    async def _stream(self, client: _Client, message: Infer, credit: streams.Credit) -> None:
        """Run a streamed request: each response is sent as it comes, while credit lasts (no
        credit: the data plane's stream is not read, and its bound holds the model back)."""
        link, seq = client.link, message.seq
        placed: list[Block] = []
        try:
            # Copied out of the front end's arena: a decoupled model may keep its inputs for
            # as long as it streams, and the front end frees them at the first frame sent.
            responses = self._plane.infer_stream(_request(link, message, copy=True))
            try:
                while True:
                    await credit.spend()
                    response = await anext(responses, None)
                    if response is None:  # ended without a final flag: the stream's contract
                        raise InternalError("a response stream ended without its final response")
                    outputs = [await self._place(client, t, placed) for t in response.outputs]
                    link.send(encode(part(seq, response, outputs)))
                    placed.clear()  # the front end releases them now
                    if response.final:
                        return
            finally:
                await _close(responses)  # where it did not end: gives the request up
        except asyncio.CancelledError:  # answered by _start_infer once the task is done
            self._unplace(client, placed)
            raise
        except Exception as exc:
            self._unplace(client, placed)
            if not isinstance(exc, InfermuxError):
                logger.exception("stream %d on channel %s failed", seq, link.id)
            link.send(encode(failure(seq, exc)))

    async def _place(self, client: _Client, tensor: Tensor, placed: list[Block]) -> WireTensor:
        block, wire = await client.link.put_tensor(tensor, f"output '{tensor.name}'")
        if block is not None:
            client.blocks[block.offset] = block
            placed.append(block)
        return wire

    def _unplace(self, client: _Client, placed: list[Block]) -> None:
        """Release the output blocks of an answer that will not be sent (no Release comes)."""
        for block in placed:
            if client.blocks.pop(block.offset, None) is block:
                client.link.release(block)

    async def _call(self, client: _Client, message: Call) -> None:
        try:
            if message.method not in CALLS:
                raise InternalError(f"no data-plane operation '{message.method}'")
            if FILE_BLOCKS in message.kwargs:  # a load's files, in the front end's arena
                kwargs = dict(message.kwargs)
                arena = client.link.endpoint.peer_arena
                kwargs["files"] = {
                    path: bytes(arena.buffer(offset, size))
                    for path, (offset, size) in kwargs.pop(FILE_BLOCKS).items()
                }
                message = Call(message.seq, message.method, message.args, kwargs)
            value: Any = getattr(self._plane, message.method)(*message.args, **message.kwargs)
            value = await value
            if self._on_call is not None:
                self._on_call(message.method, message.args, message.kwargs)
            if isinstance(value, ModelConfig):
                value = value.proto.SerializeToString()
            reply = encode(Result(message.seq, value))
        except Exception as exc:
            if not isinstance(exc, InfermuxError):
                logger.exception("call %s on channel %s failed", message.method, client.link.id)
            reply = encode(failure(message.seq, exc))
        client.link.send(reply)


def _request(link: Link, message: Infer, *, copy: bool) -> InferRequest:
    """The request an :class:`Infer` frame carries; its inputs are views of the front end's
    arena unless ``copy``."""
    return InferRequest(
        message.model,
        message.version,
        [read_tensor(link.endpoint.peer_arena, t, copy=copy) for t in message.inputs],
        [RequestedOutput(name, parameters) for name, parameters in message.outputs],
        message.id,
        message.parameters,
        message.trace,
    )


async def _close(responses: AsyncIterator[Any]) -> None:
    aclose = getattr(responses, "aclose", None)  # an async generator's; the contract's close
    if aclose is not None:
        await aclose()


def _forgot(entry: tuple[_Client, asyncio.Future[None]] | None) -> None:
    if entry is not None and not entry[1].done():
        entry[1].set_result(None)


def _give_up(client: _Client, seq: int) -> None:
    """Cancel request ``seq``'s task, once (it leaves ``inferring``): a second cancellation (a
    Cancel frame after the deadline fired) would cut short its wait for a batch that still
    reads its inputs. Nothing to do when it was answered already (the answer crossed the
    Cancel frame) or never started (its deadline had passed)."""
    task = client.inferring.pop(seq, None)
    if task is not None:
        task.cancel()
