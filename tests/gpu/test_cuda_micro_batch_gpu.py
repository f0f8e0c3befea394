"""Micro-batches of CUDA shared-memory requests on a GPU: several requests' inputs, each in its
client's GPU memory, run as one model request whose input is one device part per request,
gathered device to device (eager, from a graph's thread path and launched from the event loop),
and each answer lands in its own region equal to the eager model's (a launched graph's batch
copies it there device to device)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

import infermux.dataplane.inference as inference_module
from infermux.backends import BackendRegistry, ModelRequest
from infermux.backends.base import DeviceParts, ExecuteResult
from infermux.dataplane import DataPlane
from infermux.dataplane.cuda_ipc import CudaRuntime
from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
from infermux.model_config import DynamicBatchingConfig
from infermux.repository import ControlMode, ModelRepository
from infermux.scheduling import DynamicBatcher
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    DeviceArray,
    InferRequest,
    RequestedOutput,
    Tensor,
)
from tests.gpu.torch_models import WIDTH, Wide, close, load, rows, run, write

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

GRAPHS = "optimization { cuda { graphs: true } }\n"
BATCHING = "dynamic_batching { }\n"


def finish(request: ModelRequest, result: ExecuteResult) -> list[Tensor]:
    assert isinstance(result, dict)
    y = np.asarray(result["OUTPUT__0"])
    return [Tensor("OUTPUT__0", "FP32", y.shape, y)]


def parts_of(xs: list[np.ndarray[Any, Any]]) -> tuple[DeviceParts, list[torch.Tensor]]:
    """The arrays in GPU memory, each its own allocation (as each client's region would be)."""
    tensors = [torch.from_numpy(x).cuda() for x in xs]
    torch.cuda.synchronize()  # as a client must before it sends the request
    arrays = [
        DeviceArray(t.data_ptr(), tuple(t.shape), np.dtype(np.float32), 0, t) for t in tensors
    ]
    return DeviceParts(tuple(arrays)), tensors


@pytest.mark.parametrize("parameters", ["", GRAPHS], ids=["eager", "graphs"])
def test_device_parts_are_gathered_on_the_gpu(tmp_path: Path, parameters: str) -> None:
    (instance,) = load(write(tmp_path, Wide(), parameters), "cuda:0", 1)
    (reference,) = load(write(tmp_path / "ref", Wide()), "cuda:0", 1)
    try:
        xs = [rows(2, 1), rows(1, 2), rows(3, 3)]
        lone = rows(1, 4)
        micro, _held = parts_of(xs)
        single, _single_held = parts_of([lone])
        requests = [
            ModelRequest({}, ("OUTPUT__0",), device_inputs={"INPUT__0": micro}),
            ModelRequest({}, ("OUTPUT__0",), device_inputs={"INPUT__0": single.parts[0]}),
        ]
        assert requests[0].batch_size == 6
        gpu = instance.gpu
        assert gpu is not None

        def no_host_copies(*args: object) -> None:
            raise AssertionError("a device input went through host memory")

        gpu.staging.upload = no_host_copies  # type: ignore[method-assign,assignment]
        gpu.staging.upload_into = no_host_copies  # type: ignore[method-assign,assignment]
        first, second = instance.execute(requests)
        assert not isinstance(first, Exception), first
        assert not isinstance(second, Exception), second
        expected = run(reference, np.concatenate(xs))
        np.testing.assert_allclose(np.asarray(first["OUTPUT__0"]), expected, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(
            np.asarray(second["OUTPUT__0"]), run(reference, lone), rtol=1e-5, atol=1e-6
        )
        assert gpu.replays == (1 if parameters else 0)
    finally:
        close([instance, reference])


async def test_launched_batches_gather_device_parts(tmp_path: Path) -> None:
    graphed = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 2)
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    batcher = DynamicBatcher(
        "m", graphed, finish=finish, batching=DynamicBatchingConfig(), max_batch_size=8
    )
    try:
        groups = [[rows(1, 10 * g + i) for i in range(1 + g % 3)] for g in range(24)]
        held = []
        requests = []
        for xs in groups:
            micro, tensors = parts_of(xs)
            held.append(tensors)
            requests.append(ModelRequest({}, ("OUTPUT__0",), device_inputs={"INPUT__0": micro}))
        done = await asyncio.gather(*(batcher.submit(r) for r in requests))
        for xs, completion in zip(groups, done, strict=True):
            np.testing.assert_allclose(
                np.asarray(completion.outputs[0].data, dtype=np.float32),
                run(eager, np.concatenate(xs)),
                rtol=1e-4,
                atol=1e-5,
            )
        assert sum(i.gpu.replays for i in graphed if i.gpu is not None) > 0
    finally:
        await batcher.close()  # closes its instances
        close([eager])


class SameProcessIpc(CudaRuntime):
    """The real CUDA runtime (copies, allocation sizes), except that a "handle" names a tensor
    of this process: CUDA cannot open an IPC handle in the process that exported it."""

    def __init__(self, regions: dict[bytes, torch.Tensor]) -> None:
        super().__init__()
        self.regions = regions

    def open(self, handle: bytes, device_id: int) -> int:
        return int(self.regions[handle].data_ptr())

    def close(self, pointer: int, device_id: int) -> None:
        pass


IN, OUT = bytes(64), bytes([1] * 64)


# (optimization, the output's dims in the config): only an output of fixed size has a place a
# batch can copy it to before the model has run.
PLANES = {"eager": ("", "8"), "graphs": (GRAPHS, "8"), "graphs-variable-dims": (GRAPHS, "-1")}


@pytest.fixture(params=list(PLANES), ids=list(PLANES))
async def plane(
    request: pytest.FixtureRequest, tmp_path: Path
) -> AsyncIterator[tuple[DataPlane, dict[bytes, torch.Tensor]]]:
    parameters, dims = PLANES[request.param]
    write(tmp_path, Wide(), BATCHING + parameters, output_dims=dims)
    repository = ModelRepository([tmp_path], BackendRegistry(), control_mode=ControlMode.NONE)
    await repository.start()
    regions = {
        IN: torch.zeros((8, WIDTH), dtype=torch.float32, device="cuda:0"),
        OUT: torch.zeros((8, 8), dtype=torch.float32, device="cuda:0"),
    }
    cuda = CudaSharedMemoryRegistry(enabled=True, ipc=lambda: SameProcessIpc(regions))
    plane = DataPlane(repository, version="test", cuda_shared_memory=cuda)
    await plane.cuda_shm_register("in", IN, 0, regions[IN].nbytes)
    await plane.cuda_shm_register("out", OUT, 0, regions[OUT].nbytes)
    try:
        yield plane, regions
    finally:
        plane.close()
        await repository.close()


async def test_a_micro_batch_of_cuda_requests_answers_as_the_eager_model(
    plane: tuple[DataPlane, dict[bytes, torch.Tensor]],
    monkeypatch: pytest.MonkeyPatch,
    request: pytest.FixtureRequest,
) -> None:
    data_plane, regions = plane
    on_gpu = request.node.callspec.params["plane"] == "graphs"
    model_requests: list[ModelRequest] = []
    made = inference_module.to_model_request  # type: ignore[attr-defined]
    host_writes: list[str] = []
    host_write = CudaSharedMemoryRegistry.write

    def counted(self: CudaSharedMemoryRegistry, tensor: Tensor, parameters: Any) -> Tensor:
        host_writes.append(tensor.name)
        return host_write(self, tensor, parameters)

    monkeypatch.setattr(CudaSharedMemoryRegistry, "write", counted)

    def recorded(*args: Any, **kwargs: Any) -> ModelRequest:
        model_requests.append(made(*args, **kwargs))
        return model_requests[-1]

    monkeypatch.setattr(inference_module, "to_model_request", recorded)
    counts = [2, 1, 3]
    x = rows(sum(counts), 7)
    regions[IN][: len(x)].copy_(torch.from_numpy(x))
    torch.cuda.synchronize()
    row_in, row_out = WIDTH * 4, 8 * 4
    starts = [sum(counts[:i]) for i in range(len(counts))]
    micro = InferRequest(
        "m",
        "",
        [
            Tensor(
                "INPUT__0",
                "FP32",
                (n, WIDTH),
                np.empty(0, np.float32),
                {SHM_REGION: "in", SHM_OFFSET: s * row_in, SHM_BYTE_SIZE: n * row_in},
            )
            for s, n in zip(starts, counts, strict=True)
        ],
        [
            RequestedOutput(
                "OUTPUT__0",
                {SHM_REGION: "out", SHM_OFFSET: s * row_out, SHM_BYTE_SIZE: n * row_out},
            )
            for s, n in zip(starts, counts, strict=True)
        ],
    )
    response = await data_plane.infer_many(micro, counts, inputs_apart=True, outputs_apart=True)
    (model_request,) = model_requests  # one queue entry for the three requests
    # A graph's batch copies each request's output rows into its region on the GPU; an eager
    # batch's outputs, and ones of variable size, go through host memory, one write per request.
    assert model_request.outputs_on_device == ({"OUTPUT__0"} if on_gpu else set())
    assert host_writes == ([] if on_gpu else ["OUTPUT__0"] * 3)
    parts = model_request.device_inputs["INPUT__0"]
    assert isinstance(parts, DeviceParts)
    assert [p.shape[0] for p in parts.parts] == counts
    assert not model_request.inputs  # nothing came through host memory
    assert [o.parameters[SHM_OFFSET] for o in response.outputs] == [s * row_out for s in starts]
    torch.cuda.synchronize()
    answer = regions[OUT][: len(x)].cpu().numpy()
    with torch.inference_mode():
        expected = Wide().eval().cuda()(torch.from_numpy(x).cuda()).cpu().numpy()
    np.testing.assert_allclose(answer, expected, rtol=1e-4, atol=1e-5)
    (stats,) = await data_plane.model_statistics("m")
    assert stats.inference_stats["success"].count == 3
    assert stats.execution_count == 1
