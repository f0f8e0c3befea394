"""One executor as a front-end process sees it: every V2 operation forwarded over one channel.

A front-end process decodes requests and encodes answers; the models live in the executor
process. This class is what its HTTP and gRPC front ends are given instead of a
:class:`~infermux.dataplane.plane.DataPlane`: an inference request's tensors are written once
into the channel's arena and only a small header crosses the ring; the executor's
:class:`~.channel_server.ChannelServer` runs the request on the real data plane and answers the
same way.

While no executor is attached (it is starting, or restarting after a crash) the front end stays
up: it is not ready, and inference answers UNAVAILABLE (HTTP 503) naming the reason; requests in
flight when the executor went away fail the same way. Nothing waits forever: a readiness probe
the executor does not answer within ``ready_timeout_s`` (it is stopped, or stalled) answers not
ready.

A request the client gives up on (its task here is cancelled: an HTTP disconnect, a gRPC
cancellation or deadline) is cancelled in the executor too, by a :class:`~infermux.ipc.wire.
Cancel` frame, so that it leaves the model's queue instead of running for nobody; its input
blocks stay allocated until the executor's answer says it no longer reads them.

A decoupled model's request is streamed (``streams.py``): its responses are yielded as their
:class:`~infermux.ipc.wire.Part` frames arrive, and a reader that stops early (closes the
iterator, or its task is cancelled) sends the same ``Cancel`` frame, which closes the request's
stream in the executor: the model sees it cancelled. Which models are decoupled is learnt from
the executor: ``infer_stream`` sends a request as any other (micro-batched, its shared memory
read here) until the executor refuses it as decoupled, then streams that model's requests (one
reloaded as not decoupled is still streamed: it answers with one final frame, as it should).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
from collections.abc import AsyncGenerator, Mapping
from dataclasses import dataclass, field
from typing import Any

from infermux.dataplane.operations import Operations
from infermux.dataplane.streams import decoupled_refusal
from infermux.errors import ErrorCode, InfermuxError, InternalError, UnavailableError
from infermux.ipc import Block, ChannelSpec, Endpoint
from infermux.ipc.wire import (
    Answer,
    Call,
    Cancel,
    Failure,
    Forget,
    Forgotten,
    Regroup,
    Result,
    WireTensor,
    encode,
    infer_frame,
    raise_failure,
    read_tensor,
    to_frontend,
)
from infermux.settings import DEFAULT_CHANNEL_POLL_US
from infermux.types import (
    InferRequest,
    InferResponse,
    ServerMetadata,
)

from .calls import FILE_BLOCKS, RESULT, forwarded, place_files
from .grouping import GROUP_LIMIT
from .link import Link
from .low_load import poll_for_answer
from .micro_batcher import MicroBatcher
from .probes import ReadinessProbes
from .regions import RegionCopies, in_shared_memory
from .releases import Releases
from .streams import STREAM_WINDOW, Streams, read_stream

logger = logging.getLogger(__name__)


@dataclass(slots=True)
class _Pending:
    future: asyncio.Future[Any]
    blocks: list[Block] = field(default_factory=list)  # input bytes the executor may still read


class RemoteExecutor:
    """Implements :class:`~infermux.dataplane.operations.Operations` by forwarding to one
    executor process (:class:`~.remote_plane.RemoteDataPlane` spreads a front end's work over
    several)."""

    def __init__(
        self,
        metadata: ServerMetadata,
        *,
        ready_timeout_s: float = 1.0,
        group_limit: int = GROUP_LIMIT,
        poll_seconds: float = DEFAULT_CHANNEL_POLL_US / 1e6,
    ) -> None:
        self._metadata = metadata
        self._poll_seconds = poll_seconds
        self._batches = MicroBatcher(self, group_limit)
        self._regions = RegionCopies(self.shm_status)  # system regions read here
        self._probes = ReadinessProbes(self.call, ready_timeout_s)
        self._link: Link | None = None
        self._pending: dict[int, _Pending] = {}
        self._streams = Streams()  # streamed requests not over
        self._decoupled: set[str] = set()  # models whose requests are streamed
        self._seq = itertools.count(1)
        self._releases = Releases()  # answer blocks read, handed back to the executor
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
        self._regions.clear()  # a new executor's registrations are told afresh
        try:
            endpoint = Endpoint(spec, "frontend")
        except OSError as exc:
            # Not raised: the caller is the loop that follows the supervisor, which must live on
            # to hear of the next channel (or to be told to stop).
            logger.error("cannot attach to executor channel %s: %s", spec.id, exc)
            self._why_detached = f"cannot attach to the executor's channel: {exc}"
            return
        self._link = Link(endpoint, self._on_frames)
        self._channel = spec.id
        logger.debug("attached to executor channel %s", spec.id)

    def detach(self, why: str) -> None:
        """Stop forwarding: requests in flight fail UNAVAILABLE with ``why``, as do new ones
        until the next :meth:`attach`."""
        self._why_detached = why
        link, self._link = self._link, None
        pending, self._pending = self._pending, {}
        streams, self._streams = self._streams, Streams()
        self._batches.fail_all(UnavailableError(why))
        for entry in pending.values():
            if not entry.future.done():
                entry.future.set_exception(UnavailableError(why))
        streams.fail_all(UnavailableError(why))
        if link is not None:
            link.close()

    @property
    def link(self) -> Link | None:
        return self._link

    def next_seq(self) -> int:
        return next(self._seq)

    def in_flight(self) -> int:
        """Requests and micro-batches sent and not answered yet."""
        return len(self._pending) + len(self._streams) + self._batches.sent

    def poll_if_alone(self, link: Link) -> None:
        """Just after a send, at the lowest load: poll for the answer (``low_load.py``)."""
        poll_for_answer(link, self.in_flight(), self._poll_seconds)

    def begin_shutdown(self) -> None:
        self._shutting_down = True

    def require(self) -> Link:
        if self._link is None:
            raise UnavailableError(f"not ready: {self._why_detached}")
        return self._link

    # -- frames from the executor -----------------------------------------------------------------

    def _on_frames(self, frames: list[bytes]) -> None:
        link = self._link
        if link is None:
            return
        self._batches.released()  # answers free places: micro-batches held for one may leave
        for frame in frames:
            message = to_frontend(frame)
            if isinstance(message, Forget):  # before any request of this iteration reads it
                self._regions.forget(message.name)
                link.send(encode(Forgotten(message.seq)))
                continue
            if message.seq in self._streams:
                self._streams.answered(link, message, self.free)
                continue
            if self._batches.answered(link, message):
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
                    self.free(link, [o.offset for o in message.outputs])
                continue
            if isinstance(message, Failure):
                entry.future.set_exception(raise_failure(message))
            elif isinstance(message, Regroup):  # only micro-batches are regrouped
                entry.future.set_exception(InternalError(f"unexpected regroup: {message.why}"))
            else:
                entry.future.set_result(message)

    def free(self, link: Link, offsets: list[int]) -> None:
        """The answer blocks at ``offsets`` were read: the executor may reuse them."""
        self._releases.free(link, offsets)

    # -- inference --------------------------------------------------------------------------------

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse]:
        if request.model_name not in self._decoupled:
            try:
                response = await self.infer(request)
            except InfermuxError as exc:
                # Refused before it ran (nothing to undo): the model is decoupled, stream it.
                if exc.code is not ErrorCode.UNSUPPORTED or exc.message != decoupled_refusal(
                    request.model_name
                ):
                    raise
                self._decoupled.add(request.model_name)
            else:
                yield response
                return
        # aclosing: a reader that leaves gives the request up now, not when the inner
        # generator is collected (the loop's finalizer hook would close it a turn later).
        async with contextlib.aclosing(await self._open_stream(request)) as responses:
            async for response in responses:
                yield response

    async def _open_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse]:
        """``request`` sent as a stream; its responses as the reader takes them (``streams.py``:
        credit back, and a reader that leaves early gives the request up in the executor)."""
        link = self.require()
        blocks: list[Block] = []
        inputs = await self._put_inputs(link, request, blocks)
        seq = next(self._seq)
        stream = self._streams.open(seq, blocks)
        link.send(encode(infer_frame(seq, request, inputs, window=STREAM_WINDOW)))
        return read_stream(link, seq, stream)

    async def infer(self, request: InferRequest) -> InferResponse:
        link = self.require()
        if in_shared_memory(request):
            resolved = self._regions.resolve(request)
            if resolved is not None:
                response = await self._infer(link, resolved.request)
                return self._regions.place(response, resolved.placements)
        return await self._infer(link, request)

    async def _infer(self, link: Link, request: InferRequest) -> InferResponse:
        key = self._batches.key(request)
        if key is not None:
            return await self._batches.infer(key, request)
        return await self.infer_one(link, request)

    async def _put_inputs(
        self, link: Link, request: InferRequest, blocks: list[Block]
    ) -> list[WireTensor]:
        """Write ``request``'s inputs into the arena (their blocks added to ``blocks``)."""
        inputs = []
        try:
            for tensor in request.inputs:
                block, wire = await link.put_tensor(tensor, f"input '{tensor.name}'")
                if block is not None:
                    blocks.append(block)
                inputs.append(wire)
        except BaseException:
            for block in blocks:
                link.release(block)
            raise
        if link.closed:  # detached while waiting for arena space
            raise UnavailableError(f"not ready: {self._why_detached}")
        return inputs

    async def infer_one(self, link: Link, request: InferRequest) -> InferResponse:
        entry = _Pending(asyncio.get_running_loop().create_future())
        inputs = await self._put_inputs(link, request, entry.blocks)
        seq = next(self._seq)
        self._pending[seq] = entry
        link.send(encode(infer_frame(seq, request, inputs)))
        self.poll_if_alone(link)
        try:
            answer: Answer = await entry.future
        except asyncio.CancelledError:
            self._abandon(link, seq, entry)
            raise
        try:
            outputs = [read_tensor(link.endpoint.peer_arena, o, copy=True) for o in answer.outputs]
        finally:
            self.free(link, [o.offset for o in answer.outputs])
        return InferResponse(answer.model, answer.version, outputs, answer.id, answer.parameters)

    def _abandon(self, link: Link, seq: int, entry: _Pending) -> None:
        """The client gave up on request ``seq``. Its entry stays pending: the executor's
        answer, whenever it comes, frees the input blocks (:meth:`_on_frames`)."""
        future = entry.future
        if future.cancelled():  # still waiting: the executor drops it from its queue
            if link is self._link:
                link.send(encode(Cancel(seq)))
        elif future.exception() is None:  # answered just before: nobody reads the outputs
            self.free(link, [o.offset for o in future.result().outputs])

    # -- every other operation --------------------------------------------------------------------

    async def call(self, method: str, *args: Any, **kwargs: Any) -> Any:
        """Call ``method`` in the executor; its rebuilt result."""
        return await self._call_naming(method, [], *args, **kwargs)

    async def _call_naming(
        self, method: str, blocks: list[Block], *args: Any, **kwargs: Any
    ) -> Any:
        """:meth:`call` whose arguments name arena ``blocks``, released once the executor
        answered (it no longer reads them)."""
        link = self.require()
        seq = next(self._seq)
        entry = _Pending(asyncio.get_running_loop().create_future(), blocks)
        self._pending[seq] = entry
        link.send(encode(Call(seq, method, list(args), kwargs)))
        result: Result = await entry.future
        convert = RESULT.get(method)
        return convert(result.value) if convert is not None else None

    def live(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    async def ready(self) -> bool:
        if self._link is None or self._shutting_down:
            return False
        return await self._probes.ask("ready")

    async def model_ready(self, name: str, version: str = "") -> bool:
        if self._link is None:
            return False
        return await self._probes.ask("model_ready", name, version)

    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        if not files:
            await self.call("load_model", name, config_override=config_override, files=files)
            return
        blocks, placed = await place_files(self.require(), files)
        await self._call_naming(
            "load_model", blocks, name, config_override=config_override, **{FILE_BLOCKS: placed}
        )

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        epoch = self._regions.epoch
        await self.call("shm_register", name, key, offset, byte_size)
        if epoch == self._regions.epoch:  # no unregistration crossed the answer
            self._regions.learn(name, key, offset, byte_size)

    # Plain forwarders, derived from the one Operations definition (typed as there: mypy checks
    # each caller against the operation's own signature).
    model_metadata = forwarded(Operations.model_metadata)
    model_config = forwarded(Operations.model_config)
    model_statistics = forwarded(Operations.model_statistics)
    repository_index = forwarded(Operations.repository_index)
    unload_model = forwarded(Operations.unload_model)
    traffic = forwarded(Operations.traffic)
    set_traffic = forwarded(Operations.set_traffic)
    promote = forwarded(Operations.promote)
    rollback = forwarded(Operations.rollback)
    shm_unregister = forwarded(Operations.shm_unregister)
    log_settings = forwarded(Operations.log_settings)
    trace_settings = forwarded(Operations.trace_settings)
    shm_status = forwarded(Operations.shm_status)
    cuda_shm_register = forwarded(Operations.cuda_shm_register)
    cuda_shm_unregister = forwarded(Operations.cuda_shm_unregister)
    cuda_shm_status = forwarded(Operations.cuda_shm_status)
