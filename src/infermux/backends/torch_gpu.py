"""The GPU side of a PyTorch instance: its stream, staging buffers, share of the weights, graphs.

Each batch is copied in through pinned buffers, run (a CUDA graph replay when one fits, else the
model eagerly) and copied out, all queued on the instance's stream. A batch that a graph runs is
*launched* from the event loop (:meth:`GpuPath.launch`: a few non-blocking calls, then the loop
goes on; the completion thread reports the end); an eager batch, hundreds of kernel launches
under the GIL, runs on the instance's thread, which waits once with the GIL released
(:meth:`GpuPath.run`). Buffers are reserved at load for the largest batch, so steady state
allocates nothing.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import numpy as np
import numpy.typing as npt

from infermux.backends.base import ModelContext, ModelRequest, parts_of
from infermux.backends.torch_model import TorchModel
from infermux.backends.torch_tensors import (
    device_tensor,
    download,
    to_numpy,
    torch_dtype,
    weight_bytes,
)
from infermux.runtime import (
    CapturedGraph,
    CudaGraphs,
    GraphCaptureError,
    InstanceStream,
    Lease,
    MemoryUse,
    StagingBuffers,
    graph_buckets,
)
from infermux.runtime.driver import DRIVER, Copy, gathered
from infermux.runtime.gather_kernel import GATHER
from infermux.runtime.host_memory import HOST_MEMORY
from infermux.runtime.streams import Priority
from infermux.types import DeviceArray, numpy_dtype

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

Forward = Callable[[Mapping[str, "torch.Tensor"]], Mapping[str, Any]]


class GpuPath:
    """What a GPU instance adds to the model it runs; built by :meth:`create` at load."""

    def __init__(
        self,
        context: ModelContext,
        stream: InstanceStream,
        staging: StagingBuffers,
        weights: Lease[TorchModel],
    ) -> None:
        self.context = context
        self.stream = stream
        self.staging = staging
        self.weights = weights
        self.graphs: CudaGraphs | None = None
        self.graph_error = ""
        """Why graphs were asked for but are not used ("" when they are, or were not asked)."""
        self.replays = 0
        """Batches run by replaying a graph (the rest ran eagerly)."""
        self.workspace_bytes = 0
        """cuBLAS/cuDNN workspaces on the instance's stream, measured after its first batch."""
        self._workspace_measured = False
        self._weight_bytes = weight_bytes(weights.value.module)

    @classmethod
    def create(
        cls,
        context: ModelContext,
        device: torch.device,
        priority: Priority,
        weights: Lease[TorchModel],
        forward: Forward,
    ) -> GpuPath:
        """Stream, reserved buffers and, when the config asks for them, captured graphs."""
        path = cls(context, InstanceStream(device, priority), StagingBuffers(device), weights)
        buckets = graph_buckets(context.config)
        if buckets:
            path._capture(buckets, forward)
            path._measure_workspace()  # the capture's warm-up ran the model on the stream
        path._reserve(device=path.graphs is None)
        return path

    def graph_for(self, shapes: Mapping[str, tuple[int, ...]]) -> CapturedGraph | None:
        """The captured graph that runs a batch whose inputs have ``shapes`` (None: eager)."""
        if self.graphs is None:
            return None
        return self.graphs.find(shapes, self.context.config.batching)

    def run(
        self,
        forward: Forward,
        inputs: Mapping[str, npt.NDArray[np.generic]],
        device: Mapping[str, Sequence[DeviceArray]],
    ) -> dict[str, npt.NDArray[Any]]:
        """One batch, in and out through the staging buffers, on the instance's stream, waited
        for on the calling thread: host inputs come through pinned memory, ``device`` inputs
        (per-request parts in GPU memory) are gathered device to device."""
        with self.stream.batch():
            staged = self._enqueue(forward, inputs, device)
        return self._collect(staged)

    def launch(
        self,
        graph: CapturedGraph,
        requests: Sequence[ModelRequest],
        done: Callable[[], None],
    ) -> Callable[[], dict[str, npt.NDArray[Any]]]:
        """A batch that ``graph`` runs, enqueued on the stream without waiting: ``done()`` is
        called from the process's completion thread once the GPU finished it; after that the
        returned function gives its outputs (call it before the next launch).

        Each request's rows go to the graph's static inputs where they lie: one asynchronous
        copy per request from pinned host memory (the front end's arena, a shared-memory read's
        staging block) or from a client's CUDA shared memory on this device (one per request
        of a micro-batch too, :class:`~infermux.backends.base.DeviceParts`); only inputs lying
        elsewhere are stacked into the pinned staging buffer first. Outputs a request wants in
        a client's CUDA shared memory (:attr:`~infermux.backends.base.ModelRequest.device_outputs`)
        are copied there from the graph's outputs, device to device, before ``done``."""
        device_id = self.stream.device.index or 0
        with self.stream.launching(done) as stream:
            handle = stream.cuda_stream
            self.copy_in(graph, requests, handle, device_id)
            staged = self.replay(graph, requests, handle, device_id)
        return lambda: self._collect(staged, launched=True)

    def copy_in(
        self,
        graph: CapturedGraph,
        requests: Sequence[ModelRequest],
        handle: int,
        device_id: int,
    ) -> None:
        """The first half of :meth:`launch`: the batch's rows queued on the stream ``handle``
        (current) into the graph's static inputs."""
        first = requests[0]
        for key, target in graph.inputs.items():
            if key in first.device_inputs:
                gpu = [part for r in requests for part in parts_of(r.device_inputs[key])]
                if all(part.device_id == device_id for part in gpu):
                    parts = [(part.pointer, part.nbytes) for part in gpu]
                    GATHER.copy(gathered(target.data_ptr(), parts), handle, device_id)
                else:
                    _gather(gpu, target)
                continue
            arrays = [r.inputs[key] for r in requests]
            host = _pinned_parts(arrays)
            if host is not None:
                DRIVER.copy(gathered(target.data_ptr(), host), handle)
            else:
                self.staging.upload_into(key, self._stacked(key, arrays), target)

    def replay(
        self,
        graph: CapturedGraph,
        requests: Sequence[ModelRequest],
        handle: int,
        device_id: int,
    ) -> dict[str, object]:
        """The second half of :meth:`launch`: the replay and the copies out, queued on the
        stream ``handle`` (current) behind :meth:`copy_in`; returns the pinned tensors the
        outputs are being copied into."""
        batching = self.context.config.batching
        graph.graph.replay()
        self.replays += 1
        rows = sum(r.batch_size for r in requests) if batching else 0
        if batching:
            _write_device_outputs(graph, requests, handle, device_id)
        return {
            key: download(self.staging, key, value[:rows] if batching else value)
            for key, value in graph.outputs.items()
        }

    def _stacked(self, key: str, arrays: list[npt.NDArray[Any]]) -> npt.NDArray[Any]:
        if len(arrays) == 1:
            return arrays[0]
        shape = (sum(a.shape[0] for a in arrays), *arrays[0].shape[1:])
        target = self.staging.pinned_input(key, shape, arrays[0].dtype)
        return np.concatenate(arrays, axis=0, out=target)

    def _enqueue(
        self,
        forward: Forward,
        inputs: Mapping[str, npt.NDArray[np.generic]],
        device: Mapping[str, Sequence[DeviceArray]],
    ) -> dict[str, object]:
        """Queue one batch's copies in, forward (a graph replay when one fits) and copies out
        on the current stream; returns the pinned tensors the outputs are being copied into."""
        batching = self.context.config.batching
        shapes = {key: array.shape for key, array in inputs.items()}
        for key, parts in device.items():
            rows = sum(p.shape[0] for p in parts) if batching else 0
            shapes[key] = (rows, *parts[0].shape[1:]) if batching else parts[0].shape
        graph = self.graph_for(shapes)
        staging = self.staging
        if graph is None:
            tensors = {
                key: staging.upload(key, array, torch_dtype(array.dtype))
                for key, array in inputs.items()
            }
            for key, parts in device.items():
                tensors[key] = _gather(
                    parts, staging.device_buffer(key, shapes[key], torch_dtype(parts[0].dtype))
                )
            outputs = dict(forward(tensors))
        else:
            for key, array in inputs.items():
                staging.upload_into(key, array, graph.inputs[key])
            for key, parts in device.items():
                _gather(parts, graph.inputs[key])
            graph.graph.replay()
            rows = next(iter(shapes.values()))[0] if batching else 0
            outputs = {
                key: value[:rows] if batching else value for key, value in graph.outputs.items()
            }
            self.replays += 1
        return {key: download(staging, key, value) for key, value in outputs.items()}

    def _collect(
        self, staged: Mapping[str, object], *, launched: bool = False
    ) -> dict[str, npt.NDArray[Any]]:
        if launched:
            self.stream.finished()
        if not self._workspace_measured:
            self._measure_workspace()
        # Copied out of the pinned buffers, which the next batch reuses.
        return {key: np.array(to_numpy(value)) for key, value in staged.items()}

    def memory_usage(self) -> list[MemoryUse]:
        device_id = self.stream.device.index or 0
        graphs = self.graphs
        buffers = self.staging.device_bytes() + (graphs.buffer_bytes if graphs else 0)
        # Every instance of this version on this GPU holds the same lease key: one copy.
        shared = "|".join(str(part) for part in self.weights.key)
        rows = [
            MemoryUse("GPU", device_id, "weights", self._weight_bytes, shared),
            MemoryUse("GPU", device_id, "buffers", buffers),
            MemoryUse("CPU_PINNED", 0, "staging", self.staging.pinned_bytes()),
        ]
        if graphs is not None:
            rows.append(MemoryUse("GPU", device_id, "graphs", graphs.pool_bytes))
        rows.append(MemoryUse("GPU", device_id, "workspace", self.workspace_bytes))
        return rows

    def close(self) -> None:
        self.stream.close()
        if self.graphs is not None:
            self.graphs.close()
            self.graphs = None
        self.staging.clear()
        # The last instance on this GPU frees the weights and empties torch's cache.
        self.weights.release()

    def _capture(self, buckets: Any, forward: Forward) -> None:
        import torch

        config = self.context.config
        dtypes = {t.name: torch_dtype(numpy_dtype(t.datatype)) for t in config.inputs}
        try:
            # inference_mode is thread-local: the capture must record no autograd state.
            with torch.inference_mode(), torch.cuda.device(self.stream.device):
                self.graphs = CudaGraphs.capture(buckets, dtypes, forward, self.stream.stream)
        except GraphCaptureError as exc:
            self.graph_error = str(exc)
            logger.warning(
                "model '%s' instance %s: CUDA graphs are off, running eagerly: %s",
                config.name,
                self.context.instance_name,
                exc,
            )
            return
        logger.info(
            "model '%s' instance %s: captured CUDA graphs for batch sizes %s",
            config.name,
            self.context.instance_name,
            self.graphs.batch_sizes,
        )

    def _measure_workspace(self) -> None:
        self._workspace_measured = True
        self.workspace_bytes = self.stream.allocated_bytes()

    def _reserve(self, device: bool) -> None:
        """Buffers for the largest batch of every tensor whose shape the config fixes."""
        config = self.context.config
        rows = max(config.max_batch_size, 1)

        def sizes(tensors: Any) -> dict[str, int]:
            fixed = {}
            for tensor in tensors:
                if all(d > 0 for d in tensor.dims):
                    count = rows * int(np.prod(tensor.dims, dtype=np.int64))
                    fixed[tensor.name] = count * numpy_dtype(tensor.datatype).itemsize
            return fixed

        self.staging.reserve(sizes(config.inputs), sizes(config.outputs), device=device)


def _pinned_parts(arrays: Sequence[npt.NDArray[Any]]) -> list[tuple[int, int]] | None:
    """(address, bytes) of each array when every one is contiguous in pinned host memory."""
    parts = []
    for array in arrays:
        if not array.flags.c_contiguous:
            return None
        address, size = array.__array_interface__["data"][0], array.nbytes
        if not HOST_MEMORY.pinned(address, size):
            return None
        parts.append((address, size))
    return parts


def _gather(parts: Sequence[DeviceArray], target: torch.Tensor) -> torch.Tensor:
    """Copy the parts, one after the other, into the leading rows of ``target`` (device to
    device, on the current stream); returns ``target``."""
    offset = 0
    flat = target.view(-1)
    for part in parts:
        source = device_tensor(part).reshape(-1)
        flat[offset : offset + source.numel()].copy_(source, non_blocking=True)
        offset += source.numel()
    return target


def _write_device_outputs(
    graph: CapturedGraph, requests: Sequence[ModelRequest], stream: int, device_id: int
) -> None:
    """Each request's rows of an output it wants in GPU memory, copied from the graph's output
    into its parts, device to device, on ``stream`` after the replay: the batch completes only
    after them, and the next replay on the stream overwrites the outputs only after them. An
    output whose bytes do not match its places exactly (another dtype, which the host path
    would cast; another device) goes the host way.

    What every request shares (the output's address, row size and dtype) is read once per
    batch: per request only pointer arithmetic and its own places' checks remain. Slicing the
    output per request and numpy's shape products cost ~13 µs a request on the event loop (a
    batch of 36: 450 µs, now 29 µs; ``benchmarks/ipc/device_outputs.py`` on the CPU). All the
    batch's copies go in one launch of :mod:`~infermux.runtime.gather_kernel`."""
    rows_of: dict[str, tuple[int, int, torch.dtype] | None] = {}
    dtypes: dict[np.dtype[Any], torch.dtype] = {}
    copies: list[Copy] = []
    start = 0
    for request in requests:
        count = request.batch_size
        for key, destination in request.device_outputs.items():
            if key not in rows_of:
                rows_of[key] = _output_rows(graph.outputs.get(key))
            layout = rows_of[key]
            if layout is None:
                continue
            address, row_bytes, dtype = layout
            wanted = destination.dtype
            if wanted not in dtypes:
                dtypes[wanted] = torch_dtype(wanted)
            if dtypes[wanted] != dtype:
                continue
            mine = []
            rows = 0
            source = address + start * row_bytes
            for part in destination.parts:
                nbytes = part.nbytes
                if part.device_id != device_id or nbytes != part.shape[0] * row_bytes:
                    break
                mine.append((part.pointer, source, nbytes))
                source += nbytes
                rows += part.shape[0]
            else:
                if rows == count:
                    copies.extend(mine)
                    request.outputs_on_device.add(key)
        start += count
    GATHER.copy(copies, stream, device_id)  # one kernel launch for the batch


def _output_rows(value: torch.Tensor | None) -> tuple[int, int, torch.dtype] | None:
    """A graph output's address, bytes per row and dtype; None when it is missing or its rows
    are not laid out one after the other (then every request goes the host way)."""
    if value is None or not value.is_contiguous():
        return None
    row_bytes = value.element_size() * math.prod(value.shape[1:])
    return value.data_ptr(), row_bytes, value.dtype
