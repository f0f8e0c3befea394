"""ONNX Runtime at reduced precision: int8 (static QDQ) and fp16, through the calibration cache."""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.calibration_cache import BUILDS, CACHE_DIRNAME
from infermux.backends.onnxruntime import OnnxRuntimeBackend
from infermux.errors import ModelLoadError
from infermux.repository import load_model_config
from tests.support import parameter

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

from tests.onnx_models import CLASSIFIER_CONFIG, WIDTH, classifier, write_onnx_model  # noqa: E402


def rows(count: int, seed: int = 1) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((count, WIDTH)).astype(np.float32)


def write(tmp_path: Path, precision: str = "int8", extra: str = "", seed: int = 0) -> Path:
    model_dir = write_onnx_model(
        tmp_path,
        "m",
        classifier(seed),
        CLASSIFIER_CONFIG
        + parameter("precision", precision)
        + parameter("calibration_data", "cal.npz")
        + extra,
    )
    np.savez(model_dir / "cal.npz", X=rows(64))
    return model_dir


def load(model_dir: Path, instance: str = "m_0") -> Any:
    config = load_model_config(model_dir)
    return OnnxRuntimeBackend().load(ModelContext(config, 1, model_dir, model_dir / "1", instance))


def answer(instance: Any, x: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    (result,) = instance.execute([ModelRequest({"X": x}, ("Y",))])
    assert isinstance(result, dict), result
    return np.asarray(result["Y"])


def fp32_answer(x: npt.NDArray[np.float32], seed: int = 0) -> npt.NDArray[Any]:
    session = ort.InferenceSession(
        classifier(seed).SerializeToString(), providers=["CPUExecutionProvider"]
    )
    return np.asarray(session.run(["Y"], {"X": x})[0])


def builds() -> int:
    return BUILDS["onnxruntime-int8"]


def test_int8_is_calibrated_once_then_reused_from_the_cache(tmp_path: Path) -> None:
    model_dir = write(tmp_path)
    before = builds()
    first = load(model_dir)
    assert builds() == before + 1
    report = first.precision_report
    assert (report.precision.value, report.cache) == ("int8", "miss")
    assert report.accuracy is not None
    assert report.accuracy.rows == 64
    assert report.accuracy.source == "cal.npz"
    assert 0 < report.accuracy.outputs["Y"].relative_error < 0.15
    # The session runs the quantised graph: QDQ nodes, int8 weights, uint8 activations (the
    # CPU's fast u8s8 kernels).
    quantised = onnx.load(report.details["cache"] + "/model.onnx")
    assert {"QuantizeLinear", "DequantizeLinear"} <= {n.op_type for n in quantised.graph.node}
    points = {i.data_type for i in quantised.graph.initializer if i.name.endswith("zero_point")}
    assert {onnx.TensorProto.UINT8, onnx.TensorProto.INT8} <= points  # (and int32 biases)
    x = rows(5, seed=7)
    got, expected = answer(first, x), fp32_answer(x)
    assert got.dtype == np.float32
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.15
    assert not np.array_equal(got, expected)  # really int8, not the fp32 graph

    second = load(model_dir, "m_1")
    assert builds() == before + 1  # the marker: no second calibration
    assert second.precision_report.cache == "hit"
    assert second.precision_report.accuracy == report.accuracy
    np.testing.assert_array_equal(answer(second, x), got)


@pytest.mark.parametrize("change", ["calibration data", "model", "settings", "activations"])
def test_a_changed_key_recalibrates(tmp_path: Path, change: str) -> None:
    model_dir = write(tmp_path)
    first = load(model_dir).precision_report.details["cache"]
    before = builds()
    if change == "calibration data":
        np.savez(model_dir / "cal.npz", X=rows(64, seed=99))
    elif change == "model":
        (model_dir / "1" / "model.onnx").write_bytes(classifier(seed=5).SerializeToString())
    elif change == "settings":
        config = model_dir / "config.pbtxt"
        config.write_text(config.read_text() + parameter("int8_per_channel", "false"))
    else:  # the CPU default is uint8 activations; asking for int8 is another artifact
        config = model_dir / "config.pbtxt"
        config.write_text(config.read_text() + parameter("int8_activation_type", "int8"))
    report = load(model_dir).precision_report
    assert report.cache == "miss"
    assert builds() == before + 1
    assert report.details["cache"] != first
    assert len(list((model_dir / "1" / CACHE_DIRNAME).iterdir())) == 2


def test_a_corrupt_cached_model_is_discarded_and_recalibrated(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model_dir = write(tmp_path)
    cached = Path(load(model_dir).precision_report.details["cache"]) / "model.onnx"
    data = bytearray(cached.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped bit in the weights still parses: only the hash sees it
    cached.write_bytes(bytes(data))
    before = builds()
    with caplog.at_level(logging.WARNING):
        instance = load(model_dir)
    assert instance.precision_report.cache == "corrupt"
    assert builds() == before + 1
    assert "discarding the corrupt calibration cache entry" in caplog.text
    x = rows(3, seed=2)
    got, expected = answer(instance, x), fp32_answer(x)
    assert np.linalg.norm(got - expected) / np.linalg.norm(expected) < 0.15


def test_instances_loading_together_calibrate_once(tmp_path: Path) -> None:
    model_dir = write(tmp_path)
    before = builds()
    loaded: list[Any] = []
    threads = [
        threading.Thread(target=lambda i=i: loaded.append(load(model_dir, f"m_{i}")))
        for i in range(3)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert builds() == before + 1
    assert sorted(i.precision_report.cache for i in loaded) == ["hit", "hit", "miss"]


def test_the_guard_refuses_beyond_the_tolerance_and_warns_when_told(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    strict = write(tmp_path / "a", extra=parameter("accuracy_tolerance", "0.000001"))
    with pytest.raises(ModelLoadError, match=r"output 'Y' differs from fp32 by a relative error"):
        load(strict)
    # The figures were cached with the artifact: a looser tolerance needs no new calibration.
    config = strict / "config.pbtxt"
    config.write_text(
        config.read_text().replace("0.000001", "0.5") + parameter("accuracy_action", "warn")
    )
    before = builds()
    assert load(strict).precision_report.cache == "hit"
    assert builds() == before
    lenient = write(
        tmp_path / "b",
        extra=parameter("accuracy_tolerance", "0") + parameter("accuracy_action", "warn"),
    )
    with caplog.at_level(logging.WARNING, logger="infermux.backends.precision"):
        instance = load(lenient)
    assert "serving it anyway" in caplog.text
    assert answer(instance, rows(2)).shape == (2, 10)


def test_fp16_converts_the_graph_and_keeps_fp32_inputs_and_outputs(tmp_path: Path) -> None:
    model_dir = write(tmp_path, "fp16")
    instance = load(model_dir)
    report = instance.precision_report
    assert (report.precision.value, report.cache) == ("fp16", "miss")
    assert report.accuracy is not None
    assert report.accuracy.outputs["Y"].relative_error < 0.01
    converted = onnx.load(report.details["cache"] + "/model.onnx")
    weights = {i.name: i.data_type for i in converted.graph.initializer}
    assert onnx.TensorProto.FLOAT16 in weights.values()
    x = rows(4, seed=3)
    got = answer(instance, x)
    assert got.dtype == np.float32
    np.testing.assert_allclose(got, fp32_answer(x), rtol=0.02, atol=0.02)
    assert load(model_dir).precision_report.cache == "hit"


def test_fp16_end_to_end_when_the_config_declares_fp16_inputs_and_outputs(
    tmp_path: Path,
) -> None:
    config = CLASSIFIER_CONFIG.replace("TYPE_FP32", "TYPE_FP16") + parameter("precision", "fp16")
    model_dir = write_onnx_model(
        tmp_path, "m", classifier(), config + parameter("calibration_data", "cal.npz")
    )
    np.savez(model_dir / "cal.npz", X=rows(16))  # float32 rows: converted to the input's FP16
    instance = load(model_dir)
    report = instance.precision_report
    assert report.accuracy is not None  # the reference ran the original fp32 graph
    assert report.accuracy.outputs["Y"].relative_error < 0.01
    x = rows(3, seed=8)
    got = answer(instance, x.astype(np.float16))
    assert got.dtype == np.float16
    np.testing.assert_allclose(got.astype(np.float32), fp32_answer(x), rtol=0.02, atol=0.02)


def test_fp16_without_calibration_data_is_guarded_on_random_rows(tmp_path: Path) -> None:
    model_dir = write_onnx_model(
        tmp_path, "m", classifier(), CLASSIFIER_CONFIG + parameter("precision", "fp16")
    )
    report = load(model_dir).precision_report
    assert report.accuracy is not None
    assert report.accuracy.source == "random"


def test_bf16_is_refused_saying_which_backends_serve_it(tmp_path: Path) -> None:
    with pytest.raises(ModelLoadError, match="precision bf16 is not available: onnxruntime has"):
        load(write(tmp_path, "bf16"))


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (parameter("int8_per_channel", "maybe"), "parameter int8_per_channel must be"),
        (parameter("int8_calibration_method", "guess"), "parameter int8_calibration_method"),
        (parameter("int8_activation_type", "int4"), "parameter int8_activation_type must be"),
    ],
)
def test_bad_int8_options_fail_naming_the_parameter(tmp_path: Path, extra: str, named: str) -> None:
    with pytest.raises(ModelLoadError, match=named):
        load(write(tmp_path, extra=extra))


def test_calibration_data_that_does_not_fit_the_model_fails_the_load(tmp_path: Path) -> None:
    model_dir = write(tmp_path)
    np.savez(model_dir / "cal.npz", X=rows(8)[:, :5])
    with pytest.raises(
        ModelLoadError, match=r"array 'X' has shape \[8, 5\]; expected \[rows, 32\]"
    ):
        load(model_dir)
    cache = model_dir / "1" / CACHE_DIRNAME
    assert not cache.exists() or list(cache.iterdir()) == []  # nothing half-built left behind
