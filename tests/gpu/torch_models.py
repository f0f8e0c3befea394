"""Torch models and helpers shared by the GPU tests: write a TorchScript model repository, load
PyTorch instances on a device, run batches through them."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import torch

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.pytorch import PyTorchBackend, PyTorchInstance
from infermux.repository import load_model_config

WIDTH = 16


class Wide(torch.nn.Module):
    """64 MiB of weights: large enough that a second copy would show."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(WIDTH, 4096)
        self.square = torch.nn.Linear(4096, 4096)
        self.down = torch.nn.Linear(4096, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.square(torch.relu(self.up(x)))) / 64)
        return out


def write(
    repo: Path, model: torch.nn.Module, parameters: str = "", *, output_dims: str = "-1"
) -> Path:
    """``output_dims``: the output's dims in the config (``Wide`` answers 8 per row)."""
    model_dir = repo / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        'name: "m"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ {WIDTH} ] }} ]\n'
        f'output [ {{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ {output_dims} ] }} ]\n'
        "instance_group [ { kind: KIND_GPU, count: 1 } ]\n" + parameters
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated
        scripted: torch.jit.ScriptModule = torch.jit.script(model.eval())
        scripted.save(str(model_dir / "1" / "model.pt"))
    return model_dir


def load(model_dir: Path, device: str, count: int) -> list[PyTorchInstance]:
    config = load_model_config(model_dir)
    backend = PyTorchBackend()
    return [
        backend.load(ModelContext(config, 1, model_dir, model_dir / "1", f"m_{i}", device))
        for i in range(count)
    ]


def run(instance: PyTorchInstance, x: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    (result,) = instance.execute([ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))])
    assert not isinstance(result, Exception), result
    return np.asarray(result["OUTPUT__0"])


def rows(n: int, seed: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


def close(instances: list[PyTorchInstance]) -> None:
    for instance in instances:
        instance.close()
