"""CUDA graphs: one captured graph per batch-size bucket, replayed with the batch padded up.

A forward pass of a convolutional or transformer model is hundreds of kernel launches; at small
batches launching them costs more CPU time than the GPU spends running them, and the Python
thread that launches them holds the GIL. A captured graph replays all of them with one call.

With ``optimization { cuda { graphs: true } }`` each GPU instance captures, at load, one graph per
bucket of :func:`graph_buckets`, largest first, all in one memory pool (an instance replays one
graph at a time, so their intermediate tensors may share memory). A batch of ``n`` rows replays
the smallest bucket that holds ``n`` (``graph_lower_bound`` permitting), its rows copied into the
graph's static inputs; rows past ``n`` keep whatever the last batch left there, and their outputs
are dropped. Shapes past the batch dimension must match the bucket exactly; anything else (a
larger batch, other shapes, an optional input left out) runs eagerly.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from infermux.errors import ModelLoadError
from infermux.model_config import ModelConfig

if TYPE_CHECKING:
    import torch

logger = logging.getLogger(__name__)

TRITON_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16)
"""Triton's TensorRT backend captures these (up to ``max_batch_size``) without dynamic batching."""


@dataclass(frozen=True, slots=True)
class GraphBucket:
    """One graph to capture: ``batch_size`` rows (0 for a model without a batch dimension),
    used for batches of ``lower_bound`` to ``batch_size`` rows, with input shapes ``dims``
    (past the batch dimension) for every input."""

    batch_size: int
    lower_bound: int
    dims: Mapping[str, tuple[int, ...]] = field(default_factory=dict)


class GraphCaptureError(Exception):
    """The model cannot be captured; the message says why (it then runs eagerly)."""


def graph_buckets(config: ModelConfig) -> tuple[GraphBucket, ...]:
    """The buckets to capture, smallest first; () when the config does not ask for graphs.

    ``graph_spec`` entries are taken as written. Without them the batch sizes are Triton's
    defaults ({1, preferred sizes, max} with dynamic batching, else {1, 2, 3, 4, 6, 8, 12, 16,
    max}) plus :func:`padding_sizes` up to ``max_batch_size``: Triton's TensorRT backend runs a
    batch between buckets without a graph, infermux pads it up, and those sizes bound the padding
    of a batch over 8 rows to under 4 rows or an eighth. Raises :class:`ModelLoadError` for an
    invalid spec.
    """
    cuda = config.proto.optimization.cuda
    if not cuda.graphs:
        return ()
    fixed = {t.name: t.dims for t in config.inputs}
    if cuda.graph_spec:
        return tuple(
            sorted(
                (_spec_bucket(config, i, spec, fixed) for i, spec in enumerate(cuda.graph_spec)),
                key=lambda b: b.batch_size,
            )
        )
    top = config.max_batch_size
    if top == 0:
        return (GraphBucket(0, 0, fixed),)
    sizes = {1, top}
    if config.dynamic_batching is not None:
        sizes.update(config.dynamic_batching.preferred_batch_sizes)
    else:
        sizes.update(size for size in TRITON_BUCKETS if size <= top)
    sizes.update(padding_sizes(top))
    return tuple(GraphBucket(size, 1, fixed) for size in sorted(sizes))


def padding_sizes(top: int) -> list[int]:
    """Batch sizes up to ``top`` whose graphs pad a batch of 8 to 64 rows by at most one row and
    a larger one by less than an eighth: the powers of two, every second size from 8 to 64, and
    from 64 on the sizes between each power ``p`` and the next in steps of ``p / 8`` (10, 12, ...,
    62, 64, 72, ..., 120, 128, 144, ...: 40 graphs for 128). Once batches fill the GPU a padded
    row costs as much as a real one: with powers of two alone a dynamic batcher's batches of 33
    rows ran at the cost of 64; with steps of 4 ResNet-50 at c=256 still ran 5.8% padding rows,
    where its batches form (docs/decisions.md). Below 8 rows a GPU runs a padded row at almost no
    cost. Above 64 the steps grow with the power, so that a large ``max_batch_size`` keeps a
    bounded number of graphs (8 per doubling)."""
    sizes = []
    power = 1
    while power <= top:
        sizes.append(power)
        if power >= 8:
            step = 2 if power < 64 else power // 8
            sizes.extend(range(power + step, min(2 * power, top + 1), step))
        power *= 2
    return sizes


def _spec_bucket(
    config: ModelConfig, index: int, spec: Any, fixed: Mapping[str, tuple[int, ...]]
) -> GraphBucket:
    where = f"optimization.cuda.graph_spec[{index}]"

    def fail(problem: str) -> ModelLoadError:
        return ModelLoadError(f"model '{config.name}': {where}: {problem}")

    top = config.max_batch_size
    size = int(spec.batch_size)
    if (top == 0 and size != 0) or (top > 0 and not 1 <= size <= top):
        allowed = "0 (the model does not batch)" if top == 0 else f"in [1, {top}]"
        raise fail(f"batch_size must be {allowed}, got {size}")
    lower = int(spec.graph_lower_bound.batch_size) if spec.HasField("graph_lower_bound") else 1
    if top > 0 and not 1 <= lower <= size:
        raise fail(f"graph_lower_bound.batch_size must be in [1, {size}], got {lower}")
    dims = dict(fixed)
    for name, shape in spec.input.items():
        if name not in fixed:
            raise fail(f"input '{name}' is not an input of the model")
        given = tuple(int(d) for d in shape.dim)
        declared = fixed[name]
        matches = len(given) == len(declared) and all(
            d in (g, -1) for d, g in zip(declared, given, strict=True)
        )
        if not matches or any(g < 1 for g in given):
            raise fail(
                f"input '{name}' dims {list(given)} do not fit the config's {list(declared)}"
            )
        dims[name] = given
    return GraphBucket(size, lower if top > 0 else 0, dims)


@dataclass(slots=True)
class CapturedGraph:
    """A bucket's graph: write rows into ``inputs`` (views of the static buffers), ``replay()``,
    read rows of ``outputs``."""

    bucket: GraphBucket
    graph: torch.cuda.CUDAGraph
    inputs: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]


Forward = Callable[[Mapping[str, "torch.Tensor"]], Mapping[str, Any]]
"""The model as a graph captures it: input tensors by name -> output tensors by name."""


class CudaGraphs:
    """An instance's captured graphs, its static input buffers and their shared memory pool."""

    def __init__(
        self, graphs: list[CapturedGraph], buffer_bytes: int, pool: Any, pool_bytes: int
    ) -> None:
        self.graphs = sorted(graphs, key=lambda g: g.bucket.batch_size)
        self._pool = pool  # kept alive as long as the graphs that allocate from it
        self.buffer_bytes = buffer_bytes
        """Device bytes of the static input buffers (shared by every bucket)."""
        self.pool_bytes = pool_bytes
        """Device bytes of the graphs' memory pool (intermediates and outputs)."""

    @property
    def batch_sizes(self) -> list[int]:
        return [g.bucket.batch_size for g in self.graphs]

    def close(self) -> None:
        """Drop the graphs and their pool (the caller empties torch's cache afterwards)."""
        self.graphs = []
        self._pool = None

    def find(self, shapes: Mapping[str, tuple[int, ...]], batching: bool) -> CapturedGraph | None:
        """The graph for a batch whose inputs have ``shapes`` (batch dimension included)."""
        rows = next(iter(shapes.values()))[0] if batching and shapes else 0
        for graph in self.graphs:  # smallest first
            bucket = graph.bucket
            if batching and not bucket.lower_bound <= rows <= bucket.batch_size:
                continue
            if shapes.keys() != bucket.dims.keys():
                return None  # an optional input left out: no graph has that signature
            if all(
                tuple(shape[1:] if batching else shape) == bucket.dims[name]
                for name, shape in shapes.items()
            ):
                return graph
        return None

    @classmethod
    def capture(
        cls,
        buckets: tuple[GraphBucket, ...],
        dtypes: Mapping[str, torch.dtype],
        forward: Forward,
        stream: torch.cuda.Stream,
    ) -> CudaGraphs:
        """Capture every bucket on ``stream`` (the instance's), largest first.

        Raises :class:`GraphCaptureError` saying why when the model cannot be captured: an input
        without fixed dims, a forward that synchronises with the host or returns something that
        is not a tensor with the bucket's rows, or a CUDA error during capture.
        """
        import torch

        for bucket in buckets:
            for name, dims in bucket.dims.items():
                if any(d < 1 for d in dims):
                    raise GraphCaptureError(
                        f"input '{name}' has variable dims {list(dims)}; give its shape in "
                        "optimization.cuda.graph_spec input"
                    )
        device = stream.device
        # One buffer per input, large enough for the largest bucket; each bucket views its head.
        sizes = {
            name: max(_numel(b, dims) for b in buckets for dims in [b.dims[name]])
            for name in dtypes
        }
        storage = {
            name: torch.zeros(size, dtype=dtypes[name], device=device)
            for name, size in sizes.items()
        }
        buffer_bytes = sum(t.numel() * t.element_size() for t in storage.values())
        cuda: Any = torch.cuda  # torch's stubs leave graph() partly unannotated
        # A pool handle, not a MemPool object: the graphs keep the pool alive and free it with
        # the last of them, in any order (a MemPool destroyed before its graphs aborts).
        pool = torch.cuda.graph_pool_handle()
        graphs = []
        for bucket in sorted(buckets, key=lambda b: -b.batch_size):
            inputs = {
                name: storage[name][: _numel(bucket, dims)].view(_shape(bucket, dims))
                for name, dims in bucket.dims.items()
            }
            graphs.append(_capture_one(bucket, inputs, forward, stream, pool=pool, cuda=cuda))
        stream.synchronize()
        return cls(graphs, buffer_bytes, pool, _pool_bytes(pool))


def _capture_one(
    bucket: GraphBucket,
    inputs: dict[str, torch.Tensor],
    forward: Forward,
    stream: torch.cuda.Stream,
    *,
    pool: Any,
    cuda: Any,
) -> CapturedGraph:
    import torch

    with torch.cuda.stream(stream):
        # Eager runs first: cuDNN/cuBLAS pick their algorithms and workspaces and TorchScript's
        # profiling executor settles, none of which may happen inside a capture.
        for _ in range(3):
            forward(inputs)
    stream.synchronize()
    graph = cuda.CUDAGraph()
    try:
        # thread_local: only this thread's unsafe calls break the capture; other models'
        # instances keep running on the same GPU while this one loads.
        with cuda.graph(graph, pool=pool, stream=stream, capture_error_mode="thread_local"):
            result = forward(inputs)
    except Exception as exc:
        raise GraphCaptureError(f"capturing batch size {bucket.batch_size} failed: {exc}") from exc
    outputs: dict[str, torch.Tensor] = {}
    for name, value in result.items():
        if not isinstance(value, torch.Tensor):
            raise GraphCaptureError(f"output '{name}' is a {type(value).__name__}, not a tensor")
        if bucket.batch_size and (value.ndim == 0 or value.shape[0] != bucket.batch_size):
            raise GraphCaptureError(
                f"output '{name}' has shape {list(value.shape)}: its first dimension is not the "
                f"batch ({bucket.batch_size} rows)"
            )
        outputs[name] = value
    return CapturedGraph(bucket, graph, inputs, outputs)


def _shape(bucket: GraphBucket, dims: tuple[int, ...]) -> tuple[int, ...]:
    return ((bucket.batch_size,) if bucket.batch_size else ()) + dims


def _numel(bucket: GraphBucket, dims: tuple[int, ...]) -> int:
    return math.prod(_shape(bucket, dims))


def _pool_bytes(pool: Any) -> int:
    """Bytes of the driver memory (segments) that the pool holds, read once, after capture."""
    import torch

    cuda: Any = torch.cuda  # memory_snapshot is unannotated
    try:
        segments = cuda.memory_snapshot()
        wanted = tuple(pool)
        return sum(
            int(s["total_size"]) for s in segments if tuple(s.get("segment_pool_id", ())) == wanted
        )
    except Exception:  # a torch whose snapshot lacks pool ids: reported as 0, and said so
        logger.warning("cannot read the CUDA graph pool's size; it is reported as 0", exc_info=True)
        return 0
