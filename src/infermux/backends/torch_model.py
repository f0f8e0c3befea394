"""A PyTorch model file loaded at its configured precision (see :mod:`.precision`).

- ``fp16`` / ``bf16``: the weights are cast once, at load; :meth:`TorchModel.forward` casts the
  float inputs to that dtype and the float outputs back to the config's datatypes, inside the
  forward pass, so a captured CUDA graph holds the casts too.
- ``int8``: static quantisation of a TorchScript model on the CPU through
  ``torch.ao.quantization.quantize_jit`` (observers calibrated on ``calibration_data``), with the
  process's quantised engine (x86/fbgemm, or qnnpack on ARM). The quantised module is kept in the
  calibration cache. torch.ao's int8 kernels are CPU-only, and ``torch.export`` programs would need
  torchao's PT2E flow, so int8 on a GPU or for a ``.pt2`` file is refused, saying what to use.

Before the weights are cast (or quantised) the fp32 model runs the guard's inputs once, so the
accuracy guard compares against the very model that was loaded, with no second copy in memory.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from infermux.backends.base import ModelContext
from infermux.backends.calibration_cache import CalibrationCache, cache_key
from infermux.backends.precision import (
    Arrays,
    Precision,
    PrecisionReport,
    PrecisionSettings,
    batches,
    cached_artifact,
    check,
    compare,
    guard_inputs,
    load_calibration,
    run_rows,
)
from infermux.backends.torch_signature import Signature
from infermux.backends.torch_tensors import to_numpy, to_torch
from infermux.errors import InfermuxError, ModelLoadError
from infermux.types import numpy_dtype

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Loader = Callable[[str, "torch.device"], Callable[..., Any]]


@dataclass
class TorchModel:
    """The loaded module, the dtype its float tensors run in (None: as the file has them) and
    what the load found out about its precision."""

    module: Callable[..., Any]
    signature: Signature
    dtype: torch.dtype | None = None
    """Float inputs are cast to it and float outputs back to the config's datatypes (None: no
    casts, the file and the config agree)."""
    report: PrecisionReport = field(default_factory=PrecisionReport)

    def forward(
        self, tensors: Mapping[str, torch.Tensor], call: Callable[..., Any]
    ) -> dict[str, Any]:
        """``call(module, *args, **kwargs)`` on ``tensors``, with the precision's casts at the
        boundary; returns output tensors by config name."""
        if self.dtype is not None:
            tensors = {key: self._cast(value) for key, value in tensors.items()}
        args, kwargs = self.signature.arguments(tensors)
        outputs = self.signature.outputs(call(self.module, *args, **kwargs))
        if self.dtype is not None:
            for tensor in self.signature.config.outputs:
                value = outputs.get(tensor.name)
                if value is not None and value.is_floating_point():
                    outputs[tensor.name] = value.to(_torch_dtype(tensor.datatype))
        return outputs

    def _cast(self, value: torch.Tensor) -> torch.Tensor:
        return value.to(self.dtype) if value.is_floating_point() else value


def load(
    context: ModelContext,
    settings: PrecisionSettings,
    path: str,
    device: torch.device,
    loader: Loader,
    *,
    exported: bool,
) -> TorchModel:
    """``path`` loaded on ``device`` at ``settings``' precision, checked by the accuracy guard."""
    import torch

    config = context.config
    signature = Signature.of(config)
    if settings.precision is Precision.INT8:
        if device.type != "cpu":
            settings.unavailable(
                config,
                "torch.ao's int8 kernels run on the CPU only: use KIND_CPU instances, "
                "or serve an ONNX model with the onnxruntime backend",
            )
        if exported:
            settings.unavailable(
                config,
                "int8 quantisation of torch.export programs needs torchao's PT2E "
                "flow; serve the model as TorchScript (model.pt) or as ONNX",
            )
        return _quantized(context, settings, signature, path, loader)
    model = TorchModel(loader(path, device), signature)
    if not settings.reduced:
        return model
    dtype = torch.float16 if settings.precision is Precision.FP16 else torch.bfloat16
    if device.type == "cpu":
        # Served as asked, but the operator should know: most CPU kernels for half types are
        # slower than fp32 (bf16 is fast only with AVX512-BF16 or AMX).
        logger.warning(
            "model '%s': %s on a CPU instance usually runs slower than fp32; reduced precision "
            "pays on GPUs (or use int8 on CPUs)",
            config.name,
            settings.precision.value,
        )
    inputs = guard_inputs(config, settings)
    # The reference is the file's own fp32, whatever datatypes the config gives clients (FP16
    # inputs, say, for a model served in fp16 end to end).
    model.dtype = torch.float32
    reference = _run(model, device, inputs[0]) if inputs else None
    to: Callable[[torch.dtype], Callable[..., Any]] = model.module.to  # type: ignore[attr-defined]
    model.module, model.dtype = to(dtype), dtype
    accuracy = None
    if inputs is not None and reference is not None:
        accuracy = compare(reference, _run(model, device, inputs[0]), inputs[1])
    check(context, settings, accuracy)
    model.report = PrecisionReport(settings.precision, accuracy)
    return model


def _quantized(
    context: ModelContext,
    settings: PrecisionSettings,
    signature: Signature,
    path: str,
    loader: Loader,
) -> TorchModel:
    import torch

    config = context.config
    cpu = torch.device("cpu")
    engine = str(torch.backends.quantized.engine)
    calibration = settings.calibration_data
    assert calibration is not None  # PrecisionSettings insists on it for int8
    files = [Path(path), calibration]
    key = cache_key("pytorch-int8", files, {"engine": engine}, {"torch": torch.__version__})
    cache = CalibrationCache(context, "pytorch-int8", key, "model.pt")

    def build(artifact: Path) -> Mapping[str, Any]:
        from torch.ao import quantization

        data = load_calibration(config, calibration)
        # Float tensors meet the quantised model as fp32 (its float boundary), whatever the config's
        # datatypes: quantize/dequantize nodes take fp32.
        model = TorchModel(loader(path, cpu), signature, torch.float32)
        if not isinstance(model.module, torch.jit.ScriptModule):
            raise ModelLoadError(f"model '{config.name}': int8 needs a TorchScript module")
        reference = _run(model, cpu, data)

        def calibrate(module: Any, rows: Arrays) -> None:
            observed = TorchModel(module, signature, torch.float32)
            for batch in batches(config, rows):
                observed.forward(_tensors(batch, cpu), _call)

        _quiet_quantization()
        try:
            # torch.ao's JIT quantisation API has no annotations.
            qconfig = quantization.get_default_qconfig(engine)  # type: ignore[no-untyped-call]
            quantize: Callable[..., Any] = quantization.quantize_jit
            quantized = quantize(model.module, {"": qconfig}, calibrate, [data])
        except InfermuxError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"model '{config.name}': torch.ao could not quantise {path} to int8: {exc}"
            ) from exc
        reduced = _run(TorchModel(quantized, signature, torch.float32), cpu, data)
        accuracy = compare(reference, reduced, calibration.name)
        torch.jit.save(quantized, str(artifact))
        return {"accuracy": accuracy.to_json(), "settings": {"engine": engine}}

    artifact, report = cached_artifact(context, settings, cache, build)
    return TorchModel(loader(str(artifact), cpu), signature, torch.float32, report)


def _run(model: TorchModel, device: torch.device, data: Arrays) -> Arrays:
    """Every row of ``data`` through ``model`` on ``device``, outputs back on the host."""
    import torch

    def run(batch: Arrays) -> Mapping[str, Any]:
        outputs = model.forward(_tensors(batch, device), _call)
        return {name: to_numpy(value) for name, value in outputs.items()}

    try:
        with torch.inference_mode():
            return run_rows(model.signature.config, run, data)
    except InfermuxError as exc:
        raise ModelLoadError(f"the accuracy guard could not run the model: {exc}") from exc
    except Exception as exc:
        raise ModelLoadError(
            f"model '{model.signature.config.name}' failed on the accuracy guard's inputs"
            f"{f' at {model.dtype}' if model.dtype else ''}: {reason(exc)}"
        ) from exc


def _tensors(batch: Arrays, device: torch.device) -> dict[str, torch.Tensor]:
    return {name: to_torch(array, device) for name, array in batch.items()}


def _call(module: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    return module(*args, **kwargs)


def _torch_dtype(datatype: str) -> torch.dtype:
    import torch

    dtype: torch.dtype = getattr(torch, numpy_dtype(datatype).name)
    return dtype


def _quiet_quantization() -> None:
    """torch.ao's JIT quantisation warns about its own deprecations and internals, addressed to
    its developers; targeted, permanent filters, as catch_warnings() is not thread-safe."""
    for message in (
        r"Please use quant_min and quant_max",
        r"The \.grad attribute of a Tensor that is not a leaf",
        r"`torch\.jit\.(script|save|load|freeze)` is deprecated",
    ):
        warnings.filterwarnings("ignore", message=message)


def reason(exc: BaseException) -> str:
    """An exception's message without the TorchScript or C++ traces that torch appends."""
    text = str(exc).strip()
    if text.startswith("The following operation failed in the TorchScript interpreter"):
        text = text.splitlines()[-1]  # the model's own error comes last, after its traceback
    text = text.split("\nException raised from", 1)[0]  # TORCH_SHOW_CPP_STACKTRACES=1
    return text or type(exc).__name__
