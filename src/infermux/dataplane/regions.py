"""The data plane's client shared memory, system and CUDA, as one: which registry a region
named in a request lives in, inputs read from it and outputs placed into it."""

from __future__ import annotations

from dataclasses import dataclass

from infermux.errors import ErrorCode, InfermuxError
from infermux.ipc.arena import Block
from infermux.types import SHM_REGION, DeviceArray, InferRequest, Tensor, uses_shared_memory

from .cuda_shared_memory import CudaSharedMemoryRegistry
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
