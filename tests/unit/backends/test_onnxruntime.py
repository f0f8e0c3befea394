"""The ONNX Runtime backend, against models built here with ``onnx.helper`` (no downloads)."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any, ClassVar

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from infermux.backends import BackendRegistry, ModelContext, ModelRequest
from infermux.backends.onnxruntime import OnnxRuntimeBackend
from infermux.errors import InternalError, InvalidArgumentError, ModelLoadError
from infermux.repository import load_model_config

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from tests.onnx_models import (  # noqa: E402  (after the skips: it needs onnx too)
    ADD_SUB_CONFIG,
    MLP_CONFIG,
    add_sub_model,
    direct,
    identity_config,
    identity_model,
    mlp_model,
    offset_model,
    write_onnx_model,
)


def load(model_dir: Path, device: str = "cpu") -> Any:
    context = ModelContext(
        load_model_config(model_dir), 1, model_dir, model_dir / "1", "m_0", device
    )
    return OnnxRuntimeBackend().load(context)


def ok(result: object) -> dict[str, npt.NDArray[Any]]:
    assert isinstance(result, dict), result
    return result


def test_answers_equal_onnxruntime(tmp_path: Path) -> None:
    instance = load(write_onnx_model(tmp_path, "mlp", mlp_model(), MLP_CONFIG))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    (result,) = instance.execute([ModelRequest({"X": x}, ("Y",))])
    (expected,) = direct(mlp_model(), {"X": x})
    assert ok(result)["Y"].dtype == np.float32
    np.testing.assert_allclose(ok(result)["Y"], expected, rtol=1e-6, atol=1e-6)
    instance.close()


def test_requests_of_different_batch_sizes_are_stacked_and_split(tmp_path: Path) -> None:
    instance = load(write_onnx_model(tmp_path, "mlp", mlp_model(), MLP_CONFIG))
    rng = np.random.default_rng(1)
    xs = [rng.standard_normal((n, 4)).astype(np.float32) for n in (1, 3, 2)]
    results = instance.execute([ModelRequest({"X": x}, ("Y",)) for x in xs])
    assert len(results) == 3
    for x, result in zip(xs, results, strict=True):
        (expected,) = direct(mlp_model(), {"X": x})
        assert ok(result)["Y"].shape == (len(x), 3)
        np.testing.assert_allclose(ok(result)["Y"], expected, rtol=1e-6, atol=1e-6)


def test_two_inputs_two_outputs(tmp_path: Path) -> None:
    instance = load(write_onnx_model(tmp_path, "simple", add_sub_model(), ADD_SUB_CONFIG))
    a = np.arange(32, dtype=np.int32).reshape(2, 16)
    b = np.ones((2, 16), dtype=np.int32)
    first, second = instance.execute(
        [
            ModelRequest({"INPUT0": a[:1], "INPUT1": b[:1]}, ("OUTPUT0", "OUTPUT1")),
            ModelRequest({"INPUT0": a[1:], "INPUT1": b[1:]}, ("OUTPUT1",)),
        ]
    )
    np.testing.assert_array_equal(ok(first)["OUTPUT0"], a[:1] + 1)
    np.testing.assert_array_equal(ok(first)["OUTPUT1"], a[:1] - 1)
    np.testing.assert_array_equal(ok(second)["OUTPUT1"], a[1:] - 1)


def test_non_batching_model(tmp_path: Path) -> None:
    config = (
        MLP_CONFIG.replace("max_batch_size: 8", "max_batch_size: 0")
        .replace("dims: [ 4 ]", "dims: [ 2, 4 ]")
        .replace("dims: [ 3 ]", "dims: [ 2, 3 ]")
    )
    instance = load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))
    x = np.ones((2, 4), np.float32)
    (result,) = instance.execute([ModelRequest({"X": x}, ("Y",))])
    np.testing.assert_allclose(ok(result)["Y"], direct(mlp_model(), {"X": x})[0], rtol=1e-6)


def test_string_tensors_round_trip_as_bytes(tmp_path: Path) -> None:
    model = identity_model(onnx.TensorProto.STRING)
    instance = load(write_onnx_model(tmp_path, "echo", model, identity_config("TYPE_STRING")))
    words = np.array([[b"hello", "wörld".encode()]], dtype=np.object_)
    other = np.array([[b"a", b""]], dtype=np.object_)
    first, second = instance.execute(
        [
            ModelRequest({"INPUT0": words}, ("OUTPUT0",)),
            ModelRequest({"INPUT0": other}, ("OUTPUT0",)),
        ]
    )
    assert ok(first)["OUTPUT0"].tolist() == [[b"hello", "wörld".encode()]]
    assert ok(second)["OUTPUT0"].tolist() == [[b"a", b""]]


def test_a_request_with_non_utf8_bytes_fails_alone(tmp_path: Path) -> None:
    model = identity_model(onnx.TensorProto.STRING)
    instance = load(write_onnx_model(tmp_path, "echo", model, identity_config("TYPE_STRING")))
    bad = np.array([[b"\xff\xfe"]], dtype=np.object_)
    good = np.array([[b"fine"]], dtype=np.object_)
    first, second, third = instance.execute(
        [ModelRequest({"INPUT0": x}, ("OUTPUT0",)) for x in (good, bad, good)]
    )
    assert isinstance(second, InvalidArgumentError)
    assert "INPUT0" in str(second)
    assert "UTF-8" in str(second)
    assert ok(first)["OUTPUT0"].tolist() == [[b"fine"]]
    assert ok(third)["OUTPUT0"].tolist() == [[b"fine"]]


def test_bf16_tensors(tmp_path: Path) -> None:
    model = identity_model(onnx.TensorProto.BFLOAT16)
    instance = load(write_onnx_model(tmp_path, "bf16", model, identity_config("TYPE_BF16")))
    x = np.array([[1.5, -2.0, 3.25]], dtype=ml_dtypes.bfloat16)
    empty = np.zeros((1, 0), dtype=ml_dtypes.bfloat16)
    (result,) = instance.execute([ModelRequest({"INPUT0": x}, ("OUTPUT0",))])
    assert ok(result)["OUTPUT0"].dtype == ml_dtypes.bfloat16
    np.testing.assert_array_equal(ok(result)["OUTPUT0"].astype(np.float32), x.astype(np.float32))
    (result,) = instance.execute([ModelRequest({"INPUT0": empty}, ("OUTPUT0",))])
    assert ok(result)["OUTPUT0"].shape == (1, 0)


def test_optional_input_may_be_absent(tmp_path: Path) -> None:
    config = (
        'platform: "onnxruntime_onnx"\nmax_batch_size: 0\n'
        'input [ { name: "X", data_type: TYPE_FP32, dims: [ -1, 2 ] },\n'
        '        { name: "OFFSET", data_type: TYPE_FP32, dims: [ 2 ], optional: true } ]\n'
        'output [ { name: "Y", data_type: TYPE_FP32, dims: [ -1, 2 ] } ]\n'
    )
    instance = load(write_onnx_model(tmp_path, "offset", offset_model(), config))
    x = np.ones((1, 2), np.float32)
    (result,) = instance.execute([ModelRequest({"X": x}, ("Y",))])
    np.testing.assert_array_equal(ok(result)["Y"], [[11, 21]])
    offset = np.array([1, 2], np.float32)
    (result,) = instance.execute([ModelRequest({"X": x, "OFFSET": offset}, ("Y",))])
    np.testing.assert_array_equal(ok(result)["Y"], [[2, 3]])


def test_runtime_failure_fails_the_batch_with_an_internal_error(tmp_path: Path) -> None:
    # The graph's second dim is symbolic, so load accepts dims [-1]; MatMul then fails on 5 != 4.
    config = MLP_CONFIG.replace("dims: [ 4 ]", "dims: [ -1 ]")
    instance = load(write_onnx_model(tmp_path, "mlp", mlp_model(k="K"), config))
    request = ModelRequest({"X": np.ones((1, 5), np.float32)}, ("Y",))
    results = instance.execute([request, request])
    assert all(isinstance(r, InternalError) for r in results)
    assert "model 'mlp': onnxruntime failed" in str(results[0])
    (result,) = instance.execute([ModelRequest({"X": np.ones((1, 4), np.float32)}, ("Y",))])
    assert ok(result)["Y"].shape == (1, 3)  # the instance keeps serving


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (
            MLP_CONFIG.replace("TYPE_FP32, dims: [ 4 ]", "TYPE_INT32, dims: [ 4 ]"),
            "input 'X' is INT32 (tensor(int32)) in the config but tensor(float) in the ONNX graph",
        ),
        (
            MLP_CONFIG.replace("TYPE_FP32, dims: [ 3 ]", "TYPE_FP16, dims: [ 3 ]"),
            "output 'Y' is FP16 (tensor(float16)) in the config but tensor(float) in the ONNX",
        ),
        (
            MLP_CONFIG.replace('name: "Y"', 'name: "Z"'),
            "output 'Z' is not in the ONNX graph (its outputs: Y)",
        ),
        (
            MLP_CONFIG.replace('name: "X"', 'name: "IN"'),
            "input 'IN' is not in the ONNX graph (its inputs: X)",
        ),
        (
            MLP_CONFIG.replace("dims: [ 4 ]", "dims: [ 5 ]"),
            "input 'X' has shape [-1, 5] in the config (batch dimension included) but ['N', 4]",
        ),
        (
            MLP_CONFIG.replace("dims: [ 3 ]", "dims: [ 3, 1 ]"),
            "output 'Y' has shape [-1, 3, 1]",
        ),
    ],
)
def test_config_must_match_the_graph(tmp_path: Path, config: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))


def test_graph_inputs_missing_from_the_config_are_refused(tmp_path: Path) -> None:
    config = ADD_SUB_CONFIG.replace(
        'input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] },\n        ', "input [ "
    )
    with pytest.raises(
        ModelLoadError, match=r"requires input\(s\) INPUT0 that the config does not"
    ):
        load(write_onnx_model(tmp_path, "simple", add_sub_model(), config))


def test_missing_file_names_the_path(tmp_path: Path) -> None:
    model_dir = write_onnx_model(tmp_path, "mlp", None, MLP_CONFIG)
    with pytest.raises(ModelLoadError, match=re.escape(str(model_dir / "1" / "model.onnx"))):
        load(model_dir)


def test_default_model_filename_is_honoured(tmp_path: Path) -> None:
    config = MLP_CONFIG + 'default_model_filename: "mlp.onnx"\n'
    model_dir = write_onnx_model(tmp_path, "mlp", mlp_model(), config, filename="mlp.onnx")
    load(model_dir).close()


def test_corrupt_file_is_a_clear_load_error(tmp_path: Path) -> None:
    model_dir = write_onnx_model(tmp_path, "mlp", None, MLP_CONFIG)
    path = model_dir / "1" / "model.onnx"
    path.write_bytes(b"this is not a protobuf")
    with pytest.raises(ModelLoadError, match=f"cannot load {re.escape(str(path))}: .+"):
        load(model_dir)


def test_unavailable_execution_provider_is_named(tmp_path: Path) -> None:
    if "TensorrtExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has TensorRT")
    config = MLP_CONFIG + (
        "optimization { execution_accelerators { gpu_execution_accelerator [\n"
        '  { name: "tensorrt" parameters { key: "precision_mode" value: "FP16" } } ] } }\n'
    )
    model_dir = write_onnx_model(tmp_path, "mlp", mlp_model(), config)
    with pytest.raises(ModelLoadError) as raised:
        load(model_dir, device="cuda:0")
    message = str(raised.value)
    assert "TensorrtExecutionProvider" in message
    assert "not available in this onnxruntime build" in message
    assert f"available: {', '.join(ort.get_available_providers())}" in message


def test_unavailable_cpu_accelerator_is_named(tmp_path: Path) -> None:
    if "OpenVINOExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime build has OpenVINO")
    config = MLP_CONFIG + (
        'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "openvino" } ]'
        " } }\n"
    )
    with pytest.raises(ModelLoadError, match="OpenVINOExecutionProvider not available"):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))


def test_unknown_accelerator_is_refused(tmp_path: Path) -> None:
    config = MLP_CONFIG + (
        'optimization { execution_accelerators { cpu_execution_accelerator [ { name: "turbo" } ]'
        " } }\n"
    )
    with pytest.raises(ModelLoadError, match="unknown cpu_execution_accelerator 'turbo'"):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))


class RecordingSession:
    """Stands in for ``InferenceSession`` to see the providers a GPU config asks for."""

    seen: ClassVar[dict[str, Any]] = {}

    def __init__(self, path: str, **kwargs: Any) -> None:
        RecordingSession.seen = kwargs
        raise RuntimeError("recorded")


def test_gpu_accelerators_become_provider_options(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    names = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: names)
    monkeypatch.setattr(ort, "InferenceSession", RecordingSession)
    config = MLP_CONFIG + (
        "optimization { execution_accelerators { gpu_execution_accelerator [\n"
        '  { name: "tensorrt"\n'
        '    parameters { key: "precision_mode" value: "FP16" }\n'
        '    parameters { key: "max_workspace_size_bytes" value: "1073741824" }\n'
        '    parameters { key: "trt_engine_cache_enable" value: "1" } },\n'
        '  { name: "cuda" parameters { key: "cudnn_conv_use_max_workspace" value: "0" } } ] } }\n'
    )
    with pytest.raises(ModelLoadError, match="recorded"):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config), device="cuda:1")
    assert RecordingSession.seen["providers"] == [
        (
            "TensorrtExecutionProvider",
            {
                "device_id": "1",
                "trt_fp16_enable": "True",
                "trt_max_workspace_size": "1073741824",
                "trt_engine_cache_enable": "1",
            },
        ),
        ("CUDAExecutionProvider", {"device_id": "1", "cudnn_conv_use_max_workspace": "0"}),
        ("CPUExecutionProvider", {}),
    ]


def test_cpu_instances_ignore_gpu_accelerators(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(ort, "InferenceSession", RecordingSession)
    config = MLP_CONFIG + (
        "optimization { execution_accelerators { gpu_execution_accelerator [\n"
        '  { name: "tensorrt" } ] } }\n'
    )
    with pytest.raises(ModelLoadError, match="recorded"):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))
    assert RecordingSession.seen["providers"] == [("CPUExecutionProvider", {})]


@pytest.mark.parametrize(
    ("parameter", "message"),
    [
        ('{ key: "precision_mode" value: "FP8" }', "precision_mode must be FP32, FP16 or INT8"),
        ('{ key: "warp_speed" value: "1" }', "unknown parameter 'warp_speed' for the tensorrt"),
    ],
)
def test_bad_tensorrt_parameters(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parameter: str, message: str
) -> None:
    names = ["TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"]
    monkeypatch.setattr(ort, "get_available_providers", lambda: names)
    config = MLP_CONFIG + (
        "optimization { execution_accelerators { gpu_execution_accelerator [\n"
        f'  {{ name: "tensorrt" parameters {parameter} }} ] }} }}\n'
    )
    with pytest.raises(ModelLoadError, match=message):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config), device="cuda:0")


def test_default_session_options(tmp_path: Path) -> None:
    instance = load(write_onnx_model(tmp_path, "mlp", mlp_model(), MLP_CONFIG))
    options = instance.session.get_session_options()
    assert options.intra_op_num_threads == 1
    assert options.graph_optimization_level == ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    assert options.execution_mode == ort.ExecutionMode.ORT_SEQUENTIAL
    assert instance.session.get_providers() == ["CPUExecutionProvider"]


@pytest.mark.parametrize(
    ("level", "expected"),
    [
        (-1, "ORT_ENABLE_BASIC"),
        (0, "ORT_ENABLE_ALL"),
        (1, "ORT_ENABLE_EXTENDED"),
        (2, "ORT_DISABLE_ALL"),
    ],
)
def test_session_options_from_the_config(tmp_path: Path, level: int, expected: str) -> None:
    config = MLP_CONFIG + (
        f"optimization {{ graph {{ level: {level} }} }}\n"
        'parameters { key: "intra_op_thread_count" value: { string_value: "2" } }\n'
        'parameters { key: "inter_op_thread_count" value: { string_value: "3" } }\n'
        'parameters { key: "execution_mode" value: { string_value: "1" } }\n'
    )
    instance = load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))
    options = instance.session.get_session_options()
    assert options.graph_optimization_level == getattr(ort.GraphOptimizationLevel, expected)
    assert options.intra_op_num_threads == 2
    assert options.inter_op_num_threads == 3
    assert options.execution_mode == ort.ExecutionMode.ORT_PARALLEL
    x = np.ones((2, 4), np.float32)
    (result,) = instance.execute([ModelRequest({"X": x}, ("Y",))])
    np.testing.assert_allclose(ok(result)["Y"], direct(mlp_model(), {"X": x})[0], rtol=1e-6)


@pytest.mark.parametrize(
    ("key", "value"),
    [("intra_op_thread_count", "many"), ("execution_mode", "2"), ("inter_op_thread_count", "-1")],
)
def test_bad_session_parameters(tmp_path: Path, key: str, value: str) -> None:
    config = MLP_CONFIG + f'parameters {{ key: "{key}" value: {{ string_value: "{value}" }} }}\n'
    with pytest.raises(ModelLoadError, match=f"parameter '{key}' must be an integer"):
        load(write_onnx_model(tmp_path, "mlp", mlp_model(), config))


def test_load_without_onnxruntime_says_how_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    model_dir = write_onnx_model(tmp_path, "mlp", mlp_model(), MLP_CONFIG)
    monkeypatch.setitem(sys.modules, "onnxruntime", None)
    with pytest.raises(ModelLoadError, match=re.escape("pip install 'infermux[onnx]'")):
        load(model_dir)


def test_module_imports_without_onnxruntime() -> None:
    code = (
        "import sys; sys.modules['onnxruntime'] = None\n"
        "import infermux.backends.onnxruntime as m; assert m.OnnxRuntimeBackend.name\n"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_the_registry_serves_the_onnxruntime_onnx_platform(tmp_path: Path) -> None:
    config = load_model_config(write_onnx_model(tmp_path, "mlp", mlp_model(), MLP_CONFIG))
    backend = BackendRegistry().get(config)
    assert isinstance(backend, OnnxRuntimeBackend)
    assert backend.stacks_inputs


@pytest.mark.gpu
@pytest.mark.skipif(
    "CUDAExecutionProvider" not in ort.get_available_providers(),
    reason="needs onnxruntime-gpu and a CUDA device",
)
def test_cuda_instances_use_io_binding(tmp_path: Path) -> None:
    mlp = load(write_onnx_model(tmp_path, "mlp", mlp_model(), MLP_CONFIG), device="cuda:0")
    assert mlp.session.get_providers()[0] == "CUDAExecutionProvider"
    xs = [np.random.default_rng(n).standard_normal((n, 4)).astype(np.float32) for n in (1, 4)]
    for x, result in zip(
        xs, mlp.execute([ModelRequest({"X": x}, ("Y",)) for x in xs]), strict=True
    ):
        np.testing.assert_allclose(
            ok(result)["Y"], direct(mlp_model(), {"X": x})[0], rtol=1e-4, atol=1e-4
        )
    # String tensors cannot be bound: ORT places the string nodes on the CPU by itself.
    echo = identity_model(onnx.TensorProto.STRING)
    strings = load(
        write_onnx_model(tmp_path, "echo", echo, identity_config("TYPE_STRING")), device="cuda:0"
    )
    words = np.array([[b"gpu", b"ok"]], dtype=np.object_)
    (result,) = strings.execute([ModelRequest({"INPUT0": words}, ("OUTPUT0",))])
    assert ok(result)["OUTPUT0"].tolist() == words.tolist()
    bf16 = identity_model(onnx.TensorProto.BFLOAT16)
    halves = load(write_onnx_model(tmp_path, "bf16", bf16, identity_config("TYPE_BF16")), "cuda:0")
    x = np.array([[0.5, 4.0]], dtype=ml_dtypes.bfloat16)
    (result,) = halves.execute([ModelRequest({"INPUT0": x}, ("OUTPUT0",))])
    np.testing.assert_array_equal(ok(result)["OUTPUT0"].astype(np.float32), [[0.5, 4.0]])
