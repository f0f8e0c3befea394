"""Micro-batches on the executor's side: the checks that let requests sent together run as one,
and the shared-memory reads and writes that keep each request's own regions (inputs in CUDA
regions stay there, one part per request, gathered device to device by the batch).

The front end's side (what travels together, and how the answer is cut back) is
:mod:`~infermux.transport.grouping`; :meth:`~infermux.dataplane.plane.DataPlane.infer_many` runs
a micro-batch with these.
"""

from __future__ import annotations

import math
from collections.abc import Sequence, Set
from typing import TypeVar

import numpy as np

from infermux.backends.base import DeviceParts
from infermux.errors import InfermuxError, InternalError
from infermux.ipc.arena import Block
from infermux.model_config import ModelConfig
from infermux.repository import LoadedModel
from infermux.routing.policy import TrafficPolicy
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_REGION,
    InferRequest,
    RequestedOutput,
    Tensor,
    numpy_dtype,
)

from .cuda_shared_memory import AllocationSizes
from .regions import Regions
from .shared_memory import placed as placed_tensor


class Ungroupable(Exception):
    """A micro-batch (:meth:`DataPlane.infer_many`) whose requests must run one by one; the
    message says why. ``lasting``: the reason is the model's (its policies, tracing), so its
    requests should not be grouped for a while; False when one of these requests is at fault
    (a region it cannot use), which says nothing about the next micro-batch."""

    def __init__(self, why: str, *, lasting: bool = True) -> None:
        super().__init__(why)
        self.lasting = lasting


T = TypeVar("T")


def per_request(items: list[T], count: int) -> list[list[T]]:
    """``items`` listed request by request (as many for each), cut into ``count`` lists."""
    each = len(items) // count
    if each == 0 or each * count != len(items):
        raise InternalError(f"a micro-batch of {count} requests listed {len(items)} tensors")
    return [items[i * each : (i + 1) * each] for i in range(count)]


def ungroupable(model: LoadedModel, policy: TrafficPolicy, rows: int) -> str:
    """Why requests to ``model`` cannot share one queue entry ("" when they can): each must be
    seen by the model as a request of its own, or be routed, queued, timed out and mirrored on
    its own, or be its own execution."""
    config = model.config
    if not model.stacks_inputs:
        return f"model '{config.name}' is given each request (its backend does not stack them)"
    if policy.weights or policy.shadow is not None:
        return f"model '{config.name}' has a traffic policy that routes each request"
    batching = config.dynamic_batching
    if not config.batching or batching is None:
        return f"model '{config.name}' runs each request as its own execution"
    if rows > config.max_batch_size:
        return f"{rows} rows exceed model '{config.name}''s max_batch_size"
    policies = [batching.default_queue_policy, *batching.priority_queue_policy.values()]
    if batching.priority_levels or any(
        p.max_queue_size or p.default_timeout_microseconds for p in policies
    ):
        return f"model '{config.name}' has queue priorities, bounds or timeouts per request"
    return ""


def stacked_request(
    request: InferRequest,
    count: int,
    inputs_apart: bool,
    regions: Regions,
    staged: list[Block],
    *,
    on_device: bool,
    sizes: AllocationSizes | None = None,
) -> tuple[InferRequest, dict[str, DeviceParts]]:
    """``request`` with each input's per-request shared-memory parts read into one array, and
    the inputs whose parts stay in GPU memory (CUDA regions, for a model that reads them there,
    ``on_device``): each request's rows where its client put them, gathered by the batch.
    ``sizes``: the micro-batch's CUDA allocation sizes (``Regions.read_stacked``)."""
    if not inputs_apart:
        return InferRequest(request.model_name, request.model_version, request.inputs), {}
    parts = per_request(request.inputs, count)
    inputs = []
    device: dict[str, DeviceParts] = {}
    sizes = {} if sizes is None else sizes
    for index, first in enumerate(parts[0]):
        tensors = [p[index] for p in parts]
        try:
            data = regions.read_stacked(tensors, staged, on_device=on_device, sizes=sizes)
        except InfermuxError as exc:  # one request's mistake must be its own
            raise Ungroupable(
                f"a request's input cannot be read: {exc.message}", lasting=False
            ) from None
        if isinstance(data, DeviceParts):
            device[first.name] = data
            empty = np.empty(0, numpy_dtype(first.datatype))  # its data is on the device
            inputs.append(Tensor(first.name, first.datatype, data.shape, empty))
        else:
            inputs.append(Tensor(first.name, first.datatype, data.shape, data))
    return InferRequest(request.model_name, request.model_version, inputs), device


def check_output_regions(
    config: ModelConfig,
    wanted: list[list[RequestedOutput]],
    rows: Sequence[int],
    regions: Regions,
) -> None:
    """Each request's output regions are registered and, where the config fixes the
    output's size, large enough; otherwise it must fail on its own."""
    row_bytes: dict[str, int | None] = {}  # per output: fixed bytes per row (None: unknown)
    for mine_wanted, count in zip(wanted, rows, strict=True):
        for output in mine_wanted:
            name = output.name
            if name not in row_bytes:  # looked up once per output, not once per request
                spec = config.output(name)
                if spec is None:
                    raise Ungroupable(
                        f"output '{name}' of a request cannot be placed", lasting=False
                    )
                dims = spec.reshape if spec.reshape is not None else spec.dims
                fixed = spec.datatype != "BYTES" and all(d > 0 for d in dims)
                itemsize = numpy_dtype(spec.datatype).itemsize if fixed else 0
                row_bytes[name] = math.prod(dims) * itemsize if fixed else None
            region = str(output.parameters.get(SHM_REGION, ""))
            if not (regions.shm.has(region) or regions.cuda.has(region)):
                raise Ungroupable(f"output '{name}' of a request cannot be placed", lasting=False)
            per_row = row_bytes[name]
            if per_row is not None:
                size = output.parameters.get(SHM_BYTE_SIZE)
                if not isinstance(size, int) or size < count * per_row:
                    raise Ungroupable(f"output '{name}' of a request does not fit", lasting=False)


def device_destinations(
    config: ModelConfig,
    wanted: list[list[RequestedOutput]],
    rows: Sequence[int],
    regions: Regions,
    sizes: AllocationSizes | None = None,
) -> dict[str, DeviceParts]:
    """The outputs that every request of a micro-batch wants in a CUDA region, as one device
    part per request (its rows' place in its region): a GPU backend may copy them there device
    to device instead of through host memory. Only outputs of fixed size and a datatype with
    device bytes; ones a request asks with more than a place (e.g. classification) stay on the
    host path, as do any that :meth:`place_apart` would refuse. ``sizes``: as
    :func:`stacked_request`'s."""
    destinations: dict[str, DeviceParts] = {}
    sizes = {} if sizes is None else sizes
    for index, first in enumerate(wanted[0]):
        spec = config.output(first.name)
        if spec is None or any(d < 1 for d in spec.dims):
            continue
        outputs = [mine_wanted[index] for mine_wanted in wanted]
        if any(output.name != first.name for output in outputs):
            continue
        places = [output.parameters for output in outputs]
        parts = regions.cuda.destinations(spec.datatype, spec.dims, places, rows, sizes)
        if parts is not None:  # else the host path places them (and fails what is wrong)
            destinations[first.name] = DeviceParts(parts)
    return destinations


def place_apart(
    outputs: list[Tensor],
    rows: Sequence[int],
    wanted: list[list[RequestedOutput]],
    regions: Regions,
    on_device: Set[str] = frozenset(),
) -> list[Tensor]:
    """Each request's rows of the stacked ``outputs``, written into its own regions (those
    named in ``on_device`` are there already: the batch copied them on the GPU)."""
    placed = []
    start = 0
    for mine_wanted, count in zip(wanted, rows, strict=True):
        by_name = {o.name: o.parameters for o in mine_wanted}
        for tensor in outputs:
            mine = Tensor(
                tensor.name,
                tensor.datatype,
                (count, *tensor.shape[1:]),
                tensor.data[start : start + count],
            )
            parameters = by_name[tensor.name]
            if tensor.name in on_device:
                placed.append(placed_tensor(mine, parameters, mine.data.nbytes))
            elif regions.cuda.has(str(parameters.get(SHM_REGION, ""))):
                placed.append(regions.cuda.write(mine, parameters))
            else:
                placed.append(regions.shm.write(mine, parameters))
        start += count
    return placed
