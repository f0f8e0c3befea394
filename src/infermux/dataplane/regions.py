"""The data plane's client shared memory, system and CUDA, as one: which registry a region
named in a request lives in, inputs read from it and outputs placed into it."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

from infermux.backends.base import DeviceParts
from infermux.errors import ErrorCode, InfermuxError
from infermux.ipc.arena import Block
from infermux.types import SHM_REGION, DeviceArray, InferRequest, Tensor, uses_shared_memory

from .cuda_shared_memory import AllocationSizes, CudaSharedMemoryRegistry
from .shared_memory import SharedMemoryRegistry


@dataclass(frozen=True, slots=True)
class Regions:
    """The data plane's shared-memory registries, system and CUDA."""

    shm: SharedMemoryRegistry
    cuda: CudaSharedMemoryRegistry

    def check_free(self, name: str, *, cuda: bool) -> None:
        """System and CUDA regions share one namespace, as in Triton (an input names only a
        region): registering a ``cuda`` (else system) region under a name the other kind holds
        is ALREADY_EXISTS (each registry refuses its own duplicates itself)."""
        if (self.shm if cuda else self.cuda).has(name):
            raise InfermuxError(
                f"shared memory region '{name}' is already registered", ErrorCode.ALREADY_EXISTS
            )

    def read_inputs(
        self, request: InferRequest, staged: list[Block], *, on_device: bool
    ) -> dict[str, DeviceArray]:
        """Give every input placed in a client's shared memory its data: system regions are
        read into ``staged`` blocks, CUDA regions stay on the device (returned by input name)
        for a model that reads them there (``on_device``)."""
        device: dict[str, DeviceArray] = {}
        for tensor in request.inputs:
            if not uses_shared_memory(tensor.parameters):
                continue
            if self.cuda.has(str(tensor.parameters.get(SHM_REGION, ""))):
                data = self.cuda.read(tensor, on_device=on_device)
                if isinstance(data, DeviceArray):
                    device[tensor.name] = data
                else:
                    tensor.data = data
            else:
                tensor.data = self.shm.read(tensor, staged)
        return device

    def read_stacked(
        self,
        tensors: list[Tensor],
        staged: list[Block],
        *,
        on_device: bool,
        sizes: AllocationSizes | None = None,
    ) -> npt.NDArray[np.generic] | DeviceParts:
        """Several requests' data of one input (a micro-batch's), each in its own region, their
        rows stacked: left where they lie as :class:`DeviceParts` when every one is in a CUDA
        region and the model reads them there (``on_device``), so the batch gathers them device
        to device; else copied to the host, system regions' into one ``staged`` block.
        ``sizes``: the CUDA allocations' sizes asked for this micro-batch so far (one driver
        call per region, not per request); a fresh one when None."""
        sizes = {} if sizes is None else sizes
        if on_device:  # the common case over CUDA shm, in one pass
            views = self.cuda.device_views(tensors, sizes)
            if views is not None:
                return DeviceParts(views)
        cuda = [self.cuda.has(str(t.parameters.get(SHM_REGION, ""))) for t in tensors]
        if not any(cuda):
            return self.shm.read_stacked(tensors, staged)
        # Both kinds in one micro-batch (a front end that did not know a system region yet):
        # rare, so the host path, as a single request's read would give a host model.
        device = on_device and all(cuda)
        parts = [
            self.cuda.read(t, on_device=device, sizes=sizes) if in_cuda else self.shm.read(t)
            for t, in_cuda in zip(tensors, cuda, strict=True)
        ]
        gpu = tuple(p for p in parts if isinstance(p, DeviceArray))
        if len(gpu) == len(parts):  # else none is: one datatype, BOOL is read on the host
            return DeviceParts(gpu)
        host = [p for p in parts if isinstance(p, np.ndarray)]
        return np.concatenate(host) if len(host) > 1 else host[0]

    def place_outputs(self, request: InferRequest, outputs: list[Tensor]) -> list[Tensor]:
        """``outputs``, those the request asked for in a region written there (and answered as
        references)."""
        wanted = {o.name: o.parameters for o in request.outputs if uses_shared_memory(o.parameters)}
        if not wanted:
            return outputs
        placed = []
        for tensor in outputs:
            parameters = wanted.get(tensor.name)
            if parameters is None:
                placed.append(tensor)
            elif self.cuda.has(str(parameters.get(SHM_REGION, ""))):
                placed.append(self.cuda.write(tensor, parameters))
            else:
                placed.append(self.shm.write(tensor, parameters))
        return placed
