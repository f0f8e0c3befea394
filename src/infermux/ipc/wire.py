"""The frames a front-end process and the executor exchange, and how tensors cross in the arena.

Headers are msgpack (msgspec structs, encoded as arrays: no field names on the wire); a tensor's
bytes never travel in a header. The sender writes them once into an arena it allocates from and
the header names their place; the receiver reads them there. Requests put inputs in the front
end's arena, answers put outputs in the executor's, and a :class:`Release` frame hands an
answer's blocks back once the front end has copied them out.

Every :class:`Infer` is answered by exactly one :class:`Answer` or :class:`Failure`, also when
the front end gave up on it (a :class:`Cancel` frame) or its deadline passed: that answer is
what tells the front end the executor no longer reads the request's input blocks. A *streamed*
:class:`Infer` (``window`` > 0: a decoupled model's request) is answered by :class:`Part`
frames instead, one per response as the model sends it, the last one ``final`` ("more
responses follow" until then), or by a :class:`Failure` that ends it at any point; the front
end grants more room with :class:`Credit` frames as its reader takes them, so that a slow
reader holds the model back instead of filling the executor's memory.

Deadlines are ``time.monotonic_ns()`` instants: both ends share one host's monotonic clock (they
share its memory), and an instant, unlike a remaining time, stays right however long the frame
waited in the ring (an executor that was stopped).
"""

from __future__ import annotations

import contextlib
from typing import Any

import msgspec
import numpy as np

from infermux.errors import (
    ErrorCode,
    FailureReason,
    InfermuxError,
    InternalError,
    InvalidArgumentError,
)
from infermux.ipc.arena import Arena, Block
from infermux.tensor_bytes import tensor_from_bytes, tensor_to_bytes
from infermux.types import InferRequest, InferResponse, Parameters, Tensor, numpy_dtype

NO_DATA = -1
"""The offset of a tensor whose bytes are not in the arena (it lives in client shared memory)."""


class WireTensor(msgspec.Struct, array_like=True):
    """A tensor's description; its bytes are ``size`` bytes at ``offset`` of the sender's arena."""

    name: str
    datatype: str
    shape: tuple[int, ...]
    parameters: Parameters
    offset: int = NO_DATA
    size: int = 0


class Infer(msgspec.Struct, array_like=True, tag=1):
    """Front end -> executor: run an inference request."""

    seq: int
    model: str
    version: str
    id: str
    parameters: Parameters
    inputs: list[WireTensor]
    outputs: list[tuple[str, Parameters]]
    trace: dict[str, str] = {}  # W3C trace context headers, when the client sent them
    deadline_ns: int = 0
    """When the client stops waiting (``time.monotonic_ns()``; 0: never): the executor does not
    start the request after it and gives it up at it."""
    rows: list[int] = []
    """Non-empty for a *micro-batch*: ``len(rows)`` requests of ``rows[i]`` rows each, stacked
    along the first dimension of every input in one block, answered by one :class:`Answer`
    whose outputs are stacked the same way (or one :class:`Failure` for all), or by
    :class:`Regroup` when the executor will not run them together."""
    inputs_apart: bool = False
    """A micro-batch whose ``inputs`` are listed request by request (``len(rows)`` times the
    model's inputs: shared-memory references, read by the executor into consecutive rows)."""
    outputs_apart: bool = False
    """A micro-batch whose ``outputs`` are listed request by request (each request's regions);
    its :class:`Answer` lists the placed outputs request by request too."""
    window: int = 0
    """Non-zero for a streamed request (never a micro-batch): answered by :class:`Part` frames,
    at most ``window`` of them beyond those the front end took (:class:`Credit`). The executor
    copies a streamed request's inputs out of the arena before it answers anything, so the
    front end frees their blocks at the first frame that answers it."""


class Call(msgspec.Struct, array_like=True, tag=2):
    """Front end -> executor: any other V2 operation, by name (only those
    ``infermux.transport.calls.CALLS`` lists: the coroutines of ``Operations`` but ``infer``)."""

    seq: int
    method: str
    args: list[Any]
    kwargs: dict[str, Any]


class Release(msgspec.Struct, array_like=True, tag=3):
    """Front end -> executor: the answer blocks at these offsets have been read."""

    offsets: list[int]


class Answer(msgspec.Struct, array_like=True, tag=4):
    """Executor -> front end: the response to an :class:`Infer`."""

    seq: int
    model: str
    version: str
    id: str
    parameters: Parameters
    outputs: list[WireTensor]


class Result(msgspec.Struct, array_like=True, tag=5):
    """Executor -> front end: what a :class:`Call` returned (msgpack-able builtins)."""

    seq: int
    value: Any


class Failure(msgspec.Struct, array_like=True, tag=6):
    """Executor -> front end: the :class:`Infer` or :class:`Call` ``seq`` failed."""

    seq: int
    code: str
    message: str
    reason: str = ""
    """The :class:`~infermux.errors.FailureReason` (a front end over several executors retries
    an executor that went away, never a refusal)."""


class Cancel(msgspec.Struct, array_like=True, tag=7):
    """Front end -> executor: the client gave up on the :class:`Infer` ``seq`` (it disconnected,
    cancelled, or its deadline passed). A queued request leaves its queue; one in a running
    batch finishes, its result dropped. Either way it is still answered (a :class:`Failure`,
    or an :class:`Answer` that crossed this frame), and a ``seq`` already answered is ignored."""

    seq: int


class Regroup(msgspec.Struct, array_like=True, tag=8):
    """Executor -> front end: the micro-batch :class:`Infer` ``seq`` was not run: send its
    requests one by one. ``lasting``: the model's traffic policy, queue policy, tracing or
    batch size needs each request on its own, so do not group for that model for a while;
    False: one of these requests is at fault (e.g. a shared-memory region it cannot use), and
    the next micro-batch may go. ``why`` says which."""

    seq: int
    why: str
    lasting: bool = True


class Forget(msgspec.Struct, array_like=True, tag=9):
    """Executor -> front end: system shared-memory region ``name`` (every region when "") was
    unregistered; a front end that reads regions itself (``transport/regions.py``) drops it,
    then answers :class:`Forgotten` with the same ``seq`` (the executor's own numbering)."""

    seq: int
    name: str


class Forgotten(msgspec.Struct, array_like=True, tag=10):
    """Front end -> executor: the :class:`Forget` ``seq`` took effect: no read or write of the
    region starts in this front end from now on."""

    seq: int


class Part(msgspec.Struct, array_like=True, tag=11):
    """Executor -> front end: one response of the streamed :class:`Infer` ``seq``; more follow
    unless ``final``. Outputs travel as an :class:`Answer`'s do (blocks of the executor's arena,
    handed back by :class:`Release`); an error response has none and ``error_code`` set (the
    stream may go on after it); ``flag_only``: no response, the final flag alone."""

    seq: int
    model: str
    version: str
    id: str
    parameters: Parameters
    outputs: list[WireTensor]
    final: bool
    flag_only: bool = False
    error_code: str = ""
    error_message: str = ""
    error_reason: str = ""


class Credit(msgspec.Struct, array_like=True, tag=12):
    """Front end -> executor: the reader of the streamed :class:`Infer` ``seq`` took ``count``
    more of its responses, so the executor may send that many more :class:`Part` frames."""

    seq: int
    count: int


ToExecutor = Infer | Call | Release | Cancel | Forgotten | Credit
ToFrontend = Answer | Result | Failure | Regroup | Forget | Part


encode = msgspec.msgpack.Encoder().encode
to_executor = msgspec.msgpack.Decoder(ToExecutor).decode
to_frontend = msgspec.msgpack.Decoder(ToFrontend).decode


def failure(seq: int, exc: BaseException) -> Failure:
    """The frame that reports ``exc``; anything but an :class:`InfermuxError` is INTERNAL."""
    if isinstance(exc, InfermuxError):
        return Failure(seq, exc.code.value, exc.message, exc.reason.value)
    return Failure(seq, ErrorCode.INTERNAL.value, f"internal error: {exc}")


def cancelled(seq: int, why: str) -> Failure:
    """The answer to an :class:`Infer` that was given up (``why``) and will not run on."""
    return Failure(seq, ErrorCode.CANCELLED.value, why, FailureReason.CANCELED.value)


def raise_failure(frame: Failure) -> InfermuxError:
    """The error a :class:`Failure` frame stands for, with its code."""
    return _error(frame.code, frame.message, frame.reason)


def _error(code_name: str, message: str, reason: str) -> InfermuxError:
    try:
        code = ErrorCode(code_name)
    except ValueError:
        code = ErrorCode.INTERNAL
    error = InfermuxError(message, code)
    with contextlib.suppress(ValueError):  # an older or unknown reason stays OTHER
        error.reason = FailureReason(reason)
    return error


def infer_frame(
    seq: int, request: InferRequest, inputs: list[WireTensor], *, window: int = 0
) -> Infer:
    """The frame that sends ``request`` alone (``window``: streamed), its inputs placed."""
    return Infer(
        seq,
        request.model_name,
        request.model_version,
        request.id,
        request.parameters,
        inputs,
        [(o.name, o.parameters) for o in request.outputs],
        request.trace_context,
        request.deadline_ns,
        window=window,
    )


def part(seq: int, response: InferResponse, outputs: list[WireTensor]) -> Part:
    """The frame that carries ``response`` (its ``outputs`` already placed) of stream ``seq``."""
    frame = Part(
        seq,
        response.model_name,
        response.model_version,
        response.id,
        response.parameters,
        outputs,
        response.final,
        response.flag_only,
    )
    error = response.error
    if error is not None:
        frame.error_code, frame.error_message = error.code.value, error.message
        frame.error_reason = error.reason.value
    return frame


def part_error(frame: Part) -> InfermuxError | None:
    """The error of an error response (None for any other)."""
    if not frame.error_code:
        return None
    return _error(frame.error_code, frame.error_message, frame.error_reason)


_SMALL_TENSOR = 64 * 1024
"""Bytes up to which :func:`write_tensor` copies a tensor through ``tobytes``."""


def arena_bytes(tensor: Tensor) -> tuple[int, bytes | None]:
    """Bytes ``tensor`` takes in an arena (its raw V2 encoding), and that encoding for a BYTES
    tensor (made once, for :func:`write_tensor` too); fixed-size tensors are copied straight
    from their array."""
    if tensor.datatype == "BYTES":
        raw = tensor_to_bytes("BYTES", tensor.data)
        return len(raw), raw
    return int(tensor.data.size) * numpy_dtype(tensor.datatype).itemsize, None


def write_tensor(arena: Arena, block: Block, tensor: Tensor, raw: bytes | None) -> WireTensor:
    """Copy ``tensor``'s bytes (``raw``, as :func:`arena_bytes` gave them) into ``block``,
    and describe them."""
    view = arena.buffer(block.offset, block.size)
    try:
        if raw is not None:
            view[:] = raw
        else:
            dtype = numpy_dtype(tensor.datatype).newbyteorder("<")
            data = tensor.data
            if data.dtype == dtype and data.nbytes <= _SMALL_TENSOR:
                # A third of copyto's cost on the small tensors a streaming model sends per
                # response (the extra copy is cheaper than copyto's setup at this size).
                view[:] = data.tobytes()
            else:
                np.copyto(np.frombuffer(view, dtype=dtype).reshape(data.shape), data)
    finally:
        view.release()
    return WireTensor(
        tensor.name, tensor.datatype, tensor.shape, tensor.parameters, block.offset, block.size
    )


def read_tensor(arena: Arena, wire: WireTensor, *, copy: bool) -> Tensor:
    """The tensor ``wire`` describes. ``copy=False`` views the arena in place (the caller keeps
    the block until it is done); ``copy=True`` returns memory of its own."""
    if wire.offset == NO_DATA:
        data = np.empty(0, dtype=numpy_dtype(wire.datatype))
        return Tensor(wire.name, wire.datatype, wire.shape, data, wire.parameters)
    try:
        view = arena.buffer(wire.offset, wire.size)
    except ValueError as exc:  # a corrupt header: never read outside the arena
        raise InternalError(f"tensor '{wire.name}': {exc}") from None
    raw: bytes | memoryview = bytes(view) if copy else view
    if copy:
        view.release()
    try:
        data = tensor_from_bytes(wire.name, wire.datatype, wire.shape, raw)
    except InvalidArgumentError as exc:
        raise InternalError(f"tensor '{wire.name}' arrived damaged: {exc.message}") from None
    return Tensor(wire.name, wire.datatype, wire.shape, data, wire.parameters)
