"""JSON documents of the V2 HTTP API built from :mod:`infermux.types` (everything but infer)."""

from __future__ import annotations

from typing import Any

from infermux.types import (
    CudaSharedMemoryRegion,
    Duration,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
    TensorMetadata,
)


def server_metadata(meta: ServerMetadata) -> dict[str, Any]:
    return {"name": meta.name, "version": meta.version, "extensions": list(meta.extensions)}


def _tensor(t: TensorMetadata) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def model_metadata(meta: ModelMetadata) -> dict[str, Any]:
    return {
        "name": meta.name,
        "versions": list(meta.versions),
        "platform": meta.platform,
        "inputs": [_tensor(t) for t in meta.inputs],
        "outputs": [_tensor(t) for t in meta.outputs],
    }


def index_row(entry: RepositoryIndexEntry) -> dict[str, str]:
    # Like Triton, a model that was never loaded is listed by name only.
    row = {"name": entry.name}
    for key in ("version", "state", "reason"):
        value = getattr(entry, key)
        if value:
            row[key] = value
    return row


def _duration(d: Duration) -> dict[str, int]:
    return {"count": d.count, "ns": d.ns}


def statistics(stats: list[ModelStats]) -> dict[str, Any]:
    """Triton's statistics document; counts and ns are JSON numbers, as perf_analyzer needs."""
    return {
        "model_stats": [
            {
                "name": s.name,
                "version": s.version,
                "last_inference": s.last_inference,
                "inference_count": s.inference_count,
                "execution_count": s.execution_count,
                "inference_stats": {k: _duration(d) for k, d in s.inference_stats.items()},
                "batch_stats": [
                    {
                        "batch_size": b.batch_size,
                        "compute_input": _duration(b.compute_input),
                        "compute_infer": _duration(b.compute_infer),
                        "compute_output": _duration(b.compute_output),
                    }
                    for b in s.batch_stats
                ],
                "memory_usage": [
                    {"type": m.type, "id": m.id, "byte_size": m.byte_size} for m in s.memory_usage
                ],
                "response_stats": {
                    index: {key: _duration(d) for key, d in durations.items()}
                    for index, durations in s.response_stats.items()
                },
            }
            for s in stats
        ]
    }


def shm_status(regions: list[SharedMemoryRegion]) -> list[dict[str, Any]]:
    return [
        {"name": r.name, "key": r.key, "offset": r.offset, "byte_size": r.byte_size}
        for r in regions
    ]


def cuda_shm_status(regions: list[CudaSharedMemoryRegion]) -> list[dict[str, Any]]:
    return [{"name": r.name, "device_id": r.device_id, "byte_size": r.byte_size} for r in regions]
