"""Precision settings, calibration data and the accuracy guard, independent of any backend."""

from __future__ import annotations

import logging
import math
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import ModelContext
from infermux.backends.precision import (
    Accuracy,
    OutputAccuracy,
    Precision,
    PrecisionSettings,
    batches,
    check,
    compare,
    guard_inputs,
    load_calibration,
    run_rows,
)
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig
from infermux.repository import load_model_config
from tests.support import parameter

CONFIG = """name: "m"
backend: "python"
max_batch_size: 4
input [ { name: "X", data_type: TYPE_FP32, dims: [ 3 ] },
        { name: "IDS", data_type: TYPE_INT64, dims: [ -1 ] , optional: true } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""


def context(tmp_path: Path, extra: str = "", config: str = CONFIG) -> ModelContext:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(config + extra)
    return ModelContext(load_model_config(model_dir), 1, model_dir, model_dir / "1", "m_0")


def test_defaults_are_fp32_and_refuse(tmp_path: Path) -> None:
    settings = PrecisionSettings.of(context(tmp_path))
    assert settings.precision is Precision.FP32
    assert not settings.reduced
    assert settings.refuse
    assert settings.calibration_data is None


@pytest.mark.parametrize(
    ("precision", "tolerance"), [("fp16", 0.05), ("BF16", 0.1), (" int8 ", 0.25)]
)
def test_each_precision_has_its_default_tolerance(
    tmp_path: Path, precision: str, tolerance: float
) -> None:
    (tmp_path / "m").mkdir()
    np.savez(tmp_path / "m" / "cal.npz", X=np.zeros((2, 3), np.float32))
    extra = parameter("precision", precision) + parameter("calibration_data", "cal.npz")
    settings = PrecisionSettings.of(context(tmp_path, extra))
    assert settings.precision.value == precision.strip().lower()
    assert settings.tolerance == tolerance
    assert settings.calibration_data == tmp_path / "m" / "cal.npz"


@pytest.mark.parametrize(
    ("extra", "named"),
    [
        (parameter("precision", "fp8"), "parameter precision must be one of fp32, fp16"),
        (parameter("precision", "int8"), "precision int8 needs parameter calibration_data"),
        (parameter("calibration_data", "missing.npz"), "calibration_data: "),
        (parameter("accuracy_tolerance", "-1"), "parameter accuracy_tolerance must be"),
        (parameter("accuracy_tolerance", "nan"), "parameter accuracy_tolerance must be"),
        (parameter("accuracy_tolerance", "loose"), "parameter accuracy_tolerance must be"),
        (parameter("accuracy_action", "ignore"), "parameter accuracy_action must be"),
    ],
)
def test_bad_settings_fail_naming_the_parameter(tmp_path: Path, extra: str, named: str) -> None:
    with pytest.raises(ModelLoadError, match=named):
        PrecisionSettings.of(context(tmp_path, extra))


def test_settings_parse_tolerance_and_warn(tmp_path: Path) -> None:
    extra = (
        parameter("precision", "bf16")
        + parameter("accuracy_tolerance", "0.2")
        + parameter("accuracy_action", "WARN")
    )
    settings = PrecisionSettings.of(context(tmp_path, extra))
    assert (settings.tolerance, settings.refuse) == (0.2, False)
    with pytest.raises(ModelLoadError, match="precision bf16 is not available: no kernels"):
        settings.refuse_unless((Precision.FP32,), load_config(tmp_path), "no kernels")


def load_config(tmp_path: Path) -> ModelConfig:
    return load_model_config(tmp_path / "m")


def write_npz(tmp_path: Path, **arrays: np.ndarray) -> Path:
    path = tmp_path / "cal.npz"
    np.savez(path, **arrays)  # type: ignore[arg-type]
    return path


def test_calibration_data_is_checked_and_converted(tmp_path: Path) -> None:
    config = context(tmp_path).config
    data = load_calibration(config, write_npz(tmp_path, X=np.ones((5, 3), np.float64)))
    assert list(data) == ["X"]  # IDS is optional
    assert data["X"].dtype == np.float32
    assert data["X"].shape == (5, 3)


@pytest.mark.parametrize(
    ("arrays", "named"),
    [
        ({"Z": np.ones((2, 3))}, "no array for input 'X' \\(arrays: Z\\)"),
        ({"X": np.ones((2, 4))}, "array 'X' has shape \\[2, 4\\]; expected \\[rows, 3\\]"),
        ({"X": np.ones(3)}, "array 'X' has shape \\[3\\]"),
        (
            {"X": np.array(["a", "b", "c"] * 2).reshape(2, 3)},
            "does not convert to the input's FP32",
        ),
        ({"X": np.ones((0, 3))}, "no rows to calibrate on"),
        ({"X": np.ones((2, 3)), "IDS": np.ones((3, 4), np.int64)}, "different row counts"),
        ({"X": np.ones((2, 3)), "EXTRA": np.ones(2)}, "arrays EXTRA are not inputs"),
    ],
)
def test_bad_calibration_data_fails_naming_the_array(
    tmp_path: Path, arrays: dict[str, np.ndarray], named: str
) -> None:
    config = context(tmp_path).config
    with pytest.raises(ModelLoadError, match=named):
        load_calibration(config, write_npz(tmp_path, **arrays))


def test_a_file_that_is_not_an_npz_fails_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "cal.npz"
    path.write_bytes(b"PK\x03\x04 not really a zip")
    with pytest.raises(ModelLoadError, match=r"calibration_data \(.*cal\.npz\): not a readable"):
        load_calibration(context(tmp_path).config, path)


def test_random_rows_stand_in_only_for_fixed_shape_floats(tmp_path: Path) -> None:
    fixed = context(
        tmp_path / "a",
        parameter("precision", "fp16"),
        CONFIG.replace(
            ',\n        { name: "IDS", data_type: TYPE_INT64, dims: [ -1 ] , optional: true }', ""
        ),
    )
    inputs = guard_inputs(fixed.config, PrecisionSettings.of(fixed))
    assert inputs is not None
    data, source = inputs
    assert source == "random"
    assert data["X"].shape == (8, 3)
    again = guard_inputs(fixed.config, PrecisionSettings.of(fixed))
    assert again is not None
    np.testing.assert_array_equal(again[0]["X"], data["X"])  # seeded: the same rows every load
    ints = context(tmp_path / "b", parameter("precision", "fp16"))
    assert guard_inputs(ints.config, PrecisionSettings.of(ints)) is None


def test_batches_follow_max_batch_size_and_non_batching_models_go_row_by_row(
    tmp_path: Path,
) -> None:
    config = context(tmp_path / "a").config
    data = {"X": np.arange(30, dtype=np.float32).reshape(10, 3)}
    assert [len(b["X"]) for b in batches(config, data)] == [4, 4, 2]
    single = context(
        tmp_path / "b", config=CONFIG.replace("max_batch_size: 4", "max_batch_size: 0")
    )
    rows = list(batches(single.config, data))
    assert len(rows) == 10
    assert rows[0]["X"].shape == (3,)
    outputs = run_rows(single.config, lambda b: {"Y": b["X"] * 2}, data)
    np.testing.assert_array_equal(outputs["Y"], data["X"] * 2)


def test_compare_measures_relative_error_and_top1_agreement() -> None:
    reference = {"Y": np.array([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])}
    reduced = {"Y": np.array([[1.0, 0.0, 0.0], [0.0, 0.9, 1.0]])}
    accuracy = compare(reference, reduced, "cal.npz")
    figures = accuracy.outputs["Y"]
    assert figures.relative_error == pytest.approx(math.sqrt(0.01 + 1.0) / math.sqrt(2))
    assert figures.top1_agreement == 0.5
    assert accuracy.worst() == ("Y", figures.relative_error)
    assert Accuracy.from_json(accuracy.to_json()) == accuracy


def test_compare_treats_overflow_as_the_worst_error_and_integer_outputs_as_agreement() -> None:
    reference = {"Y": np.ones((2, 1)), "C": np.array([1, 2, 3])}
    reduced = {"Y": np.array([[1.0], [np.inf]]), "C": np.array([1, 2, 4])}
    accuracy = compare(reference, reduced, "random")
    assert accuracy.outputs["Y"] == OutputAccuracy(math.inf, None)
    assert accuracy.outputs["C"].relative_error == pytest.approx(1 / 3)


def test_compare_refuses_a_shape_change() -> None:
    with pytest.raises(ModelLoadError, match="output 'Y' has shape \\[2\\] at reduced"):
        compare({"Y": np.ones(3)}, {"Y": np.ones(2)}, "random")


def test_the_guard_refuses_or_warns_beyond_the_tolerance(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    accuracy = Accuracy({"Y": OutputAccuracy(0.3, 0.75)}, 16, "cal.npz")
    strict = context(tmp_path / "a", parameter("precision", "bf16"))
    with pytest.raises(
        ModelLoadError,
        match=r"output 'Y' differs from fp32 by a relative error of "
        r"0.3, over the accuracy_tolerance of 0.1.*set accuracy_action 'warn'",
    ):
        check(strict, PrecisionSettings.of(strict), accuracy)
    lenient = context(
        tmp_path / "b", parameter("precision", "bf16") + parameter("accuracy_action", "warn")
    )
    with caplog.at_level(logging.INFO, logger="infermux.backends.precision"):
        check(lenient, PrecisionSettings.of(lenient), accuracy)
        check(lenient, PrecisionSettings.of(lenient), None)
    warning, info = caplog.records
    assert warning.levelno == logging.WARNING
    assert "top-1 agreement 75.0% (on 16 rows of cal.npz)" in warning.getMessage()
    assert "accuracy not checked" in info.getMessage()


def test_a_plain_npy_file_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "cal.npz"
    with path.open("wb") as stream:
        np.save(stream, np.ones((2, 3)))
    with pytest.raises(ModelLoadError, match="holds one array, not named arrays"):
        load_calibration(context(tmp_path).config, path)
