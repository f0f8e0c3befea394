"""Pinned host staging buffers, so host↔device copies are asynchronous on the instance's stream.

Copies from pageable memory make the CUDA driver stage through its own pinned buffer and block
the calling thread; from page-locked memory they are DMA transfers queued on the stream. Each
instance keeps one pinned buffer (and one device buffer) per input and one pinned buffer per
output, grown only when a batch needs more, so steady-state batches allocate nothing for I/O.
"""

from __future__ import annotations

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
        self._inputs: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}  # name -> (pinned, device)
        self._outputs: dict[str, torch.Tensor] = {}  # name -> pinned

    def upload(self, name: str, array: npt.NDArray[Any], dtype: torch.dtype) -> torch.Tensor:
        """``array`` on the device as ``dtype`` (same item size): written into the pinned buffer,
        then copied to the device asynchronously on the current stream."""
        import torch

        size = array.nbytes
        host, gpu = self._inputs.get(name, (None, None))
        if host is None or gpu is None or host.numel() < size:
            length = max(size, 1)
            host = torch.empty(length, dtype=torch.uint8, pin_memory=True)
            gpu = torch.empty(length, dtype=torch.uint8, device=self.device)
            self._inputs[name] = (host, gpu)
        # np.copyto reads read-only and strided arrays alike, and any numpy dtype (bfloat16 too).
        np.copyto(host.numpy()[:size].view(array.dtype).reshape(array.shape), array)
        target = gpu[:size]
        target.copy_(host[:size], non_blocking=True)
        return target.view(dtype).view(array.shape)

    def download(self, name: str, tensor: torch.Tensor) -> torch.Tensor:
        """A pinned host tensor that ``tensor`` is being copied into on the current stream."""
        import torch

        size = tensor.numel() * tensor.element_size()
        host = self._outputs.get(name)
        if host is None or host.numel() < size:
            host = torch.empty(max(size, 1), dtype=torch.uint8, pin_memory=True)
            self._outputs[name] = host
        target = host[:size].view(tensor.dtype).view(tensor.shape)
        target.copy_(tensor, non_blocking=True)
        return target

    def nbytes(self) -> int:
        """Bytes held in pinned host memory (for diagnostics and tests)."""
        pinned = [host for host, _ in self._inputs.values()] + list(self._outputs.values())
        return sum(int(t.numel()) for t in pinned)

    def clear(self) -> None:
        """Drop every buffer (the instance is closing)."""
        self._inputs.clear()
        self._outputs.clear()
