"""What model instances run on: weights shared per device, CUDA streams and graphs, pinned
staging buffers, memory accounting.

Backend-neutral building blocks below ``infermux.backends``: a backend decides *what* to run, the
runtime decides *where* and *how* its tensors move. torch is imported lazily by each function
that needs it, so importing this package never requires torch.
"""

from infermux.runtime.completions import COMPLETIONS, CompletionError, Completions
from infermux.runtime.graphs import (
    CapturedGraph,
    CudaGraphs,
    GraphBucket,
    GraphCaptureError,
    graph_buckets,
)
from infermux.runtime.memory import MemoryUse, ReportsMemory, describe, total_by_device
from infermux.runtime.shared_weights import WEIGHTS, Lease, SharedWeights, release_device_memory
from infermux.runtime.staging import StagingBuffers
from infermux.runtime.streams import (
    PRIORITY_PARAMETER,
    InstanceStream,
    Occupancy,
    parse_priority,
    priority_for,
)

__all__ = [
    "COMPLETIONS",
    "PRIORITY_PARAMETER",
    "WEIGHTS",
    "CapturedGraph",
    "CompletionError",
    "Completions",
    "CudaGraphs",
    "GraphBucket",
    "GraphCaptureError",
    "InstanceStream",
    "Lease",
    "MemoryUse",
    "Occupancy",
    "ReportsMemory",
    "SharedWeights",
    "StagingBuffers",
    "describe",
    "graph_buckets",
    "parse_priority",
    "priority_for",
    "release_device_memory",
    "total_by_device",
]
