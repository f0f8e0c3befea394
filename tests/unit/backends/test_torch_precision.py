"""The PyTorch backend at reduced precision on the CPU: fp16/bf16 casts at load, int8 through
torch.ao (calibrated, cached), and what is refused. GPU runs with CUDA graphs: tests/gpu."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.calibration_cache import BUILDS
from infermux.backends.precision import PrecisionSettings
from infermux.backends.torch_model import load as load_model
from infermux.errors import ModelLoadError
from infermux.repository import load_model_config
from tests.support import parameter
from tests.unit.backends.test_pytorch import (
    execute,
    load,
    quiet,
    script,
    write_torch_model,
)

INPUTS = [("INPUT__0", "FP32", "[ 3, 8, 8 ]")]
OUTPUTS = [("OUTPUT__0", "FP32", "[ 10 ]")]


class Net(torch.nn.Module):
    """A convolution and a linear layer: what torch.ao quantises."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.conv = torch.nn.Conv2d(3, 8, 3)
        self.fc = torch.nn.Linear(8 * 6 * 6, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.fc(torch.relu(self.conv(x)).flatten(1))
        return out


def images(count: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((count, 3, 8, 8)).astype(np.float32)


def write(tmp_path: Path, precision: str, extra: str = "", calibrate: bool = True) -> Path:
    settings = parameter("precision", precision) + extra
    if calibrate:
        settings += parameter("calibration_data", "cal.npz")
    model_dir = write_torch_model(
        tmp_path, script(Net().eval()), inputs=INPUTS, outputs=OUTPUTS, extra=settings
    )
    np.savez(model_dir / "cal.npz", INPUT__0=images(32))
    return model_dir


def fp32(x: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    with torch.inference_mode():
        out: npt.NDArray[Any] = Net().eval()(torch.from_numpy(x)).numpy()
        return out


def relative_error(got: npt.NDArray[Any], expected: npt.NDArray[Any]) -> float:
    return float(np.linalg.norm(got - expected) / np.linalg.norm(expected))


@pytest.mark.parametrize(
    ("precision", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)]
)
def test_half_precisions_cast_the_weights_and_keep_fp32_at_the_boundary(
    tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    instance = load(write(tmp_path, precision))
    model = instance._model
    assert model is not None
    assert model.dtype is dtype
    weights = {p.dtype for p in model.module.parameters()}  # type: ignore[attr-defined]
    assert weights == {dtype}
    report = instance.precision_report
    assert report.precision.value == precision
    assert report.cache == ""  # a cast needs no cache
    assert report.accuracy is not None
    assert report.accuracy.source == "cal.npz"
    assert report.accuracy.outputs["OUTPUT__0"].relative_error < 0.02
    x = images(5, seed=3)
    (result,) = execute(instance, {"INPUT__0": x})
    got = result["OUTPUT__0"]
    assert got.dtype == np.float32
    error = relative_error(got, fp32(x))
    assert 0 < error < 0.02  # close, and not the fp32 weights


def test_half_precision_end_to_end_with_fp16_inputs_and_outputs(tmp_path: Path) -> None:
    model_dir = write_torch_model(
        tmp_path,
        script(Net().eval()),
        inputs=[("INPUT__0", "FP16", "[ 3, 8, 8 ]")],
        outputs=[("OUTPUT__0", "FP16", "[ 10 ]")],
        extra=parameter("precision", "fp16") + parameter("calibration_data", "cal.npz"),
    )
    np.savez(model_dir / "cal.npz", INPUT__0=images(16))  # float32 rows, converted on load
    instance = load(model_dir)
    report = instance.precision_report
    assert report.accuracy is not None  # the reference ran the file's fp32 weights
    assert report.accuracy.outputs["OUTPUT__0"].relative_error < 0.01
    x = images(2, seed=6)
    (result,) = execute(instance, {"INPUT__0": x.astype(np.float16)})
    assert result["OUTPUT__0"].dtype == np.float16
    assert relative_error(result["OUTPUT__0"].astype(np.float32), fp32(x)) < 0.01


def test_half_precision_without_calibration_data_is_guarded_on_random_rows(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="infermux.backends.torch_model"):
        report = load(write(tmp_path, "bf16", calibrate=False)).precision_report
    assert "bf16 on a CPU instance usually runs slower than fp32" in caplog.text
    assert report.accuracy is not None
    assert (report.accuracy.source, report.accuracy.rows) == ("random", 8)


def test_the_guard_refuses_a_model_that_overflows_in_fp16(tmp_path: Path) -> None:
    class Huge(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1e6  # beyond fp16's 65504

    model_dir = write_torch_model(
        tmp_path,
        script(Huge()),
        inputs=[("INPUT__0", "FP32", "[ 4 ]")],
        outputs=[("OUTPUT__0", "FP32", "[ 4 ]")],
        extra=parameter("precision", "fp16"),
    )
    with pytest.raises(ModelLoadError, match=r"relative error of inf, over the accuracy_tolerance"):
        load(model_dir)


def test_integer_inputs_are_not_cast(tmp_path: Path) -> None:
    class Embed(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            torch.manual_seed(0)
            self.table = torch.nn.Embedding(16, 4)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            out: torch.Tensor = self.table(ids).sum(1)
            return out

    model_dir = write_torch_model(
        tmp_path,
        script(Embed().eval()),
        inputs=[("INPUT__0", "INT64", "[ 3 ]")],
        outputs=[("OUTPUT__0", "FP32", "[ 4 ]")],
        extra=parameter("precision", "bf16") + parameter("accuracy_action", "warn"),
    )
    instance = load(model_dir)
    ids = np.array([[1, 2, 3]], np.int64)
    (result,) = execute(instance, {"INPUT__0": ids})
    with torch.inference_mode():
        expected = Embed().eval()(torch.from_numpy(ids)).numpy()
    np.testing.assert_allclose(result["OUTPUT__0"], expected, rtol=0.02, atol=0.02)


def test_int8_quantises_calibrates_once_and_reloads_from_the_cache(tmp_path: Path) -> None:
    model_dir = write(tmp_path, "int8")
    before = BUILDS["pytorch-int8"]
    first = load(model_dir)
    assert BUILDS["pytorch-int8"] == before + 1
    report = first.precision_report
    assert (report.precision.value, report.cache) == ("int8", "miss")
    assert report.accuracy is not None
    assert report.accuracy.outputs["OUTPUT__0"].relative_error < 0.15
    model = first._model
    assert model is not None
    graph = str(model.module.graph)  # type: ignore[attr-defined]
    assert "quantized::conv2d" in graph
    assert "quantized::linear" in graph
    x = images(4, seed=9)
    (result,) = execute(first, {"INPUT__0": x})
    assert result["OUTPUT__0"].dtype == np.float32
    assert 0 < relative_error(result["OUTPUT__0"], fp32(x)) < 0.15

    second = load(model_dir)
    assert BUILDS["pytorch-int8"] == before + 1
    assert second.precision_report.cache == "hit"
    (again,) = execute(second, {"INPUT__0": x})
    np.testing.assert_array_equal(again["OUTPUT__0"], result["OUTPUT__0"])


def test_int8_on_a_gpu_instance_is_refused_before_touching_the_device(tmp_path: Path) -> None:
    model_dir = write(tmp_path, "int8")
    context = load_context(model_dir)
    with pytest.raises(ModelLoadError, match="int8 kernels run on the CPU only"):
        load_model(
            context,
            PrecisionSettings.of(context),
            str(model_dir / "1" / "model.pt"),
            torch.device("cuda", 0),
            lambda path, device: None,  # type: ignore[arg-type, return-value]
            exported=False,
        )


def load_context(model_dir: Path) -> ModelContext:
    return ModelContext(load_model_config(model_dir), 1, model_dir, model_dir / "1", "m_0")


def write_exported(tmp_path: Path, settings: str) -> Path:
    """``Net`` as a ``torch.export`` program (dynamic batch) with the given parameters."""
    batch = torch.export.Dim("batch", min=1, max=8)
    example = (torch.from_numpy(images(2)),)
    with quiet():
        program = torch.export.export(Net().eval(), example, dynamic_shapes={"x": {0: batch}})
    return write_torch_model(
        tmp_path, program, platform="torch_export", inputs=INPUTS, outputs=OUTPUTS, extra=settings
    )


def test_int8_of_an_exported_program_is_refused_naming_the_alternatives(tmp_path: Path) -> None:
    settings = parameter("precision", "int8") + parameter("calibration_data", "cal.npz")
    model_dir = write_exported(tmp_path, settings)
    np.savez(model_dir / "cal.npz", INPUT__0=images(4))
    with pytest.raises(ModelLoadError, match=r"torch\.export programs needs torchao"):
        load(model_dir)


def test_an_exported_program_runs_in_bf16(tmp_path: Path) -> None:
    model_dir = write_exported(tmp_path, parameter("precision", "bf16"))
    instance = load(model_dir)
    x = images(3, seed=4)
    results = instance.execute([ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))])
    assert isinstance(results[0], dict), results
    assert relative_error(np.asarray(results[0]["OUTPUT__0"]), fp32(x)) < 0.05
