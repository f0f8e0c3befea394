"""The executor's per-batch Python cost of copying outputs into clients' CUDA shared memory.

``torch_gpu._write_device_outputs`` runs on the event loop for every CUDA-graph batch whose
requests want an output in CUDA shared memory (gRPC + CUDA shm): it decides which requests' rows
can be copied device to device and queues the copies. Its Python work does not depend on the
device, so it is measured here on the CPU: the graph's output is a CPU tensor and the driver's
copy is a no-op. BERT's shape: one FP16 [768] output per request.

    PYTHONPATH=SRC .venv/bin/python benchmarks/ipc/device_outputs.py [--label NAME] [--out FILE.json]

(run once per source tree for an A/B; each run appends its rows to ``--out``).
"""

from __future__ import annotations

import argparse
import json
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class Graph:
    outputs: dict[str, Any]


def measure(requests_per_batch: int) -> float:
    """Microseconds per batch (best of 5 rounds)."""
    import torch

    from infermux.backends import torch_gpu
    from infermux.backends.base import DeviceParts, ModelRequest
    from infermux.runtime.gather_kernel import GATHER
    from infermux.types import DeviceArray

    GATHER.copy = lambda copies, stream, device_id: None  # type: ignore[method-assign]
    graph = Graph({"pooled": torch.zeros(128, 768, dtype=torch.float16)})
    requests = []
    for i in range(requests_per_batch):
        request = ModelRequest({"ids": np.zeros((1, 128), np.int64)}, ("pooled",))
        place = DeviceArray(2**32 + i * 4096, (1, 768), np.dtype(np.float16), 0)
        request.device_outputs["pooled"] = DeviceParts((place,))
        requests.append(request)

    def batch() -> None:
        torch_gpu._write_device_outputs(graph, requests, 0, 0)  # type: ignore[arg-type]

    number = max(1, 20_000 // requests_per_batch)
    best = min(timeit.repeat(batch, number=number, repeat=5))
    return best / number * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", default="head")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    rows = []
    for size in (1, 8, 36, 64):
        us = measure(size)
        rows.append({"tree": args.label, "requests": size, "us_per_batch": round(us, 1)})
        print(f"{args.label}: {size} requests: {us:.1f} us per batch, {us / size:.2f} per request")
    if args.out:
        old = json.loads(args.out.read_text()) if args.out.exists() else []
        args.out.write_text(json.dumps(old + rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
