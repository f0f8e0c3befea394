from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
import torch

from infermux.backends import BackendRegistry, ExecuteResult, ModelContext, ModelRequest
from infermux.backends.pytorch import PyTorchBackend, PyTorchInstance
from infermux.errors import InternalError, InvalidArgumentError, ModelLoadError
from infermux.repository import load_model_config
from tests.support import config_type, parameter

Tensors = Sequence[tuple[str, str, str]]  # (name, datatype, dims)


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


class TwoInTwoOut(torch.nn.Module):
    def forward(self, a: torch.Tensor, b: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return a - b, a * 2 + b


class Named(torch.nn.Module):
    def forward(self, x: torch.Tensor, y: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"diff": x - y, "scaled": x * 10}


class Picky(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if bool(x.sum() > 100.0):
            raise RuntimeError("input too large")
        return x * 2


class Double(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * 2


class AddOne(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class Not(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.logical_not(x)


class Clone(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x.clone()


@contextmanager
def quiet() -> Iterator[None]:
    # torch.jit.script/trace/save warn that TorchScript is deprecated (PyTorch 2.10+); making
    # TorchScript files is the point of these tests.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        yield


def script(module: torch.nn.Module) -> torch.jit.ScriptModule:
    with quiet():
        scripted: torch.jit.ScriptModule = torch.jit.script(module)
    return scripted


FP32_IO: Tensors = [("INPUT__0", "FP32", "[ 4 ]")]
FP32_OUT: Tensors = [("OUTPUT__0", "FP32", "[ 3 ]")]


def write_torch_model(
    repo: Path,
    model: torch.jit.ScriptModule | torch.export.ExportedProgram | bytes | None,
    *,
    name: str = "m",
    platform: str = "pytorch_libtorch",
    inputs: Tensors = FP32_IO,
    outputs: Tensors = FP32_OUT,
    max_batch_size: int = 8,
    extra: str = "",
    filename: str = "",
) -> Path:
    """A model directory with ``config.pbtxt`` and ``1/<model file>``."""

    def tensors(items: Tensors) -> str:
        return ", ".join(
            f'{{ name: "{n}", data_type: {config_type(d)}, dims: {dims} }}' for n, d, dims in items
        )

    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True)
    default = "model.pt2" if platform == "torch_export" else "model.pt"
    (model_dir / "config.pbtxt").write_text(
        f'name: "{name}"\nplatform: "{platform}"\nmax_batch_size: {max_batch_size}\n'
        f"input [ {tensors(inputs)} ]\noutput [ {tensors(outputs)} ]\n"
        + (f'default_model_filename: "{filename}"\n' if filename else "")
        + extra
    )
    path = model_dir / "1" / (filename or default)
    if isinstance(model, bytes):
        path.write_bytes(model)
    elif isinstance(model, torch.export.ExportedProgram):
        torch.export.save(model, str(path))
    elif model is not None:
        with quiet():
            model.save(str(path))
    return model_dir


def load(model_dir: Path, device: str = "cpu") -> PyTorchInstance:
    config = load_model_config(model_dir)
    return PyTorchBackend().load(ModelContext(config, 1, model_dir, model_dir / "1", "m_0", device))


def execute(
    instance: PyTorchInstance, *batches: dict[str, npt.NDArray[Any]]
) -> list[dict[str, npt.NDArray[Any]]]:
    """Run one execute() over several requests; every result must be outputs."""
    names = tuple(t.name for t in instance.config.outputs)
    results = instance.execute([ModelRequest(inputs, names) for inputs in batches])
    assert len(results) == len(batches)
    arrays = []
    for result in results:
        assert not isinstance(result, Exception), result
        arrays.append({k: np.asarray(v) for k, v in result.items()})
    return arrays


def reference(module: Callable[..., Any], *arrays: npt.NDArray[Any]) -> Any:
    with torch.inference_mode():
        return module(*(torch.from_numpy(a.copy()) for a in arrays))


def rows(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


def read_only(array: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """Like an input decoded from a request body: a read-only view of bytes."""
    return np.frombuffer(array.tobytes(), array.dtype).reshape(array.shape)


def test_torchscript_matches_torch(tmp_path: Path) -> None:
    module = Linear().eval()
    instance = load(write_torch_model(tmp_path, script(module)))
    x = rows(2)
    (result,) = execute(instance, {"INPUT__0": read_only(x)})
    np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)
    assert result["OUTPUT__0"].dtype == np.float32
    instance.close()


def test_traced_model_and_default_model_filename(tmp_path: Path) -> None:
    module = Linear().eval()
    with quiet():
        trace: Callable[..., torch.jit.ScriptModule] = torch.jit.trace  # has no annotations
        traced = trace(module, torch.zeros(1, 4))
    instance = load(write_torch_model(tmp_path, traced, filename="linear.pt"))
    x = rows(5)
    (result,) = execute(instance, {"INPUT__0": x})
    np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)


def test_a_batch_is_stacked_and_each_request_gets_its_own_rows(tmp_path: Path) -> None:
    module = Linear().eval()
    calls: list[int] = []
    instance = load(write_torch_model(tmp_path, script(module)))
    model = instance._model
    assert model is not None
    forward = model.module

    def counting(x: torch.Tensor) -> Any:
        calls.append(int(x.shape[0]))
        return forward(x)

    model.module = counting
    xs = [rows(1, 1), rows(3, 2), rows(2, 3)]
    results = execute(instance, *({"INPUT__0": read_only(x)} for x in xs))
    assert calls == [6]  # one forward over the stacked batch
    for x, result in zip(xs, results, strict=True):
        assert result["OUTPUT__0"].shape == (len(x), 3)
        np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)


def test_indexed_names_pass_arguments_and_pick_results_by_index(tmp_path: Path) -> None:
    # Listed out of order on purpose: __<index>, not the config order, decides.
    instance = load(
        write_torch_model(
            tmp_path,
            script(TwoInTwoOut()),
            inputs=[("INPUT__1", "FP32", "[ 4 ]"), ("INPUT__0", "FP32", "[ 4 ]")],
            outputs=[("OUTPUT__1", "FP32", "[ 4 ]"), ("OUTPUT__0", "FP32", "[ 4 ]")],
        )
    )
    a, b = rows(2, 1), rows(2, 2)
    (result,) = execute(instance, {"INPUT__0": a, "INPUT__1": b})
    np.testing.assert_allclose(result["OUTPUT__0"], a - b)
    np.testing.assert_allclose(result["OUTPUT__1"], a * 2 + b)


def test_other_names_go_in_config_order(tmp_path: Path) -> None:
    instance = load(
        write_torch_model(
            tmp_path,
            script(TwoInTwoOut()),
            inputs=[("a", "FP32", "[ 4 ]"), ("b", "FP32", "[ 4 ]")],
            outputs=[("difference", "FP32", "[ 4 ]"), ("mix", "FP32", "[ 4 ]")],
        )
    )
    a, b = rows(1, 1), rows(1, 2)
    (result,) = execute(instance, {"b": b, "a": a})
    np.testing.assert_allclose(result["difference"], a - b)
    np.testing.assert_allclose(result["mix"], a * 2 + b)


def test_input_by_name_passes_keywords_and_a_dict_maps_outputs_by_name(tmp_path: Path) -> None:
    instance = load(
        write_torch_model(
            tmp_path,
            script(Named()),
            inputs=[("y", "FP32", "[ 4 ]"), ("x", "FP32", "[ 4 ]")],  # not forward's order
            outputs=[("scaled", "FP32", "[ 4 ]"), ("diff", "FP32", "[ 4 ]")],
            extra=parameter("INPUT_BY_NAME", "true"),
        )
    )
    x, y = rows(2, 1), rows(2, 2)
    (result,) = execute(instance, {"y": y, "x": x})
    np.testing.assert_allclose(result["diff"], x - y)
    np.testing.assert_allclose(result["scaled"], x * 10, rtol=1e-6)


def test_torch_export_program(tmp_path: Path) -> None:
    module = Linear().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    instance = load(write_torch_model(tmp_path, program, platform="torch_export"))
    assert (tmp_path / "m" / "1" / "model.pt2").is_file()
    xs = [rows(1, 1), rows(4, 2)]
    results = execute(instance, *({"INPUT__0": x} for x in xs))
    for x, result in zip(xs, results, strict=True):
        np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)


@pytest.mark.parametrize(
    ("datatype", "module", "x", "expected"),
    [
        (
            "FP16",
            Double(),
            np.array([[1.5, -2.25]], np.float16),
            np.array([[3.0, -4.5]], np.float16),
        ),
        (
            "BF16",
            Double(),
            np.array([[1.5, -2.25]], ml_dtypes.bfloat16),
            np.array([[3.0, -4.5]], ml_dtypes.bfloat16),
        ),
        ("INT64", AddOne(), np.array([[2**40, -7]], np.int64), np.array([[2**40 + 1, -6]])),
        ("INT8", AddOne(), np.array([[-128, 5]], np.int8), np.array([[-127, 6]], np.int8)),
        ("UINT8", AddOne(), np.array([[0, 254]], np.uint8), np.array([[1, 255]], np.uint8)),
        ("UINT16", Clone(), np.array([[0, 65535]], np.uint16), np.array([[0, 65535]], np.uint16)),
        (
            "UINT64",
            Clone(),
            np.array([[2**63 + 5, 1]], np.uint64),
            np.array([[2**63 + 5, 1]], np.uint64),
        ),
        ("BOOL", Not(), np.array([[True, False]]), np.array([[False, True]])),
    ],
)
def test_datatypes(
    tmp_path: Path,
    datatype: str,
    module: torch.nn.Module,
    x: npt.NDArray[Any],
    expected: npt.NDArray[Any],
) -> None:
    io = [("INPUT__0", datatype, "[ 2 ]")]
    out = [("OUTPUT__0", datatype, "[ 2 ]")]
    instance = load(write_torch_model(tmp_path, script(module), inputs=io, outputs=out))
    (result,) = execute(instance, {"INPUT__0": read_only(x)})
    assert result["OUTPUT__0"].dtype == x.dtype
    np.testing.assert_array_equal(result["OUTPUT__0"], expected.astype(x.dtype))


def test_a_model_without_batching(tmp_path: Path) -> None:
    module = Linear().eval()
    instance = load(write_torch_model(tmp_path, script(module), max_batch_size=0))
    x = rows(1)[0]
    (result,) = execute(instance, {"INPUT__0": x})
    np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)


def test_a_forward_that_raises_fails_that_batch_with_a_clear_error(tmp_path: Path) -> None:
    instance = load(
        write_torch_model(tmp_path, script(Picky()), outputs=[("OUTPUT__0", "FP32", "[ 4 ]")])
    )
    names = ("INPUT__0",)
    big = ModelRequest({"INPUT__0": np.full((1, 4), 50, np.float32)}, names)
    small = ModelRequest({"INPUT__0": np.ones((1, 4), np.float32)}, names)
    results = instance.execute([big, small])
    assert len(results) == 2
    for result in results:
        assert isinstance(result, InternalError)
        assert re.fullmatch(r"model 'm' failed: .*input too large", str(result)), str(result)
        assert "Traceback" not in str(result)
    # The instance keeps serving.
    (ok,) = instance.execute([small])
    assert not isinstance(ok, Exception)


def test_results_that_do_not_fit_the_config_are_internal_errors(tmp_path: Path) -> None:
    two_outputs = [("OUTPUT__0", "FP32", "[ 4 ]"), ("OUTPUT__1", "FP32", "[ 4 ]")]
    instance = load(write_torch_model(tmp_path, script(Double()), outputs=two_outputs))
    request = ModelRequest({"INPUT__0": rows(1)}, ("OUTPUT__0",))
    (result,) = instance.execute([request])
    assert isinstance(result, InternalError)
    assert "returned one Tensor, but the config declares 2 outputs" in str(result)

    far = [("OUTPUT__0", "FP32", "[ 4 ]"), ("OUTPUT__5", "FP32", "[ 4 ]")]
    model_dir = write_torch_model(
        tmp_path,
        script(TwoInTwoOut()),
        name="far",
        outputs=far,
        inputs=[("INPUT__0", "FP32", "[ 4 ]"), ("INPUT__1", "FP32", "[ 4 ]")],
    )
    (result,) = load(model_dir).execute(
        [ModelRequest({"INPUT__0": rows(1), "INPUT__1": rows(1)}, ())]
    )
    assert isinstance(result, InternalError)
    assert "returned 2 values, but output 'OUTPUT__5' is element 5" in str(result)


def test_a_missing_positional_input_is_refused(tmp_path: Path) -> None:
    inputs = [("a", "FP32", "[ 4 ]"), ("b", "FP32", "[ 4 ]")]
    outputs = [("difference", "FP32", "[ 4 ]"), ("mix", "FP32", "[ 4 ]")]
    instance = load(
        write_torch_model(tmp_path, script(TwoInTwoOut()), inputs=inputs, outputs=outputs)
    )
    (result,) = instance.execute([ModelRequest({"b": rows(1)}, ())])
    assert isinstance(result, InvalidArgumentError)
    assert "optional input 'a'" in str(result)


def test_missing_model_file(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match=r"model 'm' version 1: .*model\.pt not found"):
        load(write_torch_model(tmp_path, None))


@pytest.mark.parametrize("platform", ["pytorch_libtorch", "torch_export"])
def test_corrupt_model_file(tmp_path: Path, platform: str) -> None:
    model_dir = write_torch_model(tmp_path, os.urandom(2000), platform=platform)
    filename = "model.pt2" if platform == "torch_export" else "model.pt"
    path = re.escape(str(model_dir / "1" / filename))
    with pytest.raises(ModelLoadError, match=rf"model 'm' version 1: cannot load {path}: \S"):
        load(model_dir)


def test_an_exported_file_is_not_torchscript(tmp_path: Path) -> None:
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(Linear(), (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    model_dir = write_torch_model(tmp_path, program, filename="model.pt")
    with pytest.raises(ModelLoadError, match=r"cannot load .*model\.pt: "):
        load(model_dir)


def test_bytes_tensors_are_refused(tmp_path: Path) -> None:
    model_dir = write_torch_model(
        tmp_path, script(Clone()), inputs=[("INPUT__0", "BYTES", "[ 1 ]")]
    )
    with pytest.raises(ModelLoadError, match="PyTorch has no string tensors"):
        load(model_dir)


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (parameter("INPUT_BY_NAME", "maybe"), 'parameter INPUT_BY_NAME must be "true" or'),
        (parameter("TORCH_COMPILE", "yes please"), "parameter TORCH_COMPILE must be"),
        (parameter("INTRA_OP_THREAD_COUNT", "-2"), "INTRA_OP_THREAD_COUNT must be a whole number"),
    ],
)
def test_bad_parameters_are_refused(tmp_path: Path, extra: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        load(write_torch_model(tmp_path, script(Linear()), extra=extra))


def test_indexed_inputs_must_not_skip_an_index(tmp_path: Path) -> None:
    inputs = [("INPUT__0", "FP32", "[ 4 ]"), ("INPUT__2", "FP32", "[ 4 ]")]
    with pytest.raises(ModelLoadError, match=r"must number 0..1 without gaps, got \[0, 2\]"):
        load(write_torch_model(tmp_path, script(TwoInTwoOut()), inputs=inputs))
    inputs = [("INPUT__0", "FP32", "[ 4 ]"), ("OTHER__0", "FP32", "[ 4 ]")]
    with pytest.raises(ModelLoadError, match=r"two inputs share one __<index>"):
        load(write_torch_model(tmp_path, script(TwoInTwoOut()), name="dup", inputs=inputs))


def test_cuda_without_cuda_is_a_load_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(ModelLoadError, match=r"needs cuda:0, but CUDA is not available to torch"):
        load(write_torch_model(tmp_path, script(Linear())), device="cuda:0")


def test_a_missing_cuda_device_is_a_load_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 1)
    with pytest.raises(ModelLoadError, match=r"needs cuda:3, but torch sees 1 CUDA device"):
        load(write_torch_model(tmp_path, script(Linear())), device="cuda:3")


def test_without_torch_loading_explains_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = write_torch_model(tmp_path, script(Linear()))
    monkeypatch.setitem(sys.modules, "torch", None)
    with pytest.raises(ModelLoadError, match=re.escape("pip install 'infermux[torch]'")):
        load(model_dir)


def test_the_module_imports_without_torch() -> None:
    code = (
        "import sys; sys.modules['torch'] = None\n"
        "import infermux.backends.pytorch as p\n"
        "assert p.PyTorchBackend.name == 'pytorch'\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_intra_op_thread_count_sets_torch_threads(tmp_path: Path) -> None:
    before = torch.get_num_threads()
    try:
        load(
            write_torch_model(
                tmp_path, script(Linear()), extra=parameter("INTRA_OP_THREAD_COUNT", "1")
            )
        )
        assert torch.get_num_threads() == 1
    finally:
        torch.set_num_threads(before)


def test_registry_maps_both_platforms_to_this_backend(tmp_path: Path) -> None:
    registry = BackendRegistry()
    for platform in ("pytorch_libtorch", "torch_export"):
        model_dir = write_torch_model(tmp_path, None, name=platform, platform=platform)
        backend = registry.get(load_model_config(model_dir))
        assert isinstance(backend, PyTorchBackend)
        assert backend.stacks_inputs


def test_close_releases_the_model(tmp_path: Path) -> None:
    instance = load(write_torch_model(tmp_path, script(Linear())))
    instance.close()
    (result,) = instance.execute([ModelRequest({"INPUT__0": rows(1)}, ())])
    assert isinstance(result, InternalError)
    assert "is closed" in str(result)


# torch.compile: dynamo with its "eager" backend traces the model for real but skips inductor's C++
# code generation (tens of seconds on a cold cache); test_torch_compile_with_inductor does that.
@pytest.fixture
def compile_calls(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    calls: list[object] = []
    real = torch.compile

    def fake(model: Any, **kwargs: Any) -> Any:
        calls.append(model)
        return real(model, backend="eager", **kwargs)

    monkeypatch.setattr(torch, "compile", fake)
    return calls


def exported_linear(tmp_path: Path, extra: str) -> tuple[torch.nn.Module, Path]:
    module = Linear().eval()
    batch = torch.export.Dim("batch", min=1, max=64)
    program = torch.export.export(module, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}})
    return module, write_torch_model(tmp_path, program, platform="torch_export", extra=extra)


def test_torch_compile_compiles_on_the_first_batch(
    tmp_path: Path, compile_calls: list[object], caplog: pytest.LogCaptureFixture
) -> None:
    module, model_dir = exported_linear(tmp_path, parameter("TORCH_COMPILE", "true"))
    instance = load(model_dir)
    assert compile_calls == []  # not at load time
    for n in (2, 5, 1):
        x = rows(n, n)
        (result,) = execute(instance, {"INPUT__0": x})
        np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-5)
    assert len(compile_calls) == 1
    assert instance._compiled is not None
    assert "torch.compile" not in caplog.text


def test_torch_compile_of_torchscript_still_answers(
    tmp_path: Path, compile_calls: list[object]
) -> None:
    # Dynamo refuses TorchScript modules in some torch releases (a warning, then eager) and runs
    # them in others; either way the answers are right.
    module = Linear().eval()
    instance = load(
        write_torch_model(tmp_path, script(module), extra=parameter("TORCH_COMPILE", "1"))
    )
    x = rows(3)
    (result,) = execute(instance, {"INPUT__0": x})
    np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)
    assert len(compile_calls) == 1


def test_torch_compile_that_cannot_start_falls_back_to_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def refuse(model: Any) -> Any:
        raise RuntimeError("torch.compile does not support this model")

    monkeypatch.setattr(torch, "compile", refuse)
    module, model_dir = exported_linear(tmp_path, parameter("TORCH_COMPILE", "true"))
    instance = load(model_dir)
    x = rows(3)
    with caplog.at_level(logging.WARNING, "infermux.backends.pytorch"):
        (result,) = execute(instance, {"INPUT__0": x})
        (again,) = execute(instance, {"INPUT__0": x})
    np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)
    np.testing.assert_array_equal(again["OUTPUT__0"], result["OUTPUT__0"])
    assert caplog.text.count("torch.compile is unavailable, running eagerly") == 1


def test_a_failing_compiled_model_falls_back_to_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("inductor exploded")

    monkeypatch.setattr(torch, "compile", lambda model: broken)
    module, model_dir = exported_linear(tmp_path, parameter("TORCH_COMPILE", "true"))
    instance = load(model_dir)
    x = rows(2)
    with caplog.at_level(logging.WARNING, "infermux.backends.pytorch"):
        for _ in range(2):
            (result,) = execute(instance, {"INPUT__0": x})
            np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-6)
    assert caplog.text.count("the compiled model failed, running eagerly from now on") == 1
    assert instance._compiled is None


def test_when_eager_fails_too_the_error_is_the_models(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*args: Any) -> Any:
        raise RuntimeError("compiled failed")

    monkeypatch.setattr(torch, "compile", lambda model: broken)
    out = [("OUTPUT__0", "FP32", "[ 4 ]")]
    instance = load(
        write_torch_model(
            tmp_path, script(Picky()), outputs=out, extra=parameter("TORCH_COMPILE", "true")
        )
    )
    results: Sequence[ExecuteResult] = instance.execute(
        [ModelRequest({"INPUT__0": np.full((1, 4), 50, np.float32)}, ())]
    )
    assert isinstance(results[0], InternalError)
    assert "input too large" in str(results[0])
    assert instance._compiled is broken  # the model's own error does not turn compilation off


@pytest.mark.slow
@pytest.mark.skipif(
    os.environ.get("INFERMUX_SLOW_TESTS") != "1",
    reason="inductor compiles C++ (10-30 s); set INFERMUX_SLOW_TESTS=1 to run",
)
@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # inductor imports TorchScript helpers
def test_torch_compile_with_inductor(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    module, model_dir = exported_linear(tmp_path, parameter("TORCH_COMPILE", "true"))
    instance = load(model_dir)
    x = rows(4)
    with caplog.at_level(logging.WARNING, "infermux.backends.pytorch"):
        (result,) = execute(instance, {"INPUT__0": x})
    if instance._compiled is None:
        pytest.skip(f"torch.compile is unsupported on this machine: {caplog.text.strip()}")
    np.testing.assert_allclose(result["OUTPUT__0"], reference(module, x).numpy(), rtol=1e-5)


def test_a_cpu_instance_reports_its_own_copy_of_the_weights(tmp_path: Path) -> None:
    instance = load(write_torch_model(tmp_path, script(Linear())))
    try:
        (use,) = instance.memory_usage()
        assert (use.kind, use.device_id, use.component) == ("CPU", 0, "weights")
        assert use.byte_size == (4 * 3 + 3) * 4  # fp32 weight and bias
        assert not use.shared_key
    finally:
        instance.close()
    assert instance.memory_usage() == []


def test_cuda_graphs_on_a_cpu_instance_change_nothing(tmp_path: Path) -> None:
    extra = "optimization { cuda { graphs: true } }\n"
    instance = load(write_torch_model(tmp_path, script(Linear()), extra=extra))
    try:
        x = rows(3)
        (out,) = execute(instance, {"INPUT__0": x})
        np.testing.assert_allclose(out["OUTPUT__0"], reference(Linear(), x).numpy(), rtol=1e-6)
        assert instance.gpu is None
    finally:
        instance.close()


def test_cuda_graphs_and_torch_compile_together_are_refused(tmp_path: Path) -> None:
    extra = "optimization { cuda { graphs: true } }\n" + parameter("TORCH_COMPILE", "true")
    with pytest.raises(ModelLoadError, match=r"TORCH_COMPILE and optimization\.cuda\.graphs"):
        load(write_torch_model(tmp_path, script(Linear()), extra=extra))
