"""What the size check before every CUDA shared-memory copy costs, per way of asking the driver.

Every input or output a request places in a client's CUDA region is checked against the size of
the allocation the driver says the region maps (``cuMemGetAddressRange``), just before its copy
(``CudaSharedMemoryRegistry._check_allocation``: three per BERT request). The executor's cProfile
of BERT over gRPC + CUDA shm put it at 12% of the loop thread's time. This times
the query on a real allocation, on a thread whose context is current (as the executor's loop
thread is), two ways:

- ``runtime``: ``CudaRuntime.allocation_size``, ``cudaSetDevice`` then ``cuMemGetAddressRange``
  through cuda-python (what infermux does);
- ``ctypes``: ``cuMemGetAddressRange_v2`` alone through ``ctypes`` in the current context (the
  candidate: one driver call fewer). On the H200 it was the slower: 3.0 against 2.5 µs a call
  (``results/gpu/issue24/run2-4f34cae/cuda_shm_check.json``); cuda-python's Cython wrappers cost
  less than ctypes' argument conversion, so the check stays as it is.

    python3 benchmarks/gpu/cuda_shm_check.py --out $OUT/cuda_shm_check.json
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch

from infermux.dataplane.cuda_ipc import CudaRuntime


def _ctypes_query() -> Callable[[int], int]:
    """``cuMemGetAddressRange_v2`` through ctypes: the allocation's size from ``pointer``."""
    query = ctypes.CDLL("libcuda.so.1").cuMemGetAddressRange_v2
    query.restype = ctypes.c_int
    query.argtypes = (
        ctypes.POINTER(ctypes.c_uint64),
        ctypes.POINTER(ctypes.c_size_t),
        ctypes.c_uint64,
    )

    def size(pointer: int) -> int:
        base, length = ctypes.c_uint64(), ctypes.c_size_t()
        if query(ctypes.byref(base), ctypes.byref(length), pointer) != 0:
            raise RuntimeError("cuMemGetAddressRange_v2 failed")
        return base.value + length.value - pointer

    return size


def _per_call_us(size: Callable[[int], int], pointer: int, calls: int) -> float:
    start = time.perf_counter()
    for _ in range(calls):
        size(pointer)
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
    ways: dict[str, Callable[[int], int]] = {
        "runtime": lambda pointer: runtime.allocation_size(pointer, 0),
        "ctypes": _ctypes_query(),
    }
    pointer = memory + 4096
    if len({size(pointer) for size in ways.values()}) != 1:
        raise RuntimeError("the two ways disagree")
    rounds: dict[str, list[float]] = {key: [] for key in ways}
    try:
        for _ in range(args.rounds):  # interleaved, so that drift hits both alike
            for key, size in ways.items():
                rounds[key].append(_per_call_us(size, pointer, args.calls))
    finally:
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
