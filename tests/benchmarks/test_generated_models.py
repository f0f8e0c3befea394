"""The benchmark model generator's repositories are served unchanged (tiny variants, in-process).

On CPU this runs in CI with BERT (transformers); ResNet needs torchvision. The GPU variant serves
the TorchScript models on cuda:0 and compares with the same module run directly in torch.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from infermux.backends import BackendRegistry, ModelRequest
from infermux.repository import ModelRepository

torch = pytest.importorskip("torch")
pytest.importorskip("onnxruntime")
GENERATOR = Path(__file__).parents[2] / "benchmarks" / "models" / "generate.py"


def generate(out: Path, models: str, device: str) -> None:
    subprocess.run(
        [
            sys.executable,
            str(GENERATOR),
            str(out),
            "--models",
            models,
            "--tiny",
            "--device",
            device,
        ],
        check=True,
        capture_output=True,
        timeout=600,
    )


async def serve_once(repo: Path, name: str, inputs: dict[str, Any]) -> Any:
    repository = ModelRepository([repo], BackendRegistry())
    await repository.start()
    try:
        model = repository.get(name)
        done = await model.scheduler.submit(ModelRequest(inputs, (model.config.outputs[0].name,)))
        return done.outputs[0].data
    finally:
        await repository.close()


def bert_inputs(names: tuple[str, str]) -> dict[str, Any]:
    rng = np.random.default_rng(0)
    ids = rng.integers(0, 1000, (3, 128)).astype(np.int64)
    return {names[0]: ids, names[1]: np.ones((3, 128), np.int64)}


@pytest.mark.skipif(importlib.util.find_spec("transformers") is None, reason="needs transformers")
async def test_bert_torchscript_and_onnx_agree(tmp_path: Path) -> None:
    generate(tmp_path, "bert_base", "cpu")
    inputs = bert_inputs(("INPUT__0", "INPUT__1"))
    torchscript = await serve_once(tmp_path, "bert_base_torchscript", inputs)
    onnx = await serve_once(tmp_path, "bert_base_onnx", inputs)
    assert torchscript.shape == (3, 64)
    np.testing.assert_allclose(torchscript, onnx, rtol=1e-4, atol=1e-5)
    module = torch.jit.load(str(tmp_path / "bert_base_torchscript" / "1" / "model.pt"))
    with torch.no_grad():
        expected = module(*(torch.from_numpy(v) for v in inputs.values())).numpy()
    np.testing.assert_allclose(torchscript, expected, rtol=1e-5, atol=1e-6)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.skipif(importlib.util.find_spec("torchvision") is None, reason="needs torchvision")
async def test_resnet_and_bert_on_gpu_match_cpu(tmp_path: Path) -> None:
    generate(tmp_path, "resnet50,bert_base", "gpu")
    image = np.random.default_rng(1).standard_normal((4, 3, 64, 64)).astype(np.float32)
    cases = [
        ("resnet50_torchscript", {"INPUT__0": image}),
        ("bert_base_torchscript", bert_inputs(("INPUT__0", "INPUT__1"))),
    ]
    for name, inputs in cases:
        served = await serve_once(tmp_path, name, inputs)
        module = torch.jit.load(str(tmp_path / name / "1" / "model.pt"), map_location="cuda:0")
        with torch.no_grad():
            direct = module(*(torch.from_numpy(v).cuda() for v in inputs.values())).cpu().numpy()
        np.testing.assert_allclose(served, direct, rtol=1e-4, atol=1e-4)
