"""The ONNX Runtime backend: ``platform: "onnxruntime_onnx"`` with ``<version>/model.onnx``.

One ``InferenceSession`` per instance. Execution providers come from the instance's device and
Triton's ``optimization.execution_accelerators``; session options from ``optimization.graph.level``
and the ``parameters`` Triton's ONNX Runtime backend reads (``intra_op_thread_count``, ...).
Reduced precision (``precision``: fp16 or int8, with a calibration cache) is in
:mod:`~infermux.backends.onnx_precision`. onnxruntime is imported when a model loads, so infermux
runs without the ``onnx`` extra until an ONNX model is served.
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping, Sequence
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest, model_file
from infermux.backends.onnx_precision import prepare
from infermux.backends.tensor import Arrays, StackedInstance
from infermux.errors import InternalError, InvalidArgumentError, ModelLoadError
from infermux.model_config import ModelConfig, TensorConfig

DEFAULT_FILENAME = "model.onnx"

# V2 datatype -> the type string onnxruntime reports ("tensor(int32)") where the names differ.
_ONNX = {
    "FP16": "float16",
    "FP32": "float",
    "FP64": "double",
    "BF16": "bfloat16",
    "BYTES": "string",
}
_BFLOAT16 = 16  # onnx.TensorProto.BFLOAT16; numpy has no bfloat16, so ORT is told the type

# Triton's graph.level: -1 basic, 1 extended, 2 none; 0 (and anything else) enables everything.
_GRAPH_LEVELS = {-1: "ORT_ENABLE_BASIC", 1: "ORT_ENABLE_EXTENDED", 2: "ORT_DISABLE_ALL"}

# Triton's names for TensorRT options that differ from ORT's; keys starting "trt_" pass through.
_TRT_OPTIONS = {
    "max_workspace_size_bytes": "trt_max_workspace_size",
    "int8_calibration_table_name": "trt_int8_calibration_table_name",
    "int8_use_native_calibration_table": "trt_int8_use_native_calibration_table",
}


def onnx_type(datatype: str) -> str:
    """The type string onnxruntime reports for a tensor of V2 ``datatype``."""
    return f"tensor({_ONNX.get(datatype, datatype.lower())})"


class OnnxRuntimeBackend:
    """Loads ``model.onnx`` into one ``onnxruntime.InferenceSession`` per instance."""

    name = "onnxruntime"
    stacks_inputs = True

    def load(self, context: ModelContext) -> OnnxRuntimeInstance:
        try:
            import onnxruntime
        except ImportError as exc:
            raise ModelLoadError(
                f"model '{context.config.name}': onnxruntime is not installed ({exc}); "
                "install it with: pip install 'infermux[onnx]'"
            ) from exc
        return OnnxRuntimeInstance(context, onnxruntime)


class OnnxRuntimeInstance(StackedInstance):
    """One session. Numeric models run through IO binding (on GPU: inputs copied from host by ORT,
    outputs left on the device and copied back once each); models with string tensors use
    ``session.run``, because ORT cannot bind string tensors."""

    def __init__(self, context: ModelContext, ort: Any) -> None:
        super().__init__(context)
        config = context.config
        where = f"model '{config.name}' version {context.version}"
        path = model_file(context, DEFAULT_FILENAME)
        kinds = {t.name: t.datatype for t in (*config.inputs, *config.outputs)}
        self._strings = {name for name, datatype in kinds.items() if datatype == "BYTES"}
        self._bf16 = {name for name, datatype in kinds.items() if datatype == "BF16"}
        self._string_inputs = [t.name for t in config.inputs if t.datatype == "BYTES"]
        if self._strings and self._bf16:
            raise ModelLoadError(
                f"{where}: onnxruntime's Python API cannot run a model with both string and BF16 "
                "tensors (strings need session.run, which has no bfloat16 numpy type)"
            )
        self._device_id = _device_id(context.device)
        providers = _providers(ort, context, self._device_id)

        def session(file: str) -> Any:
            try:
                return ort.InferenceSession(
                    file, sess_options=_session_options(ort, config), providers=providers
                )
            except Exception as exc:
                raise ModelLoadError(f"{where}: cannot load {file}: {exc}") from exc

        path, self.precision_report = prepare(context, path, ort, session)
        self.session: Any = session(path)
        # ORT falls back to the CPU (with only a log line) when a provider's libraries fail to
        # load; a model configured for a GPU must not silently run on the CPU.
        dropped = [name for name, _ in providers if name not in self.session.get_providers()]
        if dropped:
            raise ModelLoadError(
                f"{where}: onnxruntime could not enable {', '.join(dropped)} (see its log above)"
            )
        _check_tensors(config, self.session, where)
        self._ort = ort
        self._outputs = [t.name for t in config.outputs]
        self._output_device = "cpu" if self._device_id is None else "cuda"

    def execute(self, requests: Sequence[ModelRequest]) -> Sequence[ExecuteResult]:
        if not self._string_inputs:
            return super().execute(requests)
        # ORT string tensors take Python str; a request whose bytes are not UTF-8 fails alone.
        results: list[ExecuteResult] = []
        good: list[ModelRequest] = []
        for request in requests:
            try:
                inputs = {
                    name: _to_str(name, array) if name in self._string_inputs else array
                    for name, array in request.inputs.items()
                }
            except InvalidArgumentError as exc:
                results.append(exc)
                continue
            results.append({})  # placeholder, filled from the batch below
            good.append(dataclasses.replace(request, inputs=inputs))
        answers = iter(super().execute(good) if good else ())
        return [result if isinstance(result, Exception) else next(answers) for result in results]

    def run(self, inputs: Mapping[str, npt.NDArray[np.generic]]) -> Mapping[str, npt.ArrayLike]:
        try:
            if self._strings:
                values = self.session.run(self._outputs, dict(inputs))
            else:
                values = self._run_bound(inputs)
        except Exception as exc:
            raise InternalError(f"model '{self.config.name}': onnxruntime failed: {exc}") from exc
        outputs: Arrays = dict(zip(self._outputs, values, strict=True))
        for name in self._strings.intersection(outputs):
            outputs[name] = _to_bytes(outputs[name])
        return outputs

    def _run_bound(self, inputs: Mapping[str, npt.NDArray[np.generic]]) -> list[Any]:
        binding = self.session.io_binding()
        device_id = self._device_id or 0
        values = []  # the bound host buffers must outlive the run
        for name, given in inputs.items():
            array = np.ascontiguousarray(given)
            # OrtValues (not bind_cpu_input) so that overridable initializers can be fed too.
            if name in self._bf16:
                value = self._ort.OrtValue.ortvalue_from_numpy_with_onnx_type(
                    array.view(np.uint16), onnx_element_type=_BFLOAT16
                )
            else:
                value = self._ort.OrtValue.ortvalue_from_numpy(array)
            values.append(value)
            binding.bind_ortvalue_input(name, value)
        for name in self._outputs:
            # BF16 outputs are read from host memory (no numpy type to copy them into).
            device = "cpu" if name in self._bf16 else self._output_device
            binding.bind_output(name, device, device_id)
        self.session.run_with_iobinding(binding)
        binding.synchronize_outputs()
        return [
            _bf16_array(out) if name in self._bf16 else out.numpy()
            for name, out in zip(self._outputs, binding.get_outputs(), strict=True)
        ]

    def close(self) -> None:
        self.session = None


def _device_id(device: str) -> int | None:
    """The CUDA device ordinal of ``"cuda:N"``, None for the CPU."""
    if not device.startswith("cuda"):
        return None
    _, _, ordinal = device.partition(":")
    return int(ordinal or 0)


def _providers(
    ort: Any, context: ModelContext, device_id: int | None
) -> list[tuple[str, dict[str, str]]]:
    """Execution providers in priority order, each with its options; all must be available."""
    config = context.config
    accelerators = config.proto.optimization.execution_accelerators
    providers: list[tuple[str, dict[str, str]]] = []
    if device_id is not None:  # as in Triton, GPU accelerators only apply to GPU instances
        cuda = {"device_id": str(device_id)}
        for accelerator in accelerators.gpu_execution_accelerator:
            parameters = dict(accelerator.parameters)
            if accelerator.name == "tensorrt":
                trt = _trt_options(config.name, parameters, device_id)
                providers.append(("TensorrtExecutionProvider", trt))
            elif accelerator.name == "cuda":
                cuda.update(parameters)
            else:
                raise ModelLoadError(
                    f"model '{config.name}': unknown gpu_execution_accelerator "
                    f"'{accelerator.name}' (onnxruntime knows 'tensorrt' and 'cuda')"
                )
        providers.append(("CUDAExecutionProvider", cuda))
    for accelerator in accelerators.cpu_execution_accelerator:
        if accelerator.name != "openvino":
            raise ModelLoadError(
                f"model '{config.name}': unknown cpu_execution_accelerator '{accelerator.name}' "
                "(onnxruntime knows 'openvino')"
            )
        providers.append(("OpenVINOExecutionProvider", dict(accelerator.parameters)))
    providers.append(("CPUExecutionProvider", {}))
    available = list(ort.get_available_providers())
    missing = [name for name, _ in providers if name not in available]
    if missing:
        raise ModelLoadError(
            f"model '{config.name}' on {context.device}: {', '.join(missing)} not available in "
            f"this onnxruntime build (available: {', '.join(available)}); install a build that "
            "has it (e.g. onnxruntime-gpu) or change the config's optimization / instance_group"
        )
    return providers


def _trt_options(model: str, parameters: dict[str, str], device_id: int) -> dict[str, str]:
    options = {"device_id": str(device_id)}
    for key, value in parameters.items():
        if key == "precision_mode":
            if value.upper() not in ("FP32", "FP16", "INT8"):
                raise ModelLoadError(
                    f"model '{model}': tensorrt precision_mode must be FP32, FP16 or INT8, "
                    f"got '{value}'"
                )
            if value.upper() != "FP32":
                options[f"trt_{value.lower()}_enable"] = "True"
        elif key in _TRT_OPTIONS or key.startswith("trt_"):
            options[_TRT_OPTIONS.get(key, key)] = value
        else:
            raise ModelLoadError(
                f"model '{model}': unknown parameter '{key}' for the tensorrt accelerator"
            )
    return options


def _session_options(ort: Any, config: ModelConfig) -> Any:
    options = ort.SessionOptions()
    level = _GRAPH_LEVELS.get(config.proto.optimization.graph.level, "ORT_ENABLE_ALL")
    options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level)
    # One thread per session unless configured: every instance has its own worker thread, so
    # instances (and batching) already use the cores; per-session pools sized to all cores would
    # oversubscribe them as soon as two instances run at once.
    options.intra_op_num_threads = _int_parameter(config, "intra_op_thread_count", 1)
    options.inter_op_num_threads = _int_parameter(config, "inter_op_thread_count", 0)
    mode = _int_parameter(config, "execution_mode", 0, most=1)  # 0 sequential, 1 parallel
    options.execution_mode = (
        ort.ExecutionMode.ORT_PARALLEL if mode else ort.ExecutionMode.ORT_SEQUENTIAL
    )
    options.enable_cpu_mem_arena = bool(_int_parameter(config, "enable_mem_arena", 1, most=1))
    options.enable_mem_pattern = bool(_int_parameter(config, "enable_mem_pattern", 1, most=1))
    return options


def _int_parameter(config: ModelConfig, key: str, default: int, most: int = 1 << 16) -> int:
    value = config.parameters.get(key, "").strip() or str(default)
    if not value.isdigit() or int(value) > most:
        raise ModelLoadError(
            f"model '{config.name}': parameter '{key}' must be an integer in [0, {most}], "
            f"got '{value}'"
        )
    return int(value)


def _check_tensors(config: ModelConfig, session: Any, where: str) -> None:
    """The config's tensors must exist in the graph with the same element type and a compatible
    shape, and every input the graph requires must be declared."""
    required = {arg.name: arg for arg in session.get_inputs()}
    # Overridable initializers are graph inputs with a default value: optional by nature.
    inputs = {**{arg.name: arg for arg in session.get_overridable_initializers()}, **required}
    outputs = {arg.name: arg for arg in session.get_outputs()}
    for kind, tensors, graph in (
        ("input", config.inputs, inputs),
        ("output", config.outputs, outputs),
    ):
        for tensor in tensors:
            _check_tensor(config, kind, tensor, graph, where)
    undeclared = sorted(set(required) - {t.name for t in config.inputs})
    if undeclared:
        raise ModelLoadError(
            f"{where}: the ONNX graph requires input(s) {', '.join(undeclared)} that the config "
            "does not declare"
        )


def _check_tensor(
    config: ModelConfig, kind: str, tensor: TensorConfig, graph: dict[str, Any], where: str
) -> None:
    arg = graph.get(tensor.name)
    if arg is None:
        raise ModelLoadError(
            f"{where}: {kind} '{tensor.name}' is not in the ONNX graph (its {kind}s: "
            f"{', '.join(sorted(graph)) or 'none'})"
        )
    expected = onnx_type(tensor.datatype)
    if arg.type != expected:
        raise ModelLoadError(
            f"{where}: {kind} '{tensor.name}' is {tensor.datatype} ({expected}) in the config but "
            f"{arg.type} in the ONNX graph"
        )
    dims = tensor.reshape if tensor.reshape is not None else tensor.dims
    wanted = ((-1,) if config.batching else ()) + dims
    # Symbolic dims are -1; no shape (or rank 0, how some exporters write "unknown") is not checked.
    shape = [d if isinstance(d, int) and d >= 0 else -1 for d in arg.shape or []]
    if shape and (
        len(shape) != len(wanted)
        or any(-1 not in (w, g) and w != g for w, g in zip(wanted, shape, strict=False))
    ):
        raise ModelLoadError(
            f"{where}: {kind} '{tensor.name}' has shape {list(wanted)} in the config (batch "
            f"dimension included) but {arg.shape} in the ONNX graph"
        )


def _to_str(name: str, array: npt.NDArray[np.generic]) -> npt.NDArray[np.object_]:
    out = np.empty(array.size, dtype=np.object_)
    try:
        out[:] = [x.decode() if isinstance(x, bytes) else str(x) for x in array.reshape(-1)]
    except UnicodeDecodeError as exc:
        raise InvalidArgumentError(
            f"input '{name}' is not UTF-8 ({exc}), which ONNX string tensors need"
        ) from None
    return out.reshape(array.shape)


def _to_bytes(array: npt.NDArray[np.generic]) -> npt.NDArray[np.object_]:
    out = np.empty(array.size, dtype=np.object_)
    out[:] = [x.encode() if isinstance(x, str) else x for x in array.reshape(-1)]
    return out.reshape(array.shape)


def _bf16_array(value: Any) -> npt.NDArray[np.generic]:
    """Copy a host-resident bfloat16 OrtValue (``OrtValue.numpy()`` cannot) into an array."""
    shape = tuple(value.shape())
    count = int(np.prod(shape))
    if count == 0:
        return np.zeros(shape, dtype=ml_dtypes.bfloat16)
    raw = bytes((ctypes.c_uint16 * count).from_address(value.data_ptr()))
    array: npt.NDArray[np.generic] = np.frombuffer(raw, np.uint16).view(ml_dtypes.bfloat16)
    return array.reshape(shape)
