"""One executor as a front-end process sees it: every V2 operation forwarded over one channel.

A front-end process decodes requests and encodes answers; the models live in the executor
process. This class is what its HTTP and gRPC front ends are given instead of a
:class:`~.plane.DataPlane`: an inference request's tensors are written once into the channel's
arena and only a small header crosses the ring; the executor's :class:`~.channel_server.
ChannelServer` runs the request on the real data plane and answers the same way.

While no executor is attached (it is starting, or restarting after a crash) the front end stays
up: it is not ready, and inference answers UNAVAILABLE (HTTP 503) naming the reason; requests in
flight when the executor went away fail the same way. Nothing waits forever: a readiness probe
the executor does not answer within ``ready_timeout_s`` (it is stopped, or stalled) answers not
ready.

A request the client gives up on (its task here is cancelled: an HTTP disconnect, a gRPC
cancellation or deadline) is cancelled in the executor too, by a :class:`~infermux.ipc.wire.
Cancel` frame, so that it leaves the model's queue instead of running for nobody; its input
blocks stay allocated until the executor's answer says it no longer reads them.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from collections.abc import Callable, Hashable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from tritonclient.grpc import model_config_pb2 as config_pb

from infermux.errors import InternalError, UnavailableError
from infermux.ipc import Block, ChannelSpec, Endpoint
from infermux.ipc.wire import (
    NO_DATA,
    Answer,
    Call,
    Cancel,
    Failure,
    Infer,
    Regroup,
    Release,
    Result,
    WireTensor,
    encode,
    raise_failure,
    read_tensor,
    to_frontend,
)
from infermux.model_config import ModelConfig
from infermux.routing import TrafficReport
from infermux.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
)

from .grouping import (
    GATHER_BUSY,
    GATHER_ROUNDS,
    GROUP_LIMIT,
    UNGROUPED_SECONDS,
    Member,
    MicroBatch,
    apart,
    group_key,
    stack_into,
    stacked_bytes,
)
from .link import Link

logger = logging.getLogger(__name__)


def _as(kind: Any) -> Callable[[Any], Any]:
    return lambda value: msgspec.convert(value, type=kind)


def _config(value: Any) -> ModelConfig:
    return ModelConfig.from_proto(config_pb.ModelConfig.FromString(value))


# How each call's result is rebuilt from msgpack builtins (the executor encodes the dataclasses
# as maps and a model config as its protobuf bytes).
_RESULT: dict[str, Callable[[Any], Any]] = {
    "traffic": _as(TrafficReport),
    "ready": bool,
    "model_ready": bool,
    "model_metadata": _as(ModelMetadata),
    "model_config": _config,
    "model_statistics": _as(list[ModelStats]),
    "repository_index": _as(list[RepositoryIndexEntry]),
    "shm_status": _as(list[SharedMemoryRegion]),
    "cuda_shm_status": _as(list[CudaSharedMemoryRegion]),
}


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Any]
    blocks: list[Block] = field(default_factory=list)  # input bytes the executor may still read


class RemoteExecutor:
    """Implements :class:`~.operations.Operations` by forwarding to one executor process
    (:class:`~.executors.RemoteDataPlane` spreads a front end's work over several)."""

    def __init__(
        self,
        metadata: ServerMetadata,
        *,
        ready_timeout_s: float = 1.0,
        group_limit: int = GROUP_LIMIT,
    ) -> None:
        self._metadata = metadata
        self._ready_timeout_s = ready_timeout_s
        self._group_limit = group_limit  # requests per micro-batch; 0: every request alone
        self._open: dict[Hashable, MicroBatch] = {}  # collecting in this loop iteration
        self._sent: dict[int, MicroBatch] = {}  # by seq, until the executor answers
        self._ungrouped: dict[Hashable, float] = {}  # (model, kind) -> until: not grouped
        self._tasks: set[asyncio.Task[None]] = set()  # micro-batches being written
        self._probes: dict[tuple[str, ...], asyncio.Future[Any]] = {}  # readiness calls in flight
        self._link: Link | None = None
        self._pending: dict[int, _Pending] = {}
        self._seq = itertools.count(1)
        self._released: list[int] = []  # answer blocks read, to hand back in one Release frame
        self._why_detached = "the executor is starting"
        self._shutting_down = False
        self._channel = ""

    @property
    def channel(self) -> str:
        """The id of the channel in use ("" while detached)."""
        return self._channel if self._link is not None else ""

    @property
    def why_detached(self) -> str:
        return self._why_detached

    # -- channel ----------------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return self._link is not None

    def attach(self, spec: ChannelSpec) -> None:
        """Start forwarding over the channel ``spec`` (replacing any previous one)."""
        self.detach("the executor was replaced")
        self._link = Link(Endpoint(spec, "frontend"), self._on_frames)
        self._channel = spec.id
        logger.debug("attached to executor channel %s", spec.id)

    def detach(self, why: str) -> None:
        """Stop forwarding: requests in flight fail UNAVAILABLE with ``why``, as do new ones
        until the next :meth:`attach`."""
        self._why_detached = why
        link, self._link = self._link, None
        pending, self._pending = self._pending, {}
        sent, self._sent = self._sent, {}
        self._released.clear()
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(UnavailableError(why))
        for batch in sent.values():
            for member in batch.members:
                member.fail(UnavailableError(why))
        if link is not None:
            link.close()

    def begin_shutdown(self) -> None:
        self._shutting_down = True

    def _require(self) -> Link:
        if self._link is None:
            raise UnavailableError(f"not ready: {self._why_detached}")
        return self._link

    # -- frames from the executor -----------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        link = self._link
        if link is None:
            return
        for frame in frames:
            message = to_frontend(frame)
            batch = self._sent.pop(message.seq, None)
            if batch is not None:
                self._batch_answered(link, batch, message)
                continue
            entry = self._pending.pop(message.seq, None)
            if entry is None:
                logger.warning("the executor answered unknown request %d", message.seq)
                continue
            # The executor is done with the request's inputs once it answers.
            for block in entry.blocks:
                link.release(block)
            if entry.future.done():  # the client gave up; its answer's blocks are free now
                if isinstance(message, Answer):
                    self._free(link, [o.offset for o in message.outputs])
                continue
            if isinstance(message, Failure):
                entry.future.set_exception(raise_failure(message))
            elif isinstance(message, Regroup):  # only micro-batches are regrouped
                entry.future.set_exception(InternalError(f"unexpected regroup: {message.why}"))
            else:
                entry.future.set_result(message)

    def _free(self, link: Link, offsets: list[int]) -> None:
        taken = [o for o in offsets if o != NO_DATA]
        if not taken:
            return
        if not self._released:
            asyncio.get_running_loop().call_soon(self._send_released, link)
        self._released.extend(taken)

    def _send_released(self, link: Link) -> None:
        if self._released and link is self._link:
            link.send(encode(Release(self._released)), wake=False)
        self._released = []

    # -- inference --------------------------------------------------------------------------------

    async def infer(self, request: InferRequest) -> InferResponse:
        link = self._require()
        if self._group_limit > 1:
            key = group_key(request)
            if key is not None and not self._alone((request.model_name, key[0])):
                return await self._grouped(key, request)
        return await self._infer_one(link, request)

    async def _infer_one(self, link: Link, request: InferRequest) -> InferResponse:
        entry = _Pending(asyncio.get_running_loop().create_future())
        inputs = []
        try:
            for tensor in request.inputs:
                block, wire = await link.put_tensor(tensor, f"input '{tensor.name}'")
                if block is not None:
                    entry.blocks.append(block)
                inputs.append(wire)
        except BaseException:
            for block in entry.blocks:
                link.release(block)
            raise
        if link.closed:  # detached while waiting for arena space
            raise UnavailableError(f"not ready: {self._why_detached}")
        seq = next(self._seq)
        self._pending[seq] = entry
        link.send(
            encode(
                Infer(
                    seq,
                    request.model_name,
                    request.model_version,
                    request.id,
                    request.parameters,
                    inputs,
                    [(o.name, o.parameters) for o in request.outputs],
                    request.trace_context,
                    request.deadline_ns,
                )
            )
        )
        try:
            answer: Answer = await entry.future
        except asyncio.CancelledError:
            self._abandon(link, seq, entry)
            raise
        try:
            outputs = [read_tensor(link.endpoint.peer_arena, o, copy=True) for o in answer.outputs]
        finally:
            self._free(link, [o.offset for o in answer.outputs])
        return InferResponse(answer.model, answer.version, outputs, answer.id, answer.parameters)

    # -- micro-batches (dataplane/grouping.py) ----------------------------------------------------

    def _alone(self, what: Hashable) -> bool:
        until = self._ungrouped.get(what)
        if until is None:
            return False
        if time.monotonic() < until:
            return True
        del self._ungrouped[what]
        return False

    async def _grouped(self, key: tuple[Hashable, ...], request: InferRequest) -> InferResponse:
        loop = asyncio.get_running_loop()
        member = Member(request, loop.create_future())
        batch = self._open.get(key)
        if batch is not None and len(batch.members) < self._group_limit:
            batch.members.append(member)
            return await self._answer_of(batch, member)
        # The first request of a micro-batch leads it: it waits while others join, then sends.
        batch = self._open[key] = MicroBatch(*apart(key))
        batch.members.append(member)
        try:
            await self._gather(batch)
        except asyncio.CancelledError:
            member.future.cancel()
            self._close_batch(key, batch)
            self._send_live(batch)  # those who joined still go
            raise
        self._close_batch(key, batch)
        if len(batch.live()) == 1:  # alone after all: sent as it always was
            return await self._infer_one(self._require(), request)
        self._send_live(batch)
        return await self._answer_of(batch, member)

    async def _gather(self, batch: MicroBatch) -> None:
        """Let the requests of this loop iteration join ``batch``; under load (requests in
        flight to the executor), a few iterations more while it keeps growing. gRPC hands each
        call to the loop in an iteration of its own, so one iteration would rarely find a
        second request; while the executor is busy anyway the wait costs nothing it would not."""
        busy = len(self._pending) + len(self._sent) >= GATHER_BUSY
        for round_ in range(GATHER_ROUNDS if busy else 1):
            size = len(batch.members)
            await asyncio.sleep(0)  # one loop iteration
            if len(batch.members) >= self._group_limit or (round_ and len(batch.members) == size):
                return

    def _close_batch(self, key: Hashable, batch: MicroBatch) -> None:
        if self._open.get(key) is batch:
            del self._open[key]

    def _send_live(self, batch: MicroBatch) -> None:
        live = batch.live()
        if len(live) == 1:
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
            link = self._link
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
                response = await self._infer_one(self._require(), member.request)
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
            link = self._require()
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
                raise UnavailableError(f"not ready: {self._why_detached}")
        except BaseException as exc:
            for block in batch.blocks:
                self._link_release(block)
            for member in members:
                member.fail(exc if isinstance(exc, Exception) else UnavailableError(str(exc)))
            if not isinstance(exc, Exception):
                raise
            return
        batch.seq = seq = next(self._seq)
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
        if batch.abandoned() and not batch.cancel_sent:  # every caller left while it was written
            batch.cancel_sent = True
            link.send(encode(Cancel(seq)))

    def _link_release(self, block: Block) -> None:
        if self._link is not None:
            self._link.release(block)

    def _batch_answered(self, link: Link, batch: MicroBatch, message: Any) -> None:
        for block in batch.blocks:  # the executor no longer reads the inputs
            link.release(block)
        batch.blocks.clear()
        if isinstance(message, Regroup):
            logger.info("not grouping requests for a while: %s", message.why)
            request = batch.members[0].request
            kind = (
                "shm" if batch.inputs_apart else "bytes",
                "shm" if batch.outputs_apart else "bytes",
            )
            self._ungrouped[(request.model_name, kind)] = time.monotonic() + UNGROUPED_SECONDS
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
                self._free(link, [o.offset for o in message.outputs])
            batch.answer(message.model, message.version, outputs, message.parameters)

    def _abandon(self, link: Link, seq: int, entry: _Pending) -> None:
        """The client gave up on request ``seq``. Its entry stays pending: the executor's
        answer, whenever it comes, frees the input blocks (:meth:`_on_frames`)."""
        future = entry.future
        if future.cancelled():  # still waiting: the executor drops it from its queue
            if link is self._link:
                link.send(encode(Cancel(seq)))
        elif future.exception() is None:  # answered just before: nobody reads the outputs
            self._free(link, [o.offset for o in future.result().outputs])

    # -- every other operation --------------------------------------------------------------------

    async def _call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        link = self._require()
        seq = next(self._seq)
        entry = _Pending(asyncio.get_running_loop().create_future())
        self._pending[seq] = entry
        link.send(encode(Call(seq, method, list(args), kwargs)))
        result: Result = await entry.future
        convert = _RESULT.get(method)
        return convert(result.value) if convert is not None else None

    def live(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    async def ready(self) -> bool:
        if self._link is None or self._shutting_down:
            return False
        return await self._probe("ready")

    async def model_ready(self, name: str, version: str = "") -> bool:
        if self._link is None:
            return False
        return await self._probe("model_ready", name, version)

    async def _probe(self, method: str, *args: str) -> bool:
        """A readiness call answered within ``ready_timeout_s``, else not ready: a probe must
        answer while the executor is stopped (SIGSTOP) or stalled, for a load balancer to
        route around it. Probes of one kind share the call in flight, so a long stop queues
        one frame, not one per probe."""
        key = (method, *args)
        call = self._probes.get(key)
        if call is None or call.done():  # done: failed as its executor went (ask the new one)
            call = asyncio.ensure_future(self._call(method, *args))
            self._probes[key] = call
            call.add_done_callback(lambda done: self._probe_done(key, done))
        try:
            return bool(await asyncio.wait_for(asyncio.shield(call), self._ready_timeout_s))
        except (TimeoutError, asyncio.TimeoutError):  # distinct classes on Python 3.10
            return False

    def _probe_done(self, key: tuple[str, ...], call: asyncio.Future[Any]) -> None:
        if self._probes.get(key) is call:
            del self._probes[key]
        if not call.cancelled():
            call.exception()  # retrieved: every waiter may have timed out before it failed

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        meta: ModelMetadata = await self._call("model_metadata", name, version)
        return meta

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        config: ModelConfig = await self._call("model_config", name, version)
        return config

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        stats: list[ModelStats] = await self._call("model_statistics", name, version)
        return stats

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        index: list[RepositoryIndexEntry] = await self._call(
            "repository_index", ready_only=ready_only
        )
        return index

    async def load_model(self, name: str, *, config_override: str | None = None) -> None:
        await self._call("load_model", name, config_override=config_override)

    async def unload_model(self, name: str) -> None:
        await self._call("unload_model", name)

    async def traffic(self, name: str) -> TrafficReport:
        report: TrafficReport = await self._call("traffic", name)
        return report

    async def set_traffic(self, name: str, policy: str | None) -> None:
        await self._call("set_traffic", name, policy)

    async def promote(self, name: str, version: int) -> None:
        await self._call("promote", name, version)

    async def rollback(self, name: str) -> None:
        await self._call("rollback", name)

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._call("shm_register", name, key, offset, byte_size)

    async def shm_unregister(self, name: str = "") -> None:
        await self._call("shm_unregister", name)

    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        regions: list[SharedMemoryRegion] = await self._call("shm_status", name)
        return regions

    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        await self._call("cuda_shm_register", name, raw_handle, device_id, byte_size)

    async def cuda_shm_unregister(self, name: str = "") -> None:
        await self._call("cuda_shm_unregister", name)

    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        regions: list[CudaSharedMemoryRegion] = await self._call("cuda_shm_status", name)
        return regions
