"""The TensorRT backend: ``platform: "tensorrt_plan"``, one serialised engine per version.

``<version>/model.plan`` (else ``model.engine``; ``default_model_filename`` overrides both) is
deserialised once per file and GPU and shared by the instances there, each with its own execution
context and CUDA stream. Dynamic shapes are served through the engine's optimisation profiles.

``tensorrt`` (10.x) and ``torch`` are imported lazily. torch is the CUDA runtime (device buffers,
pinned host buffers, streams) because infermux already relies on it; a second one (cupy,
cuda-python) would add a dependency for nothing. TensorRT has no type hints, so engines are ``Any``,
and the pure logic below (dtypes, binding checks, profile choice, engine cache) only calls methods,
so CPU tests drive it with a fake engine.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ModelContext, model_file
from infermux.backends.precision import Precision, PrecisionSettings
from infermux.backends.tensor import StackedInstance, require_no_bytes
from infermux.errors import InternalError, InvalidArgumentError, ModelLoadError
from infermux.model_config import ModelConfig
from infermux.types import element_count, numpy_dtype

logger = logging.getLogger(__name__)

PLAN_FILENAME = "model.plan"
ENGINE_FILENAME = "model.engine"
INSTALL_HINT = "pip install 'infermux[tensorrt]'"

# ``trt.DataType`` member names -> V2 datatypes. Matching on the name keeps this table free of a
# tensorrt import. FP8/INT4/FP4 have no V2 datatype: a config cannot declare such a tensor.
V2_DATATYPES: dict[str, str] = {"FLOAT": "FP32", "HALF": "FP16"} | {
    same: same for same in ("BF16", "INT8", "INT32", "INT64", "BOOL", "UINT8")
}
TRT_DATATYPES: dict[str, str] = {v2: trt for trt, v2 in V2_DATATYPES.items()}


def v2_datatype(trt_dtype: Any) -> str | None:
    """The V2 datatype of a ``trt.DataType`` (None when infermux has no equivalent)."""
    return V2_DATATYPES.get(str(getattr(trt_dtype, "name", trt_dtype)))


@dataclass(frozen=True, slots=True)
class Binding:
    """An engine I/O tensor: V2 datatype (None: no V2 equivalent), shape (-1: dynamic dim)."""

    is_input: bool
    datatype: str | None
    trt_datatype: str
    shape: tuple[int, ...]


def engine_bindings(engine: Any) -> dict[str, Binding]:
    """Every I/O tensor of ``engine`` by name, in the engine's order."""
    found = {}
    for i in range(engine.num_io_tensors):
        name = str(engine.get_tensor_name(i))
        dtype = engine.get_tensor_dtype(name)
        found[name] = Binding(
            is_input=getattr(engine.get_tensor_mode(name), "name", "") == "INPUT",
            datatype=v2_datatype(dtype),
            trt_datatype=str(getattr(dtype, "name", dtype)),
            shape=tuple(int(d) for d in engine.get_tensor_shape(name)),
        )
        if engine.is_shape_inference_io(name):
            raise ModelLoadError(f"engine tensor '{name}' is a shape tensor, which is unsupported")
    return found


def check_bindings(config: ModelConfig, bindings: Mapping[str, Binding]) -> None:
    """Raise :class:`ModelLoadError` unless the config and the engine agree on every tensor."""
    where = f"model '{config.name}'"
    for kind, tensors in (("input", config.inputs), ("output", config.outputs)):
        for tensor in tensors:
            binding = bindings.get(tensor.name)
            if binding is None or binding.is_input != (kind == "input"):
                have = ", ".join(n for n, b in bindings.items() if b.is_input == (kind == "input"))
                raise ModelLoadError(
                    f"{where}: {kind} '{tensor.name}' is not an {kind} of the TensorRT engine "
                    f"(engine {kind}s: {have})"
                )
            if binding.datatype != tensor.datatype:
                raise ModelLoadError(
                    f"{where}: {kind} '{tensor.name}' is {tensor.datatype} in the config but "
                    f"{binding.trt_datatype} in the TensorRT engine (expected "
                    f"{TRT_DATATYPES.get(tensor.datatype, 'no TensorRT type')})"
                )
            dims = tensor.reshape if tensor.reshape is not None else tensor.dims
            expected = ((-1,) if config.batching else ()) + dims
            if len(expected) != len(binding.shape) or any(
                -1 not in (c, e) and c != e for c, e in zip(expected, binding.shape, strict=True)
            ):
                raise ModelLoadError(
                    f"{where}: {kind} '{tensor.name}' has shape {list(expected)} in the config "
                    f"(batch dimension included) but {list(binding.shape)} in the TensorRT engine"
                )
    # TensorRT needs an address for every engine input, so each one must be declared.
    for name, binding in bindings.items():
        if binding.is_input and config.input(name) is None:
            raise ModelLoadError(f"{where}: engine input '{name}' is not in the config")


def select_profile(
    engine: Any, bindings: Mapping[str, Binding], shapes: Mapping[str, tuple[int, ...]]
) -> int:
    """The first optimisation profile whose [min, max] covers every input shape.

    Raises :class:`InvalidArgumentError` naming the input and the ranges it could have had.
    """
    dynamic = {}
    for name, shape in shapes.items():
        fixed = bindings[name].shape
        if -1 in fixed:
            dynamic[name] = shape
        elif shape != fixed:
            raise InvalidArgumentError(
                f"input '{name}' has shape {list(shape)}, but the engine takes only {list(fixed)}"
            )
    if not dynamic:
        return 0
    ranges = {
        name: [_profile_range(engine, name, p) for p in range(engine.num_optimization_profiles)]
        for name in dynamic
    }
    for profile in range(engine.num_optimization_profiles):
        if all(_within(shape, ranges[name][profile]) for name, shape in dynamic.items()):
            return profile
    # No profile covers them all: name an input that profile 0 rejects (one rejects it).
    name = next(n for n, s in dynamic.items() if not _within(s, ranges[n][0]))
    supported = "; ".join(
        f"profile {p}: {list(lo)} to {list(hi)}" for p, (lo, hi) in enumerate(ranges[name])
    )
    raise InvalidArgumentError(
        f"input '{name}' has shape {list(dynamic[name])}, outside every optimisation profile of "
        f"the TensorRT engine ({supported})"
    )


def _profile_range(engine: Any, name: str, profile: int) -> tuple[tuple[int, ...], ...]:
    low, _, high = engine.get_tensor_profile_shape(name, profile)
    return tuple(int(d) for d in low), tuple(int(d) for d in high)


def _within(shape: tuple[int, ...], bounds: tuple[tuple[int, ...], ...]) -> bool:
    low, high = bounds
    return len(shape) == len(low) and all(
        lo <= d <= hi for d, lo, hi in zip(shape, low, high, strict=True)
    )


Release = Callable[[], None]
EngineKey = tuple[str, int, str]
"""(plan path, mtime in ns, device): a rewritten file is a new engine, and so is another GPU."""


@dataclass(slots=True)
class _Shared:
    engine: Any
    users: int = 0


class EngineCache:
    """Engines shared, with reference counts, by every instance of one plan file on one GPU.

    An engine holds the model's weights on the GPU: deserialising it once per instance would
    multiply that memory by the instance count. ``deserialize(plan_bytes, device)`` returns the
    engine, or None when TensorRT refuses the plan.
    """

    def __init__(self, deserialize: Callable[[bytes, str], Any]) -> None:
        self._deserialize = deserialize
        self._lock = threading.Lock()
        self._shared: dict[EngineKey, _Shared] = {}

    def acquire(self, path: str, device: str) -> tuple[EngineKey, Any]:
        """The engine of ``path`` on ``device``, deserialised on first use; release it once."""
        key = (path, os.stat(path).st_mtime_ns, device)
        # Deserialising under the lock stops two instances loading at once from building the
        # engine twice; model loads are rare, so serialising them costs little.
        with self._lock:
            shared = self._shared.get(key)
            if shared is None:
                with open(path, "rb") as file:
                    engine = self._deserialize(file.read(), device)
                if engine is None:
                    raise ModelLoadError(
                        f"{path}: TensorRT cannot deserialise this plan (see its log); a plan "
                        "loads only with the TensorRT version and GPU model that built it"
                    )
                shared = self._shared[key] = _Shared(engine)
            shared.users += 1
            return key, shared.engine

    def release(self, key: EngineKey) -> None:
        """Drop one use; the engine is freed (by dropping the reference) after the last one."""
        with self._lock:
            shared = self._shared[key]
            shared.users -= 1
            if shared.users == 0:
                del self._shared[key]

    def users(self, key: EngineKey) -> int:
        """How many instances hold the engine of ``key`` (0 once it is released)."""
        with self._lock:
            shared = self._shared.get(key)
            return shared.users if shared else 0


def _import_runtime() -> tuple[Any, Any]:
    """``(tensorrt, torch)``, or a :class:`ModelLoadError` saying how to install them."""
    modules = []
    for name, why in (
        ("tensorrt", "needs the tensorrt package and an NVIDIA GPU"),
        ("torch", "uses torch for CUDA buffers and streams"),
    ):
        try:
            modules.append(importlib.import_module(name))
        except ImportError as exc:
            raise ModelLoadError(f"the TensorRT backend {why}: {INSTALL_HINT} ({exc})") from exc
    return modules[0], modules[1]


@functools.cache
def _trt_runtime() -> Any:
    # One runtime for the process: engines must not outlive the runtime that made them.
    trt, _ = _import_runtime()
    return trt.Runtime(trt.Logger(trt.Logger.WARNING))


def _deserialize(plan: bytes, device: str) -> Any:
    _, torch = _import_runtime()
    with torch.cuda.device(device):  # TensorRT puts the engine on the current device
        return _trt_runtime().deserialize_cuda_engine(plan)


ENGINES = EngineCache(_deserialize)


def _cuda_device(torch: Any, context: ModelContext) -> str:
    if not torch.cuda.is_available():
        raise ModelLoadError(
            f"model '{context.config.name}': TensorRT needs an NVIDIA GPU, but torch sees no CUDA "
            f"device (torch {torch.__version__}, CUDA {torch.version.cuda or 'not built in'})"
        )
    # An instance group without GPUs resolves to KIND_CPU; TensorRT runs on GPUs only, and Triton
    # places such a model on the GPUs too, so it goes to the first one.
    device = "cuda:0" if context.device == "cpu" else context.device
    index = int(device.partition(":")[2] or 0)
    if index >= torch.cuda.device_count():
        raise ModelLoadError(
            f"model '{context.config.name}': {device} requested, but only "
            f"{torch.cuda.device_count()} CUDA device(s) are visible"
        )
    return f"cuda:{index}"


def plan_path(context: ModelContext) -> str:
    """``model.plan``, else ``model.engine``; ``default_model_filename`` overrides both."""
    folder = context.version_path
    engine_only = (folder / ENGINE_FILENAME).is_file() and not (folder / PLAN_FILENAME).is_file()
    return model_file(context, ENGINE_FILENAME if engine_only else PLAN_FILENAME)


class TensorRTBackend:
    """Loads TensorRT plans; instances stack the batch and run it through one execution context."""

    name = "tensorrt"
    stacks_inputs = True

    def __init__(self, engines: EngineCache | None = None) -> None:
        self._engines = engines or ENGINES

    def load(self, context: ModelContext) -> TensorRTInstance:
        # A plan's layers were chosen for their precision when it was built; converting one
        # afterwards is not something TensorRT does.
        PrecisionSettings.of(context).refuse_unless(
            (Precision.FP32,),
            context.config,
            "a TensorRT plan's precision is fixed when the plan is built (trtexec --fp16, --bf16, "
            "--int8 --calib=<table>); build the plan at that precision and leave the parameter "
            "out, or serve the ONNX model with the onnxruntime backend",
        )
        _, torch = _import_runtime()
        device = _cuda_device(torch, context)
        require_no_bytes(context.config, "TensorRT")
        if context.config.proto.optimization.cuda.graphs:
            logger.warning("model '%s': CUDA graphs are not supported yet", context.config.name)
        key, engine = self._engines.acquire(plan_path(context), device)
        try:
            return TensorRTInstance(
                context, engine, torch, device, lambda: self._engines.release(key)
            )
        except BaseException:
            self._engines.release(key)
            raise


class TensorRTInstance(StackedInstance):
    """One execution context and CUDA stream over a shared engine; ``release`` frees the engine."""

    def __init__(
        self, context: ModelContext, engine: Any, torch: Any, device: str, release: Release
    ) -> None:
        super().__init__(context)
        self._bindings = engine_bindings(engine)
        check_bindings(self.config, self._bindings)
        self._engine = engine
        self._torch = torch
        self._device = torch.device(device)
        # name -> (device, pinned host) raw byte buffers, grown only when a batch needs more
        self._buffers: dict[str, tuple[Any, Any]] = {}
        self._profile = -1  # chosen before the first run: dynamic engines need it set explicitly
        with torch.cuda.device(self._device):
            self._stream = torch.cuda.Stream(device=self._device)
            # TensorRT 10 lets contexts share a profile, so instances need not split them up.
            self._trt_context = engine.create_execution_context()
        if self._trt_context is None:
            raise ModelLoadError(f"model '{self.config.name}': no execution context (GPU memory?)")
        self._release: Release | None = release

    def run(self, inputs: Mapping[str, npt.NDArray[np.generic]]) -> dict[str, npt.ArrayLike]:
        names = [name for name, binding in self._bindings.items() if binding.is_input]
        if missing := [name for name in names if name not in inputs]:
            raise InvalidArgumentError(f"the TensorRT engine needs input '{missing[0]}'")
        shapes = {name: tuple(inputs[name].shape) for name in names}
        profile = select_profile(self._engine, self._bindings, shapes)
        torch, trt_context, stream = self._torch, self._trt_context, self._stream
        wanted = {}
        with torch.cuda.device(self._device), torch.cuda.stream(stream):
            if profile != self._profile:
                if not trt_context.set_optimization_profile_async(profile, stream.cuda_stream):
                    raise InternalError(f"TensorRT refused optimisation profile {profile}")
                self._profile = profile
            for name, shape in shapes.items():
                if not trt_context.set_input_shape(name, shape):
                    raise InvalidArgumentError(f"input '{name}': TensorRT refused shape {shape}")
                view, gpu, host = self._stage(name, shape)
                np.copyto(view, inputs[name])
                gpu.copy_(host, non_blocking=True)
            for name in (n for n, binding in self._bindings.items() if not binding.is_input):
                shape = tuple(int(d) for d in trt_context.get_tensor_shape(name))
                if any(d < 0 for d in shape):
                    raise InternalError(
                        f"model '{self.config.name}': output '{name}' has the data-dependent "
                        f"shape {list(shape)}, which is unsupported"
                    )
                staged = self._stage(name, shape)  # every output needs an address, wanted or not
                if self.config.output(name) is not None:
                    wanted[name] = staged
            if not trt_context.execute_async_v3(stream.cuda_stream):
                raise InternalError(f"model '{self.config.name}': TensorRT execution failed")
            for _, gpu, host in wanted.values():
                host.copy_(gpu, non_blocking=True)
            stream.synchronize()
        # Copied out: the next batch reuses the pinned buffers.
        return {name: view.copy() for name, (view, _, _) in wanted.items()}

    def _stage(self, name: str, shape: tuple[int, ...]) -> tuple[npt.NDArray[Any], Any, Any]:
        """Point ``name`` at a device buffer that fits ``shape``; return the pinned host view of
        it and the device and host byte ranges (raw bytes copy every dtype alike, BF16 too)."""
        datatype = self._bindings[name].datatype
        # Only undeclared outputs can lack a V2 type (FP8/INT4/FP4): a byte per element holds them.
        dtype = numpy_dtype(datatype) if datatype else np.dtype(np.uint8)
        size = element_count(shape) * dtype.itemsize
        gpu, host = self._buffers.get(name, (None, None))
        if gpu is None or gpu.numel() < size:
            torch, length = self._torch, max(size, 1)  # TensorRT wants non-null addresses
            gpu = torch.empty(length, dtype=torch.uint8, device=self._device)
            host = torch.empty(length, dtype=torch.uint8, pin_memory=True)
            self._buffers[name] = (gpu, host)
        self._trt_context.set_tensor_address(name, gpu.data_ptr())
        view = host.numpy()[:size].view(dtype).reshape(shape)
        return view, gpu[:size], host[:size]

    def close(self) -> None:
        if self._release is None:
            return
        with self._torch.cuda.device(self._device):
            self._stream.synchronize()
        self._trt_context = None  # before the engine, which the release may free
        self._buffers.clear()
        release, self._release = self._release, None
        release()
