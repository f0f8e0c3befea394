"""Turns what a backend returned for one request into the config's output tensors.

A result is outputs or the request's own error. Outputs are checked (every requested output present,
shape) and cast to the declared datatype within its kind; anything else is the model's bug and
becomes an internal error naming the model and the output.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ExecuteResult, ModelRequest
from infermux.errors import InfermuxError, InternalError
from infermux.model_config import ModelConfig, TensorConfig
from infermux.types import Tensor, numpy_dtype


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
        if spec.reshape is not None:
            array = _as_declared(config, spec, array)
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


def _as_declared(
    config: ModelConfig, spec: TensorConfig, array: npt.NDArray[np.generic]
) -> npt.NDArray[np.generic]:
    """An output with ``reshape`` comes from the model in the reshape's shape and goes to the
    client in ``dims`` (Triton: densenet_onnx's [1000, 1, 1] is served as [1000])."""
    lead = array.shape[:1] if config.batching else ()
    dims = spec.dims
    if -1 in dims:
        if dims.count(-1) > 1:  # more than one unknown: numpy cannot tell them apart
            return array
        known = int(np.prod([d for d in dims if d != -1]))
        rest = int(np.prod(array.shape[len(lead) :]))
        if known == 0 or rest % known:
            return array
    return array.reshape(lead + dims)


def _check_output_shape(
    config: ModelConfig, spec: TensorConfig, shape: tuple[int, ...], batch: int
) -> None:
    dims = spec.reshape if spec.reshape is not None else spec.dims
    expected = ((batch,) if config.batching else ()) + dims
    if shape == expected:  # the common case, without the per-dimension scan
        return
    if len(shape) != len(expected) or any(
        e not in (-1, g) for e, g in zip(expected, shape, strict=True)
    ):
        raise InternalError(
            f"model '{config.name}' returned output '{spec.name}' with shape {list(shape)}, "
            f"expected {list(expected)}"
        )
