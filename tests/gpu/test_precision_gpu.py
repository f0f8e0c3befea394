"""fp16 and bf16 on the GPU, with CUDA graphs: the casts are captured with the model, answers stay
within the guard's tolerance of fp32, the weights take half the memory, and the shared-weights
cache keeps one copy per precision."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from infermux.errors import ModelLoadError
from infermux.runtime import WEIGHTS
from tests.gpu.torch_models import WIDTH, Wide, close, load, rows, run, write
from tests.support import parameter

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GRAPHS = "optimization { cuda { graphs: true } }\n"


def weights(instance: object) -> int:
    uses = instance.memory_usage()  # type: ignore[attr-defined]
    return sum(u.byte_size for u in uses if u.component == "weights")


@pytest.mark.parametrize(
    ("precision", "dtype"), [("fp16", torch.float16), ("bf16", torch.bfloat16)]
)
def test_half_precision_runs_in_captured_graphs_within_tolerance(
    tmp_path: Path, precision: str, dtype: torch.dtype
) -> None:
    settings = parameter("precision", precision) + parameter("calibration_data", "cal.npz")
    (exact,) = load(write(tmp_path / "fp32", Wide(), GRAPHS), "cuda:0", 1)
    model_dir = write(tmp_path / precision, Wide(), GRAPHS + settings)
    np.savez(model_dir / "cal.npz", INPUT__0=rows(32, seed=5))  # inside the model directory
    (reduced,) = load(model_dir, "cuda:0", 1)
    try:
        gpu = reduced.gpu
        assert gpu is not None
        assert gpu.graphs is not None, gpu.graph_error
        assert gpu.graphs.batch_sizes == [1, 2, 3, 4, 6, 8]
        model = reduced._model
        assert model is not None
        assert model.dtype is dtype
        report = reduced.precision_report
        assert report.accuracy is not None
        assert report.accuracy.source == "cal.npz"
        tolerance = {"fp16": 0.01, "bf16": 0.05}[precision]
        assert report.accuracy.outputs["OUTPUT__0"].relative_error < tolerance
        for n in range(1, 9):
            x = rows(n, seed=n)
            got, expected = run(reduced, x), run(exact, x)
            assert got.dtype == np.float32  # the config's datatype, cast back inside the graph
            error = np.linalg.norm(got - expected) / np.linalg.norm(expected)
            assert 0 < error < tolerance, (n, error)
        assert gpu.replays == 8  # every batch replayed a graph, casts included
        # Half the bytes per weight: the weights row halves (Wide holds 64 MiB in fp32).
        assert weights(reduced) == weights(exact) // 2
    finally:
        close([exact, reduced])


def test_instances_share_one_half_precision_copy_apart_from_fp32(tmp_path: Path) -> None:
    model_dir = write(tmp_path / "m", Wide(), parameter("precision", "bf16"))
    instances = load(model_dir, "cuda:0", 2)
    try:
        keys = [k for k in WEIGHTS.held() if str(model_dir) in k[0]]
        assert len(keys) == 1
        assert keys[0][0].endswith("[bf16]")
        assert WEIGHTS.users(keys[0]) == 2
        x = rows(4, seed=1)
        np.testing.assert_array_equal(run(instances[0], x), run(instances[1], x))
    finally:
        close(instances)
    assert not [k for k in WEIGHTS.held() if str(model_dir) in k[0]]


def test_the_guard_runs_on_the_gpu_and_refuses_an_fp16_overflow(tmp_path: Path) -> None:
    class Loud(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x * 1e6

    with pytest.raises(ModelLoadError, match="relative error of inf"):
        load(write(tmp_path / "m", Loud(), parameter("precision", "fp16")), "cuda:0", 1)
    assert not [k for k in WEIGHTS.held() if str(tmp_path) in k[0]]  # nothing leaked


def test_int8_is_refused_on_a_gpu_instance(tmp_path: Path) -> None:
    settings = parameter("precision", "int8") + parameter("calibration_data", "cal.npz")
    model_dir = write(tmp_path / "m", Wide(), settings)
    np.savez(model_dir / "cal.npz", INPUT__0=np.zeros((2, WIDTH), np.float32))
    with pytest.raises(ModelLoadError, match="int8 kernels run on the CPU only"):
        load(model_dir, "cuda:0", 1)
