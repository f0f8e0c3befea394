"""Reduced precision, backend-independent: the settings a model config gives, its calibration
data, and the accuracy guard that compares a reduced-precision model against fp32 at load.

Config ``parameters`` (every one optional):

- ``precision``: ``fp32`` (default) | ``fp16`` | ``bf16`` | ``int8``. The config's tensor
  datatypes stay what clients send and receive (usually FP32); the backend converts at the model
  boundary.
- ``calibration_data``: a ``.npz`` of representative inputs, one array per input name, rows along
  the first axis (the batch dimension of batching models); a relative path is taken from the model
  directory. int8 needs it (it is what the quantiser calibrates on); fp16/bf16 use it for the
  accuracy guard, which otherwise runs on seeded random inputs when every input is a fixed-shape
  float tensor, and is skipped (with a log line) when it cannot make inputs.
- ``accuracy_tolerance``: the largest relative error allowed against fp32, per output:
  ``||reduced - fp32|| / ||fp32||`` over every calibration row. Defaults: fp16 0.05, bf16 0.1,
  int8 0.25.
- ``accuracy_action``: ``refuse`` (default: the load fails, naming the output and the figures)
  or ``warn``.

The figures are logged at every load and exported as ``infermux_model_precision_error`` and
``infermux_model_precision_top1_agreement`` (:class:`PrecisionReport`).
"""

from __future__ import annotations

import enum
import logging
import math
import zipfile
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ModelContext
from infermux.backends.calibration_cache import CalibrationCache
from infermux.backends.paths import model_path_of
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig
from infermux.types import numpy_dtype

logger = logging.getLogger(__name__)

Arrays = dict[str, npt.NDArray[Any]]

PRECISION = "precision"
CALIBRATION_DATA = "calibration_data"
TOLERANCE = "accuracy_tolerance"
ACTION = "accuracy_action"

SYNTHETIC_ROWS = 8
"""Rows of seeded random input the guard makes when no calibration data is named."""


class Precision(str, enum.Enum):
    """The arithmetic a model runs in (its weights and activations)."""

    FP32 = "fp32"
    FP16 = "fp16"
    BF16 = "bf16"
    INT8 = "int8"


# Defaults that catch a broken conversion (an overflow, an operator that lost its meaning: errors
# near 1 or infinite) without refusing sound ones: deep networks with random weights, the
# harshest case, measured fp16 0.028, bf16 0.13 and int8 0.18 on ResNet-50
# (benchmarks/results/precision). Operators tune them to their model.
_DEFAULT_TOLERANCE = {Precision.FP16: 0.05, Precision.BF16: 0.1, Precision.INT8: 0.25}


@dataclass(frozen=True, slots=True)
class PrecisionSettings:
    """What a model config asks for; see the module docstring for the parameters."""

    precision: Precision = Precision.FP32
    calibration_data: Path | None = None
    tolerance: float = 0.0
    refuse: bool = True

    @property
    def reduced(self) -> bool:
        return self.precision is not Precision.FP32

    @classmethod
    def of(cls, context: ModelContext) -> PrecisionSettings:
        """Parse and check the parameters; raises :class:`ModelLoadError` naming the bad one."""
        config = context.config
        where = f"model '{config.name}'"
        value = config.parameters.get(PRECISION, "").strip().lower() or "fp32"
        try:
            precision = Precision(value)
        except ValueError:
            raise ModelLoadError(
                f"{where}: parameter {PRECISION} must be one of "
                f"{', '.join(p.value for p in Precision)}, got {value!r}"
            ) from None
        data = config.parameters.get(CALIBRATION_DATA, "").strip()
        path = None
        if data:
            # Relative to the model directory; an absolute path only if it lies inside it.
            path = model_path_of(
                context.model_path, context.model_path, data, f"parameter {CALIBRATION_DATA}",
                where=where,
            )  # fmt: skip
            if not path.is_file():
                raise ModelLoadError(f"{where}: parameter {CALIBRATION_DATA}: {path} not found")
        if precision is Precision.INT8 and path is None:
            raise ModelLoadError(
                f"{where}: precision int8 needs parameter {CALIBRATION_DATA} (a .npz of "
                "representative inputs, one array per input name) to calibrate on"
            )
        text = config.parameters.get(TOLERANCE, "").strip()
        tolerance = _DEFAULT_TOLERANCE.get(precision, 0.0)
        if text:
            try:
                tolerance = float(text)
            except ValueError:
                tolerance = math.nan
            if not math.isfinite(tolerance) or tolerance < 0:
                raise ModelLoadError(
                    f"{where}: parameter {TOLERANCE} must be a number >= 0 (a relative error, "
                    f"e.g. 0.01), got {text!r}"
                )
        action = config.parameters.get(ACTION, "").strip().lower() or "refuse"
        if action not in ("refuse", "warn"):
            raise ModelLoadError(
                f"{where}: parameter {ACTION} must be 'refuse' or 'warn', got {action!r}"
            )
        return cls(precision, path, tolerance, action == "refuse")

    def refuse_unless(self, allowed: tuple[Precision, ...], config: ModelConfig, why: str) -> None:
        """Refuse a precision this backend cannot run, saying why."""
        if self.precision not in allowed:
            self.unavailable(config, why)

    def unavailable(self, config: ModelConfig, why: str) -> NoReturn:
        """Refuse this precision here (on this device, for this kind of file), saying why."""
        raise ModelLoadError(
            f"model '{config.name}': precision {self.precision.value} is not available: {why}"
        )


@dataclass(frozen=True, slots=True)
class OutputAccuracy:
    """One output of the reduced model against fp32 over the calibration rows."""

    relative_error: float
    top1_agreement: float | None
    """Share of rows whose arg-max along the last axis agrees (None: no class axis)."""


@dataclass(frozen=True, slots=True)
class Accuracy:
    """The guard's figures, by output name, and the rows they were measured on."""

    outputs: Mapping[str, OutputAccuracy]
    rows: int
    source: str
    """Where the inputs came from: the calibration file's name or ``random``."""

    def worst(self) -> tuple[str, float]:
        """The output with the largest relative error, and that error."""
        name = max(self.outputs, key=lambda n: self.outputs[n].relative_error)
        return name, self.outputs[name].relative_error

    def describe(self) -> str:
        parts = []
        for name, figures in sorted(self.outputs.items()):
            text = f"{name}: relative error {figures.relative_error:.3g}"
            if figures.top1_agreement is not None:
                text += f", top-1 agreement {figures.top1_agreement:.1%}"
            parts.append(text)
        return f"{'; '.join(parts)} (on {self.rows} rows of {self.source})"

    def to_json(self) -> dict[str, Any]:
        return {
            "rows": self.rows,
            "source": self.source,
            "outputs": {
                name: {"relative_error": o.relative_error, "top1_agreement": o.top1_agreement}
                for name, o in self.outputs.items()
            },
        }

    @classmethod
    def from_json(cls, document: Mapping[str, Any]) -> Accuracy:
        outputs = {
            str(name): OutputAccuracy(float(o["relative_error"]), _optional(o["top1_agreement"]))
            for name, o in document["outputs"].items()
        }
        return cls(outputs, int(document["rows"]), str(document["source"]))


@dataclass(frozen=True, slots=True)
class PrecisionReport:
    """What an instance reports about its precision (for logs, metrics and tests)."""

    precision: Precision = Precision.FP32
    accuracy: Accuracy | None = None
    cache: str = ""
    """The calibration cache at load: ``hit``, ``miss``, ``corrupt`` (discarded, rebuilt) or
    ``""`` (no cached artifact for this precision)."""
    details: Mapping[str, str] = field(default_factory=dict)


def load_calibration(config: ModelConfig, path: Path) -> Arrays:
    """The calibration inputs of ``path``, checked against the config: every required input
    present, datatype convertible, shape matching past the row axis, the same row count."""
    where = f"model '{config.name}': parameter {CALIBRATION_DATA} ({path})"
    try:
        # Opened here, not by np.load, which leaks the file when it is not a zip archive.
        with path.open("rb") as stream:
            archive = np.load(stream, allow_pickle=False)
            if not isinstance(archive, np.lib.npyio.NpzFile):
                raise ValueError("it holds one array, not named arrays (np.savez writes .npz)")
            with archive:
                arrays = {name: archive[name] for name in archive.files}
    except (OSError, ValueError, zipfile.BadZipFile, EOFError) as exc:
        raise ModelLoadError(f"{where}: not a readable .npz: {exc}") from exc
    data: Arrays = {}
    rows = None
    for tensor in config.inputs:
        array = arrays.pop(tensor.name, None)
        if array is None:
            if tensor.optional:
                continue
            raise ModelLoadError(
                f"{where}: no array for input '{tensor.name}' (arrays: "
                f"{', '.join(sorted(arrays)) or 'none'})"
            )
        dtype = numpy_dtype(tensor.datatype)
        if dtype.kind == "O" or not np.can_cast(array.dtype, dtype, casting="same_kind"):
            raise ModelLoadError(
                f"{where}: array '{tensor.name}' is {array.dtype}, which does not convert to the "
                f"input's {tensor.datatype}"
            )
        dims = tensor.reshape if tensor.reshape is not None else tensor.dims
        shape = array.shape[1:]
        if (
            array.ndim == 0
            or len(shape) != len(dims)
            or any(d >= 0 and d != s for d, s in zip(dims, shape, strict=True))
        ):
            raise ModelLoadError(
                f"{where}: array '{tensor.name}' has shape {list(array.shape)}; expected "
                f"[rows, {', '.join(map(str, dims))}]"
            )
        if rows is not None and array.shape[0] != rows:
            raise ModelLoadError(f"{where}: arrays have different row counts")
        rows = array.shape[0]
        data[tensor.name] = np.ascontiguousarray(array.astype(dtype, copy=False))
    if arrays:
        raise ModelLoadError(f"{where}: arrays {', '.join(sorted(arrays))} are not inputs")
    if not rows:
        raise ModelLoadError(f"{where}: no rows to calibrate on")
    return data


def synthetic_inputs(config: ModelConfig) -> Arrays | None:
    """Seeded standard-normal rows for a model whose inputs are all fixed-shape floats; None
    when the guard cannot make inputs it could trust (integers, strings, dynamic shapes)."""
    rng = np.random.default_rng(0)
    data: Arrays = {}
    for tensor in config.inputs:
        dtype = numpy_dtype(tensor.datatype)
        dims = tensor.reshape if tensor.reshape is not None else tensor.dims
        if dtype.kind != "f" or any(d < 0 for d in dims):
            return None
        data[tensor.name] = rng.standard_normal((SYNTHETIC_ROWS, *dims)).astype(dtype)
    return data


def guard_inputs(config: ModelConfig, settings: PrecisionSettings) -> tuple[Arrays, str] | None:
    """The inputs the accuracy guard runs on, and where they came from (None: none)."""
    if settings.calibration_data is not None:
        return load_calibration(config, settings.calibration_data), settings.calibration_data.name
    data = synthetic_inputs(config)
    return (data, "random") if data is not None else None


def batches(config: ModelConfig, data: Mapping[str, npt.NDArray[Any]]) -> Iterator[Arrays]:
    """The rows of ``data`` in batches the model accepts: up to ``max_batch_size`` rows for a
    batching model, one row at a time (without the row axis) for a non-batching one."""
    rows = len(next(iter(data.values())))
    step = max(config.max_batch_size, 1)
    for start in range(0, rows, step if config.batching else 1):
        if config.batching:
            yield {name: array[start : start + step] for name, array in data.items()}
        else:
            yield {name: array[start] for name, array in data.items()}


def run_rows(
    config: ModelConfig, run: Callable[[Arrays], Mapping[str, Any]], data: Mapping[str, Any]
) -> Arrays:
    """Every calibration row through ``run``, outputs gathered back along the row axis."""
    parts: dict[str, list[npt.NDArray[Any]]] = {t.name: [] for t in config.outputs}
    for batch in batches(config, data):
        outputs = run(batch)
        for name, chunk in parts.items():
            if name in outputs:
                value = np.asarray(outputs[name])
                chunk.append(value if config.batching else value[np.newaxis])
    return {name: np.concatenate(chunk) for name, chunk in parts.items() if chunk}


def compare(
    reference: Mapping[str, npt.NDArray[Any]],
    reduced: Mapping[str, npt.NDArray[Any]],
    source: str,
) -> Accuracy:
    """The reduced model's outputs against fp32's, output by output (floats only: an integer
    output, e.g. a class index, is compared as agreement). The outputs are :func:`run_rows`'s,
    one row per guard row along the first axis."""
    first = np.asarray(next(iter(reference.values()))) if reference else np.empty(0)
    rows = len(first) if first.ndim else 1
    outputs = {}
    for name, expected in reference.items():
        got = reduced.get(name)
        if got is None:
            continue
        exact = np.asarray(expected, np.float64)
        approx = np.asarray(got, np.float64)
        if exact.shape != approx.shape:
            raise ModelLoadError(
                f"output '{name}' has shape {list(approx.shape)} at reduced precision but "
                f"{list(exact.shape)} at fp32"
            )
        if np.asarray(expected).dtype.kind != "f":
            outputs[name] = OutputAccuracy(float(np.mean(exact != approx)), None)
            continue
        scale = float(np.linalg.norm(exact))
        error = float(np.linalg.norm(approx - exact))
        relative = error / scale if scale > 0 else error
        if not math.isfinite(relative):  # NaN/inf from an fp16 overflow is the worst error
            relative = math.inf
        agreement = None
        if exact.ndim >= 2 and exact.shape[-1] > 1:
            agreement = float(np.mean(exact.argmax(-1) == approx.argmax(-1)))
        outputs[name] = OutputAccuracy(relative, agreement)
    return Accuracy(outputs, rows, source)


def check(context: ModelContext, settings: PrecisionSettings, accuracy: Accuracy | None) -> None:
    """Log the guard's figures; refuse the load (or warn) beyond the tolerance."""
    config = context.config
    where = f"model '{config.name}' version {context.version} at {settings.precision.value}"
    if accuracy is None or not accuracy.outputs:
        logger.info(
            "%s: accuracy not checked (no %s, and the inputs are not all fixed-shape floats "
            "that random rows could stand in for)",
            where,
            CALIBRATION_DATA,
        )
        return
    name, error = accuracy.worst()
    if error <= settings.tolerance:
        logger.info("%s against fp32: %s", where, accuracy.describe())
        return
    message = (
        f"{where}: output '{name}' differs from fp32 by a relative error of {error:.3g}, over "
        f"the {TOLERANCE} of {settings.tolerance:g} ({accuracy.describe()})"
    )
    if settings.refuse:
        raise ModelLoadError(f"{message}; set {ACTION} 'warn' to serve it anyway")
    logger.warning("%s; serving it anyway (%s is 'warn')", message, ACTION)


def cached_artifact(
    context: ModelContext,
    settings: PrecisionSettings,
    cache: CalibrationCache,
    build: Callable[[Path], Mapping[str, Any]],
) -> tuple[Path, PrecisionReport]:
    """The cache's artifact, built by ``build`` (which records ``accuracy``) when missing or
    corrupt; the recorded figures are checked against today's tolerance."""
    entry = cache.get_or_build(build)
    recorded = entry.meta.get("accuracy")
    accuracy = Accuracy.from_json(recorded) if recorded else None
    check(context, settings, accuracy)
    details = {"cache": str(cache.path)}
    return entry.artifact, PrecisionReport(settings.precision, accuracy, entry.outcome, details)


def _optional(value: Any) -> float | None:
    return None if value is None else float(value)
