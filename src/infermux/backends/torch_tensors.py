"""numpy <-> torch conversion and device resolution for the PyTorch backend (lazy torch)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ml_dtypes
import numpy as np
import numpy.typing as npt

from infermux.backends.base import ModelContext
from infermux.errors import InternalError, ModelLoadError
from infermux.runtime import StagingBuffers
from infermux.types import DeviceArray

if TYPE_CHECKING:
    import torch


def device_of(context: ModelContext) -> torch.device:
    import torch

    device = torch.device(context.device)
    if device.type == "cuda":
        name = context.config.name
        if not torch.cuda.is_available():
            raise ModelLoadError(
                f"model '{name}': instance {context.instance_name} needs {context.device}, but "
                f"CUDA is not available to torch {torch.__version__}; use KIND_CPU or a CUDA build"
            )
        if (device.index or 0) >= torch.cuda.device_count():
            raise ModelLoadError(
                f"model '{name}': instance {context.instance_name} needs {context.device}, but "
                f"torch sees {torch.cuda.device_count()} CUDA device(s)"
            )
        index: int | None = device.index  # None for "cuda", whatever torch's stubs say
        if index is None:  # "cuda" and "cuda:0" must share weights, not load twice
            device = torch.device("cuda", torch.cuda.current_device())
    return device


def to_torch(array: npt.NDArray[np.generic], device: torch.device) -> torch.Tensor:
    import torch

    if array.dtype == ml_dtypes.bfloat16:
        # torch cannot read ml_dtypes' bfloat16: move the bits as int16 and reinterpret them.
        return to_torch(array.view(np.int16), device).view(torch.bfloat16)
    # from_numpy shares memory; inputs decoded from a request body are read-only views of it, which
    # torch warns about and a model could write through, so those (only) are copied first.
    return torch.from_numpy(np.require(array, requirements=("C", "W"))).to(device)


def device_tensor(array: DeviceArray) -> torch.Tensor:
    """A torch view of GPU memory that infermux does not own (no copy): copy from it, never
    write into it."""
    import torch

    if array.dtype == ml_dtypes.bfloat16:  # __cuda_array_interface__ has no bfloat16 typestr
        bits = DeviceArray(array.pointer, array.shape, np.dtype(np.int16), array.device_id, array)
        return device_tensor(bits).view(torch.bfloat16)
    return torch.as_tensor(array, device=torch.device("cuda", array.device_id))


def torch_dtype(dtype: np.dtype[Any]) -> torch.dtype:
    import torch

    if dtype == ml_dtypes.bfloat16:
        return torch.bfloat16
    torch_dtype = getattr(torch, dtype.name, None)
    if not isinstance(torch_dtype, torch.dtype):  # load() checked the config's dtypes already
        raise InternalError(f"torch has no dtype for {dtype}")
    return torch_dtype


def download(staging: StagingBuffers, name: str, value: object) -> object:
    import torch

    if isinstance(value, torch.Tensor):
        return staging.download(name, value.detach())
    return value


def to_numpy(value: object) -> npt.NDArray[Any]:
    import torch

    if not isinstance(value, torch.Tensor):
        return np.asarray(value)
    tensor = value.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return tensor.numpy()


def weight_bytes(model: object) -> int:
    """Bytes of a module's parameters and buffers (0 for a model that is not a module)."""
    parameters = getattr(model, "parameters", None)
    buffers = getattr(model, "buffers", None)
    if not callable(parameters) or not callable(buffers):
        return 0
    tensors = {id(t): t for t in (*parameters(), *buffers())}  # tied weights once
    return sum(int(t.numel()) * int(t.element_size()) for t in tensors.values())
