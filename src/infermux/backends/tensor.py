"""The shared shape of backends that run one kernel over a stacked batch (PyTorch, ONNX Runtime,
TensorRT): stack the requests' inputs, run once, split the outputs back per request.
"""

from __future__ import annotations

import abc
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest
from infermux.backends.stacking import device_parts, split, stack
from infermux.errors import InfermuxError, InternalError, ModelLoadError
from infermux.model_config import ModelConfig
from infermux.types import DeviceArray

Arrays = dict[str, npt.NDArray[np.generic]]


class StackedInstance(abc.ABC):
    """A :class:`~infermux.backends.base.BackendInstance` that batches by stacking.

    The scheduler only puts shape-compatible requests in one batch (the backend sets
    ``stacks_inputs = True``), so every input can be concatenated along the batch dimension.
    Subclasses implement :meth:`run` for one stacked batch, returning every output they compute.
    """

    def __init__(self, context: ModelContext) -> None:
        self.context = context
        self.config: ModelConfig = context.config

    @abc.abstractmethod
    def run(self, inputs: Mapping[str, npt.NDArray[np.generic]]) -> Mapping[str, npt.ArrayLike]:
        """Run the model on one stacked batch; return outputs by config name."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release the instance (free device memory, sessions, contexts)."""

    def run_batch(
        self,
        inputs: Mapping[str, npt.NDArray[np.generic]],
        device: Mapping[str, Sequence[DeviceArray]],
    ) -> Mapping[str, npt.ArrayLike]:
        """Run one batch whose ``device`` inputs are still per request in GPU memory; only
        backends with ``accepts_device_inputs`` receive any and override this."""
        if device:
            raise InternalError(
                f"model '{self.config.name}': its backend cannot read inputs in GPU memory"
            )
        return self.run(inputs)

    def stack_target(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> npt.NDArray[Any] | None:
        """Where to stack input ``name`` of a batch (see :data:`~.stacking.StackTarget`);
        None: a new array. Backends that copy the batch again (to a device) override it."""
        return None

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        try:
            outputs = self.run_batch(stack(requests, self.stack_target), device_parts(requests))
        except InfermuxError as exc:
            return [exc] * len(requests)
        return self.results(outputs, requests)

    def results(
        self, outputs: Mapping[str, npt.ArrayLike], requests: Sequence[ModelRequest]
    ) -> Sequence[ExecuteResult]:
        """One batch's stacked outputs cut back into one result per request."""
        arrays = {name: np.asarray(value) for name, value in outputs.items()}
        if not self.config.batching:
            return [arrays] * len(requests)
        try:
            return list(split(arrays, [r.batch_size for r in requests]))
        except InfermuxError as exc:
            error = InternalError(f"model '{self.config.name}': {exc}")
            return [error] * len(requests)


def require_no_bytes(config: ModelConfig, backend: str) -> None:
    """Refuse BYTES tensors at load time for backends that have no string tensors."""
    for tensor in (*config.inputs, *config.outputs):
        if tensor.datatype == "BYTES":
            raise ModelLoadError(
                f"model '{config.name}': {backend} has no string tensors, but '{tensor.name}' is "
                "TYPE_STRING; use a Python model for text"
            )
