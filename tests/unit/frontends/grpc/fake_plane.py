"""A data plane double for the gRPC front end: scripted answers, and a record of what it was asked.

Models: ``echo`` returns each input as ``OUT*`` (``IN*`` renamed); ``gated`` echoes once ``gate``
is set, which ``opener`` does; ``fail`` raises an InvalidArgumentError naming the request id;
``crash`` raises a plain RuntimeError. ``model_metadata("error-<CODE>")`` raises with that code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Mapping
from typing import Any

import numpy as np
from tritonclient.grpc import InferInput

from infermux.errors import (
    ErrorCode,
    InfermuxError,
    InvalidArgumentError,
    NotFoundError,
    UnsupportedError,
)
from infermux.model_config import ModelConfig, pb
from infermux.routing.router import TrafficReport
from infermux.types import (
    CudaSharedMemoryRegion,
    Duration,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
    Tensor,
    TensorMetadata,
)

MODELS = ("echo", "gated", "opener", "fail", "crash")


class FakePlane:
    """Implements :class:`infermux.dataplane.Operations`."""

    def __init__(self) -> None:
        self.gate = asyncio.Event()
        self.entered = asyncio.Event()  # set when a ``gated`` request starts waiting
        self.is_ready = True
        self.streamed = 0  # responses a ``ticker`` stream produced
        self.regions: dict[str, SharedMemoryRegion] = {}
        self.cuda_regions: dict[str, CudaSharedMemoryRegion] = {}
        self.cuda_handles: dict[str, bytes] = {}
        self.loads: list[tuple[str, str | None]] = []
        self.load_files: list[dict[str, bytes] | None] = []
        self.unloads: list[str] = []
        self.logging: dict[str, Any] = {"log_info": True, "log_verbose_level": 0}
        self.traced: list[tuple[str, dict[str, Any]]] = []

    def live(self) -> bool:
        return True

    async def ready(self) -> bool:
        return self.is_ready

    def server_metadata(self) -> ServerMetadata:
        return ServerMetadata("infermux", "9.9", ("statistics", "system_shared_memory"))

    async def model_ready(self, name: str, version: str = "") -> bool:
        if name not in MODELS:
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        if version and not version.isdigit():
            raise InvalidArgumentError(f"model version '{version}' is not a number")
        return version in ("", "1")

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        if name.startswith("error-"):
            code = ErrorCode[name.removeprefix("error-")]
            raise InfermuxError(f"scripted {code.value} error", code)
        if name == "crash":
            raise RuntimeError("kaboom")
        x = TensorMetadata("INPUT0", "FP32", (-1, 4))
        return ModelMetadata(name, ("1",), "python", (x,), (x,))

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        if name not in MODELS:
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        fp32 = pb.TYPE_FP32
        return ModelConfig.from_proto(
            pb.ModelConfig(
                name=name,
                backend="python",
                max_batch_size=8,
                input=[pb.ModelInput(name="INPUT0", data_type=fp32, dims=[4])],
                output=[pb.ModelOutput(name="OUTPUT0", data_type=fp32, dims=[4])],
            )
        )

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """``ticker``: as a decoupled model, ``count`` responses of a 64 KiB output each (the
        second one an error when ``fail_second``), then an empty final one; else one."""
        if request.model_name != "ticker":
            yield await self.infer(request)
            return
        count = int(str(request.parameters.get("count", 3)))
        for i in range(count):
            self.streamed += 1
            if i == 1 and request.parameters.get("fail_second"):
                error = InvalidArgumentError("second response failed")
                yield InferResponse("ticker", "1", [], id=request.id, final=False, error=error)
                continue
            data = np.full((1, 16384), i, np.float32)
            tensor = Tensor("OUTPUT0", "FP32", data.shape, data)
            yield InferResponse("ticker", "1", [tensor], id=request.id, final=False)
        yield InferResponse("ticker", "1", [], id=request.id, final=True, flag_only=True)

    async def infer(self, request: InferRequest) -> InferResponse:
        name = request.model_name
        if name == "fail":
            raise InvalidArgumentError(f"request '{request.id}' refused")
        if name == "crash":
            raise RuntimeError("kaboom")
        if name == "gated":
            self.entered.set()
            await self.gate.wait()
        elif name == "opener":
            self.gate.set()
        elif name != "echo":
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        outputs = [
            Tensor(t.name.replace("IN", "OUT"), t.datatype, t.shape, t.data, t.parameters)
            for t in request.inputs
        ]
        return InferResponse(name, "1", outputs, id=request.id, parameters={"seen": True})

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        if name and name not in MODELS:
            raise NotFoundError(f"Request for unknown model: '{name}' is not found")
        return [
            ModelStats(
                name=m,
                version="1",
                last_inference=1234,
                inference_count=10,
                execution_count=5,
                inference_stats={"success": Duration(10, 5000), "fail": Duration(2, 10)},
                batch_stats=(),
            )
            for m in ([name] if name else MODELS)
        ]

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        rows = [RepositoryIndexEntry(m, "1", "READY", "") for m in MODELS]
        broken = RepositoryIndexEntry("broken", "1", "UNAVAILABLE", "load failed")
        return rows if ready_only else [*rows, broken]

    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        self.loads.append((name, config_override))
        self.load_files.append(dict(files) if files is not None else None)

    async def unload_model(self, name: str) -> None:
        self.unloads.append(name)

    # The traffic admin API is HTTP only: the gRPC service never calls these.
    async def traffic(self, name: str) -> TrafficReport:
        raise NotFoundError(name)

    async def set_traffic(self, name: str, policy: str | None) -> None:
        raise NotFoundError(name)

    async def promote(self, name: str, version: int) -> None:
        raise NotFoundError(name)

    async def rollback(self, name: str) -> None:
        raise NotFoundError(name)

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if name in self.regions:
            raise InfermuxError(
                f"shared memory region '{name}' already exists", ErrorCode.ALREADY_EXISTS
            )
        self.regions[name] = SharedMemoryRegion(name, key, offset, byte_size)

    async def shm_unregister(self, name: str = "") -> None:
        if name:
            self.regions.pop(name, None)
        else:
            self.regions.clear()

    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        if not name:
            return list(self.cuda_regions.values())
        if name not in self.cuda_regions:
            raise NotFoundError(f"CUDA shared memory region '{name}' is not registered")
        return [self.cuda_regions[name]]

    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        if len(raw_handle) != 64:
            raise InvalidArgumentError("'raw_handle' must be 64 bytes")
        self.cuda_handles[name] = raw_handle
        self.cuda_regions[name] = CudaSharedMemoryRegion(name, device_id, byte_size)

    async def cuda_shm_unregister(self, name: str = "") -> None:
        if name and name not in self.cuda_regions:
            raise NotFoundError(f"CUDA shared memory region '{name}' is not registered")
        for key in [name] if name else list(self.cuda_regions):
            del self.cuda_regions[key]

    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        if not name:
            return list(self.regions.values())
        if name not in self.regions:
            raise NotFoundError(f"Unable to find system shared memory region: '{name}'")
        return [self.regions[name]]

    async def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        if changes and "log_colour" in changes:
            raise InvalidArgumentError("unknown log setting 'log_colour'")
        self.logging.update({k: v for k, v in (changes or {}).items() if v is not None})
        return dict(self.logging)

    async def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        if model and model not in MODELS:
            raise InvalidArgumentError(f"Request for unknown model : {model}")
        if changes and "trace_file" in changes:
            raise UnsupportedError("trace file location can not be updated")
        if changes:
            self.traced.append((model, changes))
        level = ["TIMESTAMPS"] if changes and changes.get("trace_level") else ["OFF"]
        return {"trace_level": level, "trace_rate": "1000", "trace_mode": "opentelemetry"}


def fp32_input(values: list[float]) -> InferInput:
    array = np.array([values], dtype=np.float32)
    return InferInput("INPUT0", list(array.shape), "FP32").set_data_from_numpy(array)
