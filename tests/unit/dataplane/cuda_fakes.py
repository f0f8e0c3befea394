"""A model that reads CUDA shared memory in place, for tests without a GPU: its backend says it
accepts device inputs (as PyTorch's does) and reads their parts through the stand-in CUDA of
``test_cuda_shared_memory.py`` (host byte arrays playing device memory). It answers
``OUTPUT0 = INPUT0 + 1`` and records every batch it was given."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest, parts_of
from tests.unit.dataplane.test_cuda_shared_memory import FakeIpc

NAME = "reads_gpu"


def write_plus_one(repo: Path, name: str = "plus_one", backend: str = NAME) -> None:
    """A batching model ``OUTPUT0 = INPUT0 + 1`` (FP32, rows of 4) served by ``backend``."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nbackend: "{backend}"\nmax_batch_size: 16\n'
        'input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        "dynamic_batching { }\n"
    )


class PlusOneInstance:
    def __init__(
        self, ipc: FakeIpc, batches: list[list[ModelRequest]], writes_outputs: bool = False
    ) -> None:
        self._ipc = ipc
        self._batches = batches
        self._writes_outputs = writes_outputs

    def _rows(self, request: ModelRequest) -> npt.NDArray[np.float32]:
        if "INPUT0" in request.inputs:
            return np.asarray(request.inputs["INPUT0"], np.float32)
        arrays = []
        for part in parts_of(request.device_inputs["INPUT0"]):
            target = np.empty(part.nbytes // 4, np.float32)  # the stand-in copies flat
            self._ipc.to_host(part.pointer, target, part.device_id)
            arrays.append(target.reshape(part.shape))
        return np.concatenate(arrays)

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        self._batches.append(list(requests))
        results: list[ExecuteResult] = []
        for request in requests:
            output = self._rows(request) + 1.0
            destination = request.device_outputs.get("OUTPUT0")
            if self._writes_outputs and destination is not None:
                start = 0  # as the GPU path does: each part its rows, "device to device"
                for part in destination.parts:
                    rows = output[start : start + part.shape[0]]
                    self._ipc.from_host(part.pointer, rows.tobytes(), part.device_id)
                    start += part.shape[0]
                request.outputs_on_device.add("OUTPUT0")
            results.append({"OUTPUT0": output})
        return results

    def close(self) -> None:
        pass


class PlusOneBackend:
    """``on_device``: reads CUDA inputs in place (as PyTorch), else is given host copies (as
    ONNX Runtime)."""

    name = NAME
    stacks_inputs = True

    def __init__(self, ipc: FakeIpc, on_device: bool = True, writes_outputs: bool = False) -> None:
        self.ipc = ipc
        self.accepts_device_inputs = on_device
        self.writes_outputs = writes_outputs
        """Writes the outputs a request wants in GPU memory there itself (as PyTorch's graphs)."""
        self.batches: list[list[ModelRequest]] = []

    def load(self, context: ModelContext) -> PlusOneInstance:
        return PlusOneInstance(self.ipc, self.batches, self.writes_outputs)
