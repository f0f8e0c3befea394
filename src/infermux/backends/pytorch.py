"""The PyTorch backend: TorchScript (``platform: "pytorch_libtorch"``, ``model.pt``) and
``torch.export`` programs (``platform: "torch_export"``, ``model.pt2``; also any
``default_model_filename`` ending in ``.pt2``).

Tensors meet the model's arguments as in Triton's libtorch backend
(:mod:`~infermux.backends.torch_signature`). ``precision`` (fp16, bf16, int8 on the CPU) and the
accuracy guard are in :mod:`~infermux.backends.torch_model`.

Config ``parameters`` (``key: "..." value { string_value: "..." }``):

- ``INPUT_BY_NAME: "true"``: pass inputs as keyword arguments named as in the config.
- ``TORCH_COMPILE: "true"``: run through ``torch.compile``. Compilation happens on the first batch
  (seconds to minutes, on the instance's thread); if it fails the instance warns and runs eagerly.
- ``INTRA_OP_THREAD_COUNT: "N"``: ``torch.set_num_threads(N)``. PyTorch's intra-op pool is
  process-wide, so this applies to every PyTorch model in the server, and the last model loaded
  with the parameter wins.
- ``STREAM_PRIORITY: "high" | "normal" | "low"``: the CUDA stream priority of GPU instances.

On a GPU, the instances of one model version share one copy of the weights
(:data:`infermux.runtime.WEIGHTS`); each has its own CUDA stream and pinned staging buffers, and
waits for its batch with the GIL released. CPU instances each load their own copy, as before:
host memory is rarely the limit that GPU memory is, and a private module keeps CPU instances free
of any cross-thread state (``torch.compile`` of one shared module from several threads included).

torch is imported when a model is loaded, never at import time, so infermux runs without it.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ExecuteResult, ModelContext, ModelRequest, model_file
from infermux.backends.precision import PrecisionReport, PrecisionSettings
from infermux.backends.stacking import batch_shapes
from infermux.backends.tensor import StackedInstance, require_no_bytes
from infermux.backends.torch_gpu import GpuPath
from infermux.backends.torch_model import TorchModel, reason
from infermux.backends.torch_model import load as load_model
from infermux.backends.torch_signature import flag
from infermux.backends.torch_tensors import (
    device_of,
    device_tensor,
    to_numpy,
    to_torch,
    weight_bytes,
)
from infermux.errors import InfermuxError, InternalError, ModelLoadError
from infermux.model_config import ModelConfig
from infermux.runtime import (
    PRIORITY_PARAMETER,
    WEIGHTS,
    Lease,
    MemoryUse,
    graph_buckets,
    parse_priority,
)
from infermux.types import DeviceArray, numpy_dtype

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

INSTALL_HINT = "pip install 'infermux[torch]'"


class PyTorchBackend:
    """Loads TorchScript and ``torch.export`` models; one instance per configured device."""

    name = "pytorch"
    stacks_inputs = True
    accepts_device_inputs = True  # CUDA shared memory inputs are gathered on the GPU

    def load(self, context: ModelContext) -> PyTorchInstance:
        config = context.config
        try:
            import torch
        except ImportError as exc:
            raise ModelLoadError(
                f"model '{config.name}': the PyTorch backend needs torch, which cannot be "
                f"imported ({exc}); install it with: {INSTALL_HINT}"
            ) from exc
        require_no_bytes(config, "PyTorch")
        for tensor in (*config.inputs, *config.outputs):
            # torch names its dtypes as numpy (and ml_dtypes, for bfloat16) do; an older torch
            # may lack some (uint16/32/64 arrived in 2.3), which is refused here, not per request.
            dtype = getattr(torch, numpy_dtype(tensor.datatype).name, None)
            if not isinstance(dtype, torch.dtype):
                raise ModelLoadError(
                    f"model '{config.name}': '{tensor.name}' is {tensor.datatype}, which torch "
                    f"{torch.__version__} has no dtype for"
                )
        priority = parse_priority(config.name, config.parameters.get(PRIORITY_PARAMETER, ""))
        device = device_of(context)
        threads = _thread_count(config)
        if threads:
            torch.set_num_threads(threads)
        exported = config.platform == "torch_export" or config.default_model_filename.endswith(
            ".pt2"
        )
        path = model_file(context, "model.pt2" if exported else "model.pt")
        loader = _load_exported if exported else _load_torchscript
        compile_model = flag(config, "TORCH_COMPILE")
        if compile_model and graph_buckets(config):
            raise ModelLoadError(
                f"model '{config.name}': TORCH_COMPILE and optimization.cuda.graphs cannot be "
                "combined; choose one"
            )
        # Weights cast to another precision are other weights (fp32 keeps the plain file key).
        settings = PrecisionSettings.of(context)
        variant = settings.precision.value if settings.reduced else ""

        def prepare() -> TorchModel:
            return load_model(context, settings, path, device, loader, exported=exported)

        try:
            if device.type != "cuda":
                return PyTorchInstance(context, prepare(), device, compile_model)
            lease: Lease[TorchModel] = WEIGHTS.acquire(path, str(device), prepare, variant)
        except InfermuxError:
            raise
        except Exception as exc:
            raise ModelLoadError(
                f"model '{config.name}' version {context.version}: cannot load {path}: "
                f"{reason(exc)}"
            ) from exc
        try:
            instance = PyTorchInstance(context, lease.value, device, compile_model)
            instance.attach_gpu(GpuPath.create(context, device, priority, lease, instance.forward))
            return instance
        except BaseException:
            lease.release()
            raise


class PyTorchInstance(StackedInstance):
    """One loaded model on one device. ``run`` is called from the instance's own thread."""

    def __init__(
        self,
        context: ModelContext,
        model: TorchModel,
        device: torch.device,
        compile_model: bool,
    ) -> None:
        super().__init__(context)
        self._model: TorchModel | None = model
        self.precision_report: PrecisionReport = model.report
        self._device = device
        self._gpu: GpuPath | None = None
        self._weight_bytes = weight_bytes(model.module) if device.type == "cpu" else 0
        self._compile_pending = compile_model
        self._compiled: Callable[..., Any] | None = None

    def attach_gpu(self, gpu: GpuPath) -> None:
        """Run on ``gpu`` (built after the instance: its graphs capture :meth:`forward`)."""
        self._gpu = gpu

    @property
    def gpu(self) -> GpuPath | None:
        """The instance's stream, buffers and graphs (None on the CPU or once closed)."""
        return self._gpu

    @property
    def stream(self) -> torch.cuda.Stream | None:
        """The CUDA stream this instance runs its batches on (None on the CPU or once closed)."""
        return self._gpu.stream.stream if self._gpu is not None else None

    def forward(self, tensors: Mapping[str, torch.Tensor]) -> dict[str, Any]:
        """The model on device tensors by input name -> its outputs by output name."""
        if self._model is None:
            raise InternalError(f"model '{self.config.name}' is closed")
        return self._model.forward(tensors, self._forward)

    def memory_usage(self) -> list[MemoryUse]:
        if self._gpu is not None:
            return self._gpu.memory_usage()
        return [MemoryUse("CPU", 0, "weights", self._weight_bytes)] if self._model else []

    def stack_target(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> npt.NDArray[Any] | None:
        # On a GPU the batch goes through the pinned staging buffer anyway: stacked straight into
        # it, it is copied once on the host (under the GIL) instead of twice.
        if self._gpu is None or dtype.kind == "O":
            return None
        return self._gpu.staging.pinned_input(name, shape, dtype)

    def run(self, inputs: Mapping[str, npt.NDArray[np.generic]]) -> Mapping[str, npt.ArrayLike]:
        return self.run_batch(inputs, {})

    def launch(
        self, requests: Sequence[ModelRequest], done: Callable[[], None]
    ) -> Callable[[], Sequence[ExecuteResult]] | None:
        """Enqueue a batch that a captured CUDA graph runs and return at once (see
        :class:`~infermux.backends.base.LaunchesOnLoop`); None for every other batch (on the
        CPU, no graph for its shapes, eager), which :meth:`execute` runs on the instance's
        thread."""
        gpu = self._gpu
        if gpu is None or gpu.graphs is None or self._model is None:
            return None
        graph = gpu.graph_for(batch_shapes(requests, self.config.batching))
        if graph is None:
            return None
        import torch

        try:
            # inference_mode is thread-local, and the graphs' static inputs are inference tensors.
            with torch.inference_mode():
                collect = gpu.launch(graph, requests, done)
        except InfermuxError:
            raise
        except Exception as exc:
            logger.debug("model '%s' failed", self.config.name, exc_info=True)
            raise InternalError(f"model '{self.config.name}' failed: {reason(exc)}") from exc
        return lambda: self.results(collect(), requests)

    def run_batch(
        self,
        inputs: Mapping[str, npt.NDArray[np.generic]],
        device: Mapping[str, Sequence[DeviceArray]],
    ) -> Mapping[str, npt.ArrayLike]:
        import torch

        name = self.config.name
        if self._model is None:
            raise InternalError(f"model '{name}' instance {self.context.instance_name} is closed")
        # inference_mode is thread-local, so it is entered per batch on the instance's thread.
        with torch.inference_mode():
            try:
                if self._gpu is not None:
                    return self._gpu.run(self.forward, inputs, device)
                tensors = {key: to_torch(array, self._device) for key, array in inputs.items()}
                for key, parts in device.items():  # a CPU instance given GPU inputs: copy down
                    tensors[key] = torch.cat([device_tensor(p).to(self._device) for p in parts])
                outputs = self._model.forward(tensors, self._forward)
                return {key: to_numpy(value) for key, value in outputs.items()}
            except InfermuxError:
                raise
            except Exception as exc:
                logger.debug("model '%s' failed", name, exc_info=True)
                raise InternalError(f"model '{name}' failed: {reason(exc)}") from exc

    def close(self) -> None:
        self._model = self._compiled = None
        gpu, self._gpu = self._gpu, None
        if gpu is not None:
            gpu.close()

    def _forward(self, model: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        """``model(*args, **kwargs)``, through ``torch.compile`` when the config asks for it."""
        import torch

        if self._compile_pending:
            self._compile_pending = False
            try:
                self._compiled = torch.compile(model)
            except Exception as exc:  # e.g. TorchScript modules, which dynamo refuses
                logger.warning(
                    "model '%s': torch.compile is unavailable, running eagerly: %s",
                    self.config.name,
                    reason(exc),
                )
        if self._compiled is not None:
            try:
                return self._compiled(*args, **kwargs)
            except Exception as exc:
                # Eager decides whose fault it was: if it fails too, the error is the model's
                # (raised from here) and compilation stays on; if it works, compiling is dropped.
                result = model(*args, **kwargs)
                logger.warning(
                    "model '%s': the compiled model failed, running eagerly from now on: %s",
                    self.config.name,
                    reason(exc),
                )
                self._compiled = None
                return result
        return model(*args, **kwargs)


def _load_torchscript(path: str, device: torch.device) -> Callable[..., Any]:
    import torch

    # TorchScript is what Triton's pytorch_libtorch platform means, so PyTorch's deprecation
    # warning (2.10+) is addressed to us, not to whoever serves the model. A targeted, permanent
    # filter rather than catch_warnings(), which is not thread-safe (instances load on threads).
    # (A DeprecationWarning in torch 2.10-2.13, a FutureWarning from 2.14.)
    for category in (DeprecationWarning, FutureWarning):
        warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is", category=category)
    jit_load: Callable[..., torch.jit.ScriptModule] = torch.jit.load  # has no annotations
    model = jit_load(path, map_location=device)
    model.eval()
    return model


def _load_exported(path: str, device: torch.device) -> Callable[..., Any]:
    import torch

    # torch 2.11's .pt2 reader warns that its own buffers are read-only; nothing for an operator.
    warnings.filterwarnings(
        "ignore", message="The given buffer is not writable", module=r"torch\.export\."
    )
    # No eval(): exported graphs are fixed at export time and refuse train()/eval().
    module: torch.nn.Module = torch.export.load(path).module()
    return module.to(device)


def _thread_count(config: ModelConfig) -> int:
    value = config.parameters.get("INTRA_OP_THREAD_COUNT", "0").strip() or "0"
    if not value.isdigit():
        raise ModelLoadError(
            f"model '{config.name}': parameter INTRA_OP_THREAD_COUNT must be a whole number "
            f"(0 = PyTorch's default), got {value!r}"
        )
    return int(value)
