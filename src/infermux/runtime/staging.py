"""Pinned host staging buffers, so host↔device copies are asynchronous on the instance's stream.

Copies from pageable memory make the CUDA driver stage through its own pinned buffer and block
the calling thread; from page-locked memory they are DMA transfers queued on the stream. Each
instance keeps one pinned buffer (and one device buffer) per input and one pinned buffer per
output, reserved at load for the largest batch where the shapes are known and grown only when a
batch needs more, so steady-state batches allocate nothing for I/O. Pinned blocks come from
torch's caching host allocator, the process's pinned-memory pool.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

if TYPE_CHECKING:
    import torch


class StagingBuffers:
    """A model instance's pinned host and device buffers, by tensor name.

    Call :meth:`upload` and :meth:`download` inside the instance's stream (see
    :class:`~infermux.runtime.streams.InstanceStream`); the tensors they return are views of the
    buffers, valid until the next batch: read downloads only after the stream finished, and copy
    them before the next batch starts.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._pinned_in: dict[str, torch.Tensor] = {}
        self._device_in: dict[str, torch.Tensor] = {}
        self._pinned_out: dict[str, torch.Tensor] = {}

    def reserve(self, inputs: dict[str, int], outputs: dict[str, int], device: bool) -> None:
        """Allocate buffers of these byte sizes now (at load), not on the first batch; device
        input buffers too unless ``device`` is False (graphs bring their own)."""
        for name, size in inputs.items():
            _grow(self._pinned_in, name, size, _pinned)
            if device:
                self._device_input(name, size)
        for name, size in outputs.items():
            _grow(self._pinned_out, name, size, _pinned)

    def upload(self, name: str, array: npt.NDArray[Any], dtype: torch.dtype) -> torch.Tensor:
        """``array`` on the device as ``dtype`` (same item size): written into the pinned buffer,
        then copied to the device asynchronously on the current stream."""
        gpu = self._device_input(name, array.nbytes)
        target = gpu[: array.nbytes].view(dtype).view(array.shape)
        self.upload_into(name, array, target)
        return target

    def device_buffer(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        """The device input buffer ``name`` as a ``shape`` tensor of ``dtype`` (contents left
        as they are: the caller fills it)."""
        size = math.prod(shape) * dtype.itemsize
        gpu = self._device_input(name, size)
        return gpu[:size].view(dtype).view(shape)

    def _device_input(self, name: str, size: int) -> torch.Tensor:
        """The device input buffer ``name``, grown to ``size`` bytes when smaller."""
        import torch

        return _grow(
            self._device_in,
            name,
            size,
            lambda n: torch.empty(n, dtype=torch.uint8, device=self.device),
        )

    def pinned_input(
        self, name: str, shape: tuple[int, ...], dtype: np.dtype[Any]
    ) -> npt.NDArray[Any]:
        """A ``shape`` array of ``dtype`` over the pinned buffer of input ``name`` (grown if
        needed). A batch stacked straight into it is uploaded without a second host copy."""
        size = math.prod(shape) * dtype.itemsize
        host = _grow(self._pinned_in, name, size, _pinned)
        return host.numpy()[:size].view(dtype).reshape(shape)

    def upload_into(self, name: str, array: npt.NDArray[Any], target: torch.Tensor) -> None:
        """Copy ``array`` into the first rows of the device tensor ``target`` (e.g. a CUDA graph's
        static input) through the pinned buffer, asynchronously on the current stream."""
        import torch

        size = array.nbytes
        host = _grow(self._pinned_in, name, size, _pinned)
        if not (array.ctypes.data == host.data_ptr() and array.flags.c_contiguous):
            # Not stacked in place (see pinned_input). np.copyto reads read-only and strided
            # arrays alike, and any numpy dtype (bfloat16 too).
            np.copyto(host.numpy()[:size].view(array.dtype).reshape(array.shape), array)
        # Bytes to bytes: ``target`` is contiguous, so its leading bytes are the batch's rows.
        target.view(-1).view(torch.uint8)[:size].copy_(host[:size], non_blocking=True)

    def download(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor that ``tensor`` is being copied into on the current stream."""
        size = tensor.numel() * tensor.element_size()
        host = _grow(self._pinned_out, name, size, _pinned)
        target = host[:size].view(tensor.dtype).view(tensor.shape)
        target.copy_(tensor, non_blocking=True)
        return target

    def pinned_bytes(self) -> int:
        """Bytes held in pinned host memory."""
        buffers = [*self._pinned_in.values(), *self._pinned_out.values()]
        return sum(int(t.numel()) for t in buffers)

    def device_bytes(self) -> int:
        """Bytes held in device input buffers."""
        return sum(int(t.numel()) for t in self._device_in.values())

    def clear(self) -> None:
        """Drop every buffer (the instance is closing)."""
        self._pinned_in.clear()
        self._device_in.clear()
        self._pinned_out.clear()


def _pinned(size: int) -> torch.Tensor:
    import torch

    return torch.empty(size, dtype=torch.uint8, pin_memory=True)


def _grow(buffers: dict[str, torch.Tensor], name: str, size: int, make: Any) -> torch.Tensor:
    """The uint8 buffer ``name``, replaced by a larger one when it holds fewer than ``size``."""
    buffer = buffers.get(name)
    if buffer is None or buffer.numel() < size:
        buffer = make(max(size, 1))
        buffers[name] = buffer
    return buffer
