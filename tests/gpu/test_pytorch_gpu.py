"""PyTorch models on a CUDA device give the answers they give on the CPU."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
import torch

from infermux.backends import BackendRegistry, ModelContext, ModelRequest
from infermux.backends.pytorch import PyTorchBackend, PyTorchInstance
from infermux.errors import ModelLoadError
from infermux.repository import ModelRepository, load_model_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(16, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


def write(
    repo: Path,
    name: str,
    model: torch.nn.Module,
    *,
    datatype: str = "FP32",
    platform: str = "pytorch_libtorch",
    kind: str = "KIND_GPU",
) -> Path:
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    dims = "[ 16 ]"
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT__0", data_type: TYPE_{datatype}, dims: {dims} }} ]\n'
        f'output [ {{ name: "OUTPUT__0", data_type: TYPE_{datatype}, dims: [ -1 ] }} ]\n'
        f"instance_group [ {{ kind: {kind}, count: 1 }} ]\n"
        "dynamic_batching { }\n"
    )
    if platform == "torch_export":
        batch = torch.export.Dim("batch", min=1, max=8)
        program = torch.export.export(
            model, (torch.zeros(2, 16),), dynamic_shapes={"x": {0: batch}}
        )
        torch.export.save(program, str(model_dir / "1" / "model.pt2"))
    else:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated
            scripted: torch.jit.ScriptModule = torch.jit.script(model)
            scripted.save(str(model_dir / "1" / "model.pt"))
    return model_dir


def load(model_dir: Path, device: str) -> PyTorchInstance:
    config = load_model_config(model_dir)
    context = ModelContext(config, 1, model_dir, model_dir / "1", f"m_{device}", device)
    return PyTorchBackend().load(context)


def run(instance: PyTorchInstance, *batches: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
    results = instance.execute([ModelRequest({"INPUT__0": x}, ("OUTPUT__0",)) for x in batches])
    arrays = []
    for result in results:
        assert not isinstance(result, Exception), result
        arrays.append(np.asarray(result["OUTPUT__0"]))
    return arrays


def rows(n: int, seed: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, 16)).astype(np.float32)


@pytest.mark.parametrize("platform", ["pytorch_libtorch", "torch_export"])
def test_cuda_instance_matches_cpu(tmp_path: Path, platform: str) -> None:
    model_dir = write(tmp_path, "m", Linear().eval(), platform=platform)
    cpu, gpu = load(model_dir, "cpu"), load(model_dir, "cuda:0")
    xs = [rows(1, 1), rows(3, 2), rows(4, 3)]  # 8 rows: max_batch_size, the export's limit
    # Read-only inputs, as decoded from a request body, reach the GPU without a warning.
    frozen = [np.frombuffer(x.tobytes(), np.float32).reshape(x.shape) for x in xs]
    for on_cpu, on_gpu in zip(run(cpu, *xs), run(gpu, *frozen), strict=True):
        assert isinstance(on_gpu, np.ndarray)
        np.testing.assert_allclose(on_gpu, on_cpu, rtol=1e-4, atol=1e-5)
    gpu.close()
    cpu.close()


@pytest.mark.parametrize(
    ("datatype", "dtype"), [("FP16", np.float16), ("BF16", ml_dtypes.bfloat16)]
)
def test_half_precision_on_cuda(tmp_path: Path, datatype: str, dtype: Any) -> None:
    model_dir = write(tmp_path, "m", Double(), datatype=datatype)
    x = rows(2, 4).astype(dtype)
    (result,) = run(load(model_dir, "cuda:0"), x)
    assert result.dtype == x.dtype
    np.testing.assert_array_equal(result, (x.astype(np.float32) * 2).astype(dtype))


def test_a_gpu_that_does_not_exist_is_a_load_error(tmp_path: Path) -> None:
    model_dir = write(tmp_path, "m", Linear().eval())
    missing = f"cuda:{torch.cuda.device_count()}"
    with pytest.raises(ModelLoadError, match=rf"needs {missing}, but torch sees \d+ CUDA"):
        load(model_dir, missing)


async def test_kind_gpu_instance_group_serves_like_kind_cpu(tmp_path: Path) -> None:
    module = Linear().eval()
    write(tmp_path, "on_gpu", module, kind="KIND_GPU")
    write(tmp_path, "on_cpu", module, kind="KIND_CPU")
    repository = ModelRepository([tmp_path], BackendRegistry())
    await repository.start()
    try:
        assert repository.all_ready(), repository.index()
        x = rows(4, 5)
        answers: list[npt.NDArray[Any]] = []
        for name in ("on_gpu", "on_cpu"):
            request = ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))
            done = await repository.get(name).scheduler.submit(request)
            answers.append(np.asarray(done.outputs[0].data, np.float32))
        np.testing.assert_allclose(answers[0], answers[1], rtol=1e-4, atol=1e-5)
    finally:
        await repository.close()
