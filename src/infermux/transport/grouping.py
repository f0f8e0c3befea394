"""Micro-batches: a front end's requests to one model, sent to the executor as one frame.

The executor's event loop is the one place every request of a GPU passes, and its cost per
request (decoding a frame, a task, validation, a queue entry, an answer frame) is what limited a
GPU to ~0.3x its ceiling (``docs/benchmarks.md``). A front end sees many requests to the same
model in one loop iteration under load; it stacks those that are alike into one block of its
arena and sends them as one :class:`~infermux.ipc.wire.Infer` with ``rows``, so the executor's
work is per micro-batch, and the front ends, of which there are several, do the per-request part.

Requests are grouped only when nothing about them needs the executor to treat them apart: the
same model, version, input names, datatypes and shapes past the first dimension, the same
outputs asked for, no request parameters that matter (priorities, timeouts, sequence ids), no
deadline, no trace context; shared-memory tensors travel as references, one list per request.
The executor refuses a micro-batch (a :class:`~infermux.ipc.wire.Regroup`) whose model routes,
queues or executes each request on its own; the front end then sends its requests one by one
and does not group for that model for a while. Everything else about the group (an error, the
model being unloaded) is every member's, as it would be for requests that share a batch.
"""

from __future__ import annotations

import asyncio
from collections.abc import Hashable
from dataclasses import dataclass, field

import numpy as np

from infermux.errors import InternalError
from infermux.ipc import Block
from infermux.types import (
    InferRequest,
    InferResponse,
    Parameters,
    Tensor,
    numpy_dtype,
    uses_shared_memory,
)

GROUP_LIMIT = 64
"""Requests per micro-batch (the executor's model batches further, up to its max_batch_size)."""

HOLD_WHILE_IN_FLIGHT = 2
"""While at least this many requests or micro-batches of a front end are with the executor, a new
micro-batch waits for one of them to be answered (or to fill up) before it leaves: the executor
is busy with this front end's work anyway, so the wait costs the requests nothing they would not
wait in its queue, and they reach it as one frame instead of many. With fewer in flight a
micro-batch leaves after one loop iteration, so an idle server adds no wait."""

HOLD_SECONDS = 0.002
"""The longest a micro-batch waits for an answer to free a place (a bound in case answers stall:
the executor's own queue would hold the requests meanwhile)."""

INERT_PARAMETERS = frozenset({"triton_enable_empty_final_response"})
"""Request parameters that change nothing about how a request is queued, routed or run (Triton's
clients, perf_analyzer among them, send this one with every gRPC request, for streams): requests
carrying only these, alike, still travel together. Any other parameter (priority, timeout,
sequence ids, a routing key, one for the model) keeps a request on its own."""

UNGROUPED_SECONDS = 10.0
"""How long a front end sends one by one to a model whose micro-batch was refused."""


Kind = tuple[str, str]
"""Where a micro-batch's inputs and outputs lie: ``"bytes"`` (stacked) or ``"shm"`` (listed)."""

GroupKey = tuple[Kind, str, str, tuple[Hashable, ...], tuple[Hashable, ...], tuple[Hashable, ...]]
"""Kind, model, version, inputs, outputs and parameters: what alike requests share."""


def group_key(request: InferRequest) -> GroupKey | None:
    """What requests must share to travel in one micro-batch (None: this one travels alone).

    Two kinds travel: requests whose inputs all carry their bytes (stacked into one block) and
    requests whose inputs all lie in client shared memory (listed per request; the executor
    reads each into consecutive rows). Outputs are all returned, or all placed in shared memory
    (per request). The key's first item says which (:attr:`MicroBatch.kind`)."""
    if request.trace_context or request.deadline_ns or not request.inputs:
        return None
    if any(key not in INERT_PARAMETERS for key in request.parameters):
        return None
    in_shm = [uses_shared_memory(t.parameters) for t in request.inputs]
    if any(in_shm) and not all(in_shm):
        return None
    out_shm = [uses_shared_memory(o.parameters) for o in request.outputs]
    if any(out_shm) and not all(out_shm):
        return None
    rows = request.inputs[0].shape[0] if request.inputs[0].shape else 0
    inputs = []
    for tensor, shm in zip(request.inputs, in_shm, strict=True):
        if tensor.datatype == "BYTES" or not tensor.shape or tensor.shape[0] != rows or rows < 1:
            return None  # text, a scalar, or batch sizes that disagree: refused on its own
        inputs.append(
            (
                tensor.name,
                tensor.datatype,
                tensor.shape[1:],
                () if shm else _frozen(tensor.parameters),
            )
        )
    outputs = tuple(
        (o.name, () if shm else _frozen(o.parameters))
        for o, shm in zip(request.outputs, out_shm, strict=True)
    )
    kind: Kind = (
        "shm" if all(in_shm) else "bytes",
        "shm" if out_shm and all(out_shm) else "bytes",
    )
    parameters = _frozen(request.parameters)
    return (kind, request.model_name, request.model_version, tuple(inputs), outputs, parameters)


def _frozen(parameters: Parameters) -> tuple[tuple[str, object], ...]:
    return tuple(sorted(parameters.items())) if parameters else ()


@dataclass(slots=True)
class Member:
    """One request of a micro-batch, and what its caller awaits."""

    request: InferRequest
    future: asyncio.Future[InferResponse]
    task: asyncio.Task[None] | None = None  # when it was sent on its own after all

    @property
    def rows(self) -> int:
        return self.request.inputs[0].shape[0]

    def fail(self, error: BaseException) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(slots=True)
class MicroBatch:
    """Requests collected in one loop iteration; :attr:`seq` is set once it is sent."""

    kind: Kind = ("bytes", "bytes")
    """The first item of its :func:`group_key`: where its inputs and its outputs lie."""
    members: list[Member] = field(default_factory=list)
    seq: int = 0
    blocks: list[Block] = field(default_factory=list)
    cancel_sent: bool = False

    @property
    def inputs_apart(self) -> bool:
        """Inputs are listed per request (shared-memory references), not stacked."""
        return self.kind[0] == "shm"

    @property
    def outputs_apart(self) -> bool:
        """The answer lists outputs per request (placed in shared memory), not stacked."""
        return self.kind[1] == "shm"

    @property
    def lone_as_batch(self) -> bool:
        """A request left alone still travels as a micro-batch (of one): its tensors lie in
        client shared memory, which the executor's micro-batch path handles in one pass per
        input and output and, for CUDA regions, writes device to device, where a request sent
        on its own has its outputs copied to the host and back, a synchronous copy on the
        executor's loop (``docs/benchmarks.md``, *Lone CUDA-shm requests*)."""
        return self.inputs_apart or self.outputs_apart

    def live(self) -> list[Member]:
        """The members whose callers still wait."""
        return [m for m in self.members if not m.future.done()]

    def abandoned(self) -> bool:
        """Every caller gave up (or was answered)."""
        return all(m.future.done() for m in self.members)

    def answer(
        self, model: str, version: str, outputs: list[Tensor], parameters: Parameters
    ) -> None:
        """Give each member its rows of the stacked ``outputs`` (its own outputs, when they
        are listed per request)."""
        if self.outputs_apart:
            each = len(outputs) // max(len(self.members), 1)
            for index, member in enumerate(self.members):
                mine = outputs[index * each : (index + 1) * each]
                if not member.future.done():
                    member.future.set_result(
                        InferResponse(model, version, mine, member.request.id, dict(parameters))
                    )
            return
        total = sum(m.rows for m in self.members)
        for tensor in outputs:
            if not tensor.shape or tensor.shape[0] != total:
                error = InternalError(
                    f"model '{model}' answered output '{tensor.name}' with shape "
                    f"{list(tensor.shape)} for a micro-batch of {total} rows"
                )
                for member in self.members:
                    member.fail(error)
                return
        start = 0
        for member in self.members:
            rows = member.rows
            mine = [
                Tensor(
                    t.name,
                    t.datatype,
                    (rows, *t.shape[1:]),
                    t.data[start : start + rows],
                    dict(t.parameters),
                )
                for t in outputs
            ]
            start += rows
            if not member.future.done():
                member.future.set_result(
                    InferResponse(model, version, mine, member.request.id, dict(parameters))
                )


def stacked_bytes(tensor: Tensor) -> int:
    """Bytes ``tensor`` takes in a micro-batch's stacked input (its V2 encoding)."""
    return int(tensor.data.size) * numpy_dtype(tensor.datatype).itemsize


def stack_into(view: memoryview, tensors: list[Tensor]) -> None:
    """Write the tensors' bytes one after the other into ``view``, each encoded as
    :func:`~infermux.ipc.wire.write_tensor` would (little-endian, the datatype's dtype)."""
    offset = 0
    for tensor in tensors:
        dtype = numpy_dtype(tensor.datatype).newbyteorder("<")
        size = int(tensor.data.size) * dtype.itemsize
        target = np.frombuffer(view[offset : offset + size], dtype=dtype)
        np.copyto(target.reshape(tensor.data.shape), tensor.data)
        offset += size
