"""Stacking the requests of a batch into one tensor per input, and splitting outputs back.

Backends that run one kernel over the whole batch (PyTorch, ONNX Runtime, TensorRT) need this; the
Python backend receives the list of requests and may use these helpers itself.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ModelRequest, parts_of
from infermux.errors import InvalidArgumentError
from infermux.types import DeviceArray


def compatible(a: ModelRequest, b: ModelRequest) -> bool:
    """Whether two requests can share a stacked batch: same inputs and shapes past the batch."""
    # An input is on the device in every request of a batch or in none: a batch is gathered
    # either from host memory or from GPU memory, per input.
    for mine, theirs in ((a.inputs, b.inputs), (a.device_inputs, b.device_inputs)):
        if mine.keys() != theirs.keys():
            return False
        for name, array in mine.items():
            other = theirs[name]
            if array.shape[1:] != other.shape[1:] or array.dtype != other.dtype:
                return False
    return True


StackTarget = Callable[[str, tuple[int, ...], np.dtype[Any]], npt.NDArray[Any] | None]
"""Where a backend wants input ``name`` of a batch stacked (e.g. its pinned staging buffer, so
the batch is copied once, not stacked and then copied again), or None for a new array."""


def stack(
    requests: Sequence[ModelRequest], into: StackTarget | None = None
) -> dict[str, npt.NDArray[np.generic]]:
    """Concatenate each input of ``requests`` along the batch dimension (requests in order),
    into the arrays ``into`` offers where it offers one."""
    if not requests:
        raise ValueError("cannot stack an empty batch")
    first = requests[0]
    for other in requests[1:]:
        if not compatible(first, other):
            raise InvalidArgumentError("requests with different input shapes cannot be stacked")
    if len(requests) == 1:
        return dict(first.inputs)
    stacked = {}
    for name in first.inputs:
        parts = [r.inputs[name] for r in requests]
        shape = (sum(p.shape[0] for p in parts), *parts[0].shape[1:])
        target = into(name, shape, parts[0].dtype) if into is not None else None
        stacked[name] = np.concatenate(parts, axis=0, out=target)
    return stacked


def batch_shapes(requests: Sequence[ModelRequest], batching: bool) -> dict[str, tuple[int, ...]]:
    """The shape every input of the stacked batch will have (host and device inputs alike),
    known before anything is stacked; ``requests`` are compatible (:func:`compatible`)."""
    first = requests[0]
    rows = sum(r.batch_size for r in requests)
    shapes: dict[str, tuple[int, ...]] = {}
    for arrays in (first.inputs, first.device_inputs):
        for name, array in arrays.items():
            shapes[name] = (rows, *array.shape[1:]) if batching else tuple(array.shape)
    return shapes


def device_parts(requests: Sequence[ModelRequest]) -> dict[str, list[DeviceArray]]:
    """Each device input's per-request parts, in request order (gathered on the GPU): a
    micro-batch's request brings one part per request it stands for."""
    if not requests or not requests[0].device_inputs:
        return {}
    return {
        name: [part for r in requests for part in parts_of(r.device_inputs[name])]
        for name in requests[0].device_inputs
    }


def split(
    outputs: Mapping[str, npt.NDArray[np.generic]], batch_sizes: Sequence[int]
) -> list[dict[str, npt.NDArray[np.generic]]]:
    """Cut each stacked output back into one slice per request (views, no copies)."""
    total = sum(batch_sizes)
    for name, array in outputs.items():
        if array.ndim == 0 or array.shape[0] != total:
            raise InvalidArgumentError(
                f"output '{name}' has {array.shape[0] if array.ndim else 0} rows but the batch has "
                f"{total}"
            )
    results: list[dict[str, npt.NDArray[np.generic]]] = []
    start = 0
    for size in batch_sizes:
        results.append({name: array[start : start + size] for name, array in outputs.items()})
        start += size
    return results
