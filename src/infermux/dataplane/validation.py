"""Checks a request against its model's config, and a model's outputs against the same config.

Messages follow Triton's wording where clients may already match on it, and always name the model,
the tensor and what was expected.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.errors import InfermuxError, InternalError, InvalidArgumentError
from infermux.model_config import ModelConfig, TensorConfig
from infermux.types import InferRequest, Tensor, numpy_dtype


def to_model_request(config: ModelConfig, request: InferRequest) -> ModelRequest:
    """Validate ``request`` for ``config`` and produce what the model's ``execute`` receives."""
    model = config.name
    inputs: dict[str, npt.NDArray[np.generic]] = {}
    batch: int | None = None
    for tensor in request.inputs:
        spec = config.input(tensor.name)
        if spec is None:
            raise InvalidArgumentError(
                f"unexpected inference input '{tensor.name}' for model '{model}'"
            )
        if tensor.name in inputs:
            raise InvalidArgumentError(
                f"input '{tensor.name}' appears more than once in the request for model '{model}'"
            )
        if tensor.datatype != spec.datatype:
            raise InvalidArgumentError(
                f"inference input '{tensor.name}' data-type is '{tensor.datatype}', "
                f"but model '{model}' expects '{spec.datatype}'"
            )
        _check_shape(config, spec, tensor.shape)
        if config.batching:
            if batch is None:
                batch = tensor.shape[0]
            elif tensor.shape[0] != batch:
                raise InvalidArgumentError(
                    f"input '{tensor.name}' has batch size {tensor.shape[0]} but other inputs of "
                    f"the request to model '{model}' have batch size {batch}"
                )
        data = tensor.data
        if spec.reshape is not None:
            data = data.reshape(
                tensor.shape[:1] + spec.reshape if config.batching else spec.reshape
            )
        inputs[tensor.name] = data
    missing = [t.name for t in config.inputs if not t.optional and t.name not in inputs]
    if missing:
        raise InvalidArgumentError(
            f"expected {len(config.inputs)} inputs but got {len(inputs)} inputs for model "
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
    return ModelRequest(inputs, requested, dict(request.parameters), request.id)


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


def to_output_tensors(
    config: ModelConfig, request: ModelRequest, result: ExecuteResult
) -> list[Tensor]:
    """The requested outputs of one request's ``result``, checked and cast to the config's types.

    A result that is an exception is raised: as-is when it is an :class:`InfermuxError` (the model
    chose the error code), wrapped as an internal error otherwise.
    """
    model = config.name
    if isinstance(result, InfermuxError):
        raise result
    if isinstance(result, Exception):
        raise InternalError(
            f"model '{model}' failed the request: {type(result).__name__}: {result}"
        )
    if not isinstance(result, Mapping):
        raise InternalError(
            f"model '{model}' returned {type(result).__name__} for a request; "
            "expected a dict of output name -> array or an exception"
        )
    outputs = []
    for name in request.requested_outputs:
        spec = config.output(name)
        assert spec is not None  # requested outputs were validated against the config
        if name not in result:
            raise InternalError(f"model '{model}' did not return output '{name}'")
        array = _as_datatype(model, spec, result[name])
        _check_output_shape(config, spec, array.shape, request.batch_size)
        outputs.append(Tensor(name, spec.datatype, tuple(array.shape), array))
    return outputs


def _as_datatype(model: str, spec: TensorConfig, value: object) -> npt.NDArray[np.generic]:
    if spec.datatype == "BYTES":
        array = np.asarray(value, dtype=np.object_)
        flat = array.reshape(-1)
        for i, item in enumerate(flat):
            if isinstance(item, str):
                flat[i] = item.encode("utf-8")
            elif not isinstance(item, bytes):
                flat[i] = str(item).encode("utf-8")
        return array
    expected = numpy_dtype(spec.datatype)
    array = np.asarray(value)
    if array.dtype == expected:
        return array
    if np.can_cast(array.dtype, expected, casting="same_kind"):
        return array.astype(expected)
    raise InternalError(
        f"model '{model}' returned output '{spec.name}' as {array.dtype}, which cannot become "
        f"{spec.datatype} as the config declares"
    )


def _check_output_shape(
    config: ModelConfig, spec: TensorConfig, shape: tuple[int, ...], batch: int
) -> None:
    dims = spec.reshape if spec.reshape is not None else spec.dims
    expected = ((batch,) if config.batching else ()) + dims
    if len(shape) != len(expected) or any(
        e not in (-1, g) for e, g in zip(expected, shape, strict=True)
    ):
        raise InternalError(
            f"model '{config.name}' returned output '{spec.name}' with shape {list(shape)}, "
            f"expected {list(expected)}"
        )
