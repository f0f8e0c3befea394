"""Reduced precision for the ONNX Runtime backend: the model file a session should load.

- ``fp16``: the graph converted by onnxruntime's own float16 converter; inputs and outputs stay
  fp32 (casts are inserted at the boundary) unless the config declares them FP16.
- ``int8``: static QDQ quantisation (``onnxruntime.quantization.quantize_static``) calibrated on
  the ``calibration_data`` rows: the format every execution provider reads, TensorRT's included.
  ``int8_per_channel`` (default true) quantises weights per output channel;
  ``int8_calibration_method`` is ``minmax`` (default), ``entropy`` or ``percentile``;
  ``int8_activation_type`` is ``uint8`` (default on the CPU) or ``int8`` (default on a GPU).
  Weights are always signed. The defaults are measured, not guessed: on a VNNI/AMX Xeon, ResNet-50
  with uint8 activations ran 3.4x fp32's images/s, with int8 activations 0.4x (ORT's x86 kernels
  are u8s8), while TensorRT takes only symmetric (signed) activations.
- ``bf16`` is refused: ONNX Runtime has bfloat16 kernels for too few operators to run a converted
  graph (PyTorch or TensorRT serve bf16).

Both artifacts go through the calibration cache, with the accuracy figures measured when they were
built, so a cached load neither converts, calibrates nor re-measures.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from infermux.backends.base import ModelContext
from infermux.backends.calibration_cache import CalibrationCache, cache_key
from infermux.backends.precision import (
    Arrays,
    Precision,
    PrecisionReport,
    PrecisionSettings,
    batches,
    cached_artifact,
    compare,
    guard_inputs,
    run_rows,
)
from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig

logger = logging.getLogger(__name__)

SessionFactory = Callable[[str], Any]
"""Makes an ``InferenceSession`` of a model file with the instance's options and providers."""

_METHODS = {"minmax": "MinMax", "entropy": "Entropy", "percentile": "Percentile"}
_ACTIVATIONS = {"uint8": "QUInt8", "int8": "QInt8"}
_FLOATS = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64}


def prepare(
    context: ModelContext, path: str, ort: Any, session: SessionFactory
) -> tuple[str, PrecisionReport]:
    """The file the instance's session loads (``path`` itself at fp32) and what to report."""
    config = context.config
    settings = PrecisionSettings.of(context)
    if not settings.reduced:
        return path, PrecisionReport()
    settings.refuse_unless(
        (Precision.FP16, Precision.INT8),
        config,
        "onnxruntime has bfloat16 kernels for too few operators; serve bf16 with the PyTorch "
        "or TensorRT backend",
    )
    options = _int8_options(config.name, config.parameters, context.device)
    if settings.precision is Precision.FP16:
        options = {}
    source = Path(path)
    files = [source] + ([settings.calibration_data] if settings.calibration_data else [])
    kind = f"onnxruntime-{settings.precision.value}"
    libraries = {"onnxruntime": ort.__version__, "onnx": _onnx().__version__}
    key = cache_key(kind, files, {"precision": settings.precision.value, **options}, libraries)
    cache = CalibrationCache(context, kind, key, "model.onnx")

    def build(artifact: Path) -> Mapping[str, Any]:
        inputs = guard_inputs(config, settings)
        if settings.precision is Precision.INT8:
            assert inputs is not None  # int8 cannot be asked for without calibration data
            _quantize(config, source, artifact, inputs[0], options)
        else:
            # Inputs and outputs keep fp32 unless the config declares them FP16.
            keep = [t.name for t in (*config.inputs, *config.outputs) if t.datatype != "FP16"]
            _to_fp16(source, artifact, keep)
        accuracy = None
        if inputs is not None:
            data, origin = inputs
            reference = run_rows(config, _runner(session(path), config), data)
            reduced = run_rows(config, _runner(session(str(artifact)), config), data)
            accuracy = compare(reference, reduced, origin)
        return {"accuracy": accuracy.to_json() if accuracy else None, "settings": options}

    artifact, report = cached_artifact(context, settings, cache, build)
    return str(artifact), report


def _runner(session: Any, config: ModelConfig) -> Callable[[Arrays], Mapping[str, Any]]:
    names = [t.name for t in config.outputs]
    # Float inputs in the session's own types: the fp32 reference of a model whose config
    # declares FP16 inputs (served in fp16 end to end) takes fp32.
    floats = {arg.name: _FLOATS[arg.type] for arg in session.get_inputs() if arg.type in _FLOATS}

    def run(batch: Arrays) -> Mapping[str, Any]:
        feed = {k: v.astype(floats[k], copy=False) if k in floats else v for k, v in batch.items()}
        return dict(zip(names, session.run(names, feed), strict=True))

    return run


def _int8_options(model: str, parameters: Mapping[str, str], device: str) -> dict[str, str]:
    per_channel = parameters.get("int8_per_channel", "true").strip().lower()
    if per_channel not in ("true", "false"):
        raise ModelLoadError(
            f"model '{model}': parameter int8_per_channel must be 'true' or 'false', "
            f"got {per_channel!r}"
        )
    method = parameters.get("int8_calibration_method", "minmax").strip().lower()
    if method not in _METHODS:
        raise ModelLoadError(
            f"model '{model}': parameter int8_calibration_method must be one of "
            f"{', '.join(_METHODS)}, got {method!r}"
        )
    default = "uint8" if device == "cpu" else "int8"
    activations = parameters.get("int8_activation_type", default).strip().lower()
    if activations not in _ACTIVATIONS:
        raise ModelLoadError(
            f"model '{model}': parameter int8_activation_type must be 'uint8' or 'int8', "
            f"got {activations!r}"
        )
    return {"per_channel": per_channel, "calibration_method": method, "activations": activations}


def _quantize(
    config: ModelConfig, source: Path, target: Path, data: Arrays, options: Mapping[str, str]
) -> None:
    from onnxruntime import quantization

    class Reader(quantization.CalibrationDataReader):  # type: ignore[misc]
        """The calibration rows in the batches the model takes."""

        def __init__(self) -> None:
            self._batches = batches(config, data)

        def get_next(self) -> dict[str, Any] | None:
            return next(self._batches, None)

    # onnxruntime's recommended first step: shape inference plus graph optimisation (folding
    # batch norms into convolutions, ...), so that quantisation sees the graph that will run.
    prepared = target.with_name("preprocessed.onnx")
    try:
        from onnxruntime.quantization.shape_inference import quant_pre_process

        quant_pre_process(str(source), str(prepared))
    except Exception as exc:
        logger.info("onnxruntime's quantisation pre-processing failed, skipping it: %s", exc)
        prepared = source
    try:
        quantization.quantize_static(
            str(prepared),
            str(target),
            Reader(),
            quant_format=quantization.QuantFormat.QDQ,
            per_channel=options["per_channel"] == "true",
            activation_type=getattr(quantization.QuantType, _ACTIVATIONS[options["activations"]]),
            weight_type=quantization.QuantType.QInt8,
            calibrate_method=getattr(
                quantization.CalibrationMethod, _METHODS[options["calibration_method"]]
            ),
        )
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime could not quantise {source} to int8: {exc}") from exc
    finally:
        if prepared != source:
            prepared.unlink(missing_ok=True)


def _to_fp16(source: Path, target: Path, keep: list[str]) -> None:
    onnx = _onnx()
    from onnxruntime.transformers.float16 import convert_float_to_float16

    try:
        converted = convert_float_to_float16(onnx.load(str(source)), keep_io_types=keep)
        onnx.save(converted, str(target))
    except Exception as exc:
        raise ModelLoadError(f"onnxruntime could not convert {source} to fp16: {exc}") from exc


def _onnx() -> Any:
    try:
        import onnx
    except ImportError as exc:
        raise ModelLoadError(
            f"reduced precision with onnxruntime needs the onnx package ({exc}); install it "
            "with: pip install 'infermux[onnx]'"
        ) from exc
    return onnx
