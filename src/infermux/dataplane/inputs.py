"""Checks a request against its model's config and turns it into what the model receives.

Messages follow Triton's wording where clients may already match on it, and always name the model,
the tensor and what was expected.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from infermux.backends.base import DeviceInput, ModelRequest
from infermux.errors import InvalidArgumentError
from infermux.model_config import ModelConfig, TensorConfig
from infermux.settings import DEFAULT_MAX_BYTES_ELEMENT_SIZE, DEFAULT_MAX_INPUT_ELEMENTS
from infermux.types import InferRequest, Tensor


@dataclass(frozen=True, slots=True)
class InputLimits:
    """What one input may hold, whatever the transport (``--max-input-elements``,
    ``--max-bytes-element-size``): request bodies and gRPC messages are bounded by their own
    flags, but an input read from a shared-memory region is bounded only by these."""

    max_elements: int = DEFAULT_MAX_INPUT_ELEMENTS
    max_bytes_element_size: int = DEFAULT_MAX_BYTES_ELEMENT_SIZE


def to_model_request(
    config: ModelConfig,
    request: InferRequest,
    device: Mapping[str, DeviceInput] | None = None,
    limits: InputLimits = InputLimits(),
) -> ModelRequest:
    """Validate ``request`` for ``config`` and produce what the model's ``execute`` receives.

    ``device`` holds the data of inputs that stay in GPU memory (their ``Tensor.data`` is unused).
    """
    model = config.name
    inputs: dict[str, npt.NDArray[np.generic]] = {}
    on_device: dict[str, DeviceInput] = {}
    batch: int | None = None
    for tensor in request.inputs:
        spec = config.input(tensor.name)
        if spec is None:
            raise InvalidArgumentError(
                f"unexpected inference input '{tensor.name}' for model '{model}'"
            )
        if tensor.name in inputs or tensor.name in on_device:
            raise InvalidArgumentError(
                f"input '{tensor.name}' appears more than once in the request for model '{model}'"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidArgumentError(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{spec.datatype}'"
            )
        _check_shape(config, spec, tensor.shape)
        _check_limits(model, tensor, limits)
        if config.batching:
            if batch is None:
                batch = tensor.shape[0]
            elif tensor.shape[0] != batch:
                raise InvalidArgumentError(
                    f"input '{tensor.name}' has batch size {tensor.shape[0]} but other inputs of "
                    f"the request to model '{model}' have batch size {batch}"
                )
        shape = None
        if spec.reshape is not None:
            shape = tensor.shape[:1] + spec.reshape if config.batching else spec.reshape
        if device and tensor.name in device:
            gpu = device[tensor.name]
            on_device[tensor.name] = gpu.reshape(shape) if shape is not None else gpu
        else:
            inputs[tensor.name] = tensor.data.reshape(shape) if shape is not None else tensor.data
    given = len(inputs) + len(on_device)
    missing = [
        t.name
        for t in config.inputs
        if not t.optional and t.name not in inputs and t.name not in on_device
    ]
    if missing:
        raise InvalidArgumentError(
            f"expected {len(config.inputs)} inputs but got {given} inputs for model "
            f"'{model}'; missing: {', '.join(missing)}"
        )
    wanted: list[str] = []
    for output in request.outputs:
        if config.output(output.name) is None:
            raise InvalidArgumentError(
                f"unexpected inference output '{output.name}' for model '{model}'"
            )
        if output.name in wanted:
            raise InvalidArgumentError(
                f"output '{output.name}' is requested more than once for model '{model}'"
            )
        wanted.append(output.name)
    requested = tuple(wanted) if wanted else tuple(t.name for t in config.outputs)
    return ModelRequest(inputs, requested, dict(request.parameters), request.id, on_device)


def _check_limits(model: str, tensor: Tensor, limits: InputLimits) -> None:
    elements = math.prod(tensor.shape)
    if elements > limits.max_elements:
        raise InvalidArgumentError(
            f"input '{tensor.name}' for model '{model}' has {elements} elements; this server "
            f"accepts at most {limits.max_elements} per input (--max-input-elements)"
        )
    if tensor.datatype == "BYTES" and isinstance(tensor.data, np.ndarray) and elements:
        longest = max(map(len, tensor.data.reshape(-1).tolist()))
        if longest > limits.max_bytes_element_size:
            raise InvalidArgumentError(
                f"input '{tensor.name}' for model '{model}' has a BYTES element of {longest} "
                f"bytes; this server accepts at most {limits.max_bytes_element_size} "
                "(--max-bytes-element-size)"
            )


def _check_shape(config: ModelConfig, spec: TensorConfig, shape: tuple[int, ...]) -> None:
    model, dims = config.name, spec.dims
    if config.batching:
        if len(shape) == len(dims) + 1 and shape[0] > config.max_batch_size:
            raise InvalidArgumentError(
                f"inference request batch-size must be <= {config.max_batch_size} for "
                f"'{model}', got {shape[0]} in input '{spec.name}'"
            )
        if len(shape) == len(dims) + 1 and shape[0] < 1:
            raise InvalidArgumentError(
                f"input '{spec.name}' for model '{model}' has batch size {shape[0]}; must be >= 1"
            )
        per_item = shape[1:]
    else:
        per_item = shape
    if len(per_item) != len(dims) or any(
        want not in (-1, got) for want, got in zip(dims, per_item, strict=True)
    ):
        raise InvalidArgumentError(
            f"unexpected shape for input '{spec.name}' for model '{model}': got {list(shape)}, "
            f"expected {list(config.full_shape(spec))}"
        )
