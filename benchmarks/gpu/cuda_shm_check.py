"""What the size check before every CUDA shared-memory copy costs, per way of asking the driver.

Every input or output a request places in a client's CUDA region is checked against the size of
the allocation the driver says the region maps (``cuMemGetAddressRange``), just before its copy
(``CudaSharedMemoryRegistry._check_allocation``: three per BERT request). The executor's cProfile
of BERT over gRPC + CUDA shm put it at 12% of the loop thread's time. This times
``CudaRuntime.allocation_size`` on a real allocation, on a thread whose context is current (as
the executor's loop thread is), both ways:

- ``ctypes``: ``cuMemGetAddressRange_v2`` through ``ctypes`` in the current context (the path
  taken now);
- ``runtime``: ``cudaSetDevice`` then ``cuMemGetAddressRange`` through cuda-python (the path
  before, still the fallback when the current context does not answer).

    python3 benchmarks/gpu/cuda_shm_check.py --out $OUT/cuda_shm_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch

from infermux.dataplane.cuda_shared_memory import CudaRuntime
from infermux.runtime.driver import DRIVER


def _per_call_us(runtime: CudaRuntime, pointer: int, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        runtime.allocation_size(pointer, 0)
    return (time.perf_counter() - start) / calls * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runtime = CudaRuntime()
    allocator: Any = torch.cuda.memory  # its delete is unannotated
    memory = allocator.caching_allocator_alloc(1 << 20, 0)
    torch.cuda.synchronize()
    ctypes_path = DRIVER.allocation_end
    rounds: dict[str, list[float]] = {"ctypes": [], "runtime": []}
    try:
        for _ in range(args.rounds):  # interleaved, so that drift hits both alike
            DRIVER.allocation_end = ctypes_path  # type: ignore[method-assign]
            rounds["ctypes"].append(_per_call_us(runtime, memory + 4096, args.calls))
            DRIVER.allocation_end = lambda pointer: None  # type: ignore[method-assign]
            rounds["runtime"].append(_per_call_us(runtime, memory + 4096, args.calls))
    finally:
        DRIVER.allocation_end = ctypes_path  # type: ignore[method-assign]
        allocator.caching_allocator_delete(memory)
    result: dict[str, Any] = {
        "device": torch.cuda.get_device_name(0),
        "calls_per_round": args.calls,
        "rounds_us_per_call": rounds,
        "median_us_per_call": {key: statistics.median(v) for key, v in rounds.items()},
    }
    medians = result["median_us_per_call"]
    result["runtime_over_ctypes"] = medians["runtime"] / medians["ctypes"]
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
