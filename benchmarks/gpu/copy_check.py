"""What queueing a batch's per-request copies costs: one driver call per copy, one
``cuMemcpyBatchAsync`` for the batch (``infermux.runtime.driver.Driver.copy``), and for device to
device copies one launch of the gather kernel (``infermux.runtime.gather_kernel``).

A launched batch copies each request's rows where they lie: from pinned host memory (ResNet-50
over system shared memory: 301,056 bytes a request) or device to device from a client's CUDA
shared memory (BERT: 1,024 bytes a request and input). The executor's cProfile of BERT over CUDA
shm spent ~360 µs of its loop thread per batch of 46 in the per-copy calls. This times, on a
thread whose context is current (as the executor's loop thread is), the CPU time of queueing one
batch of copies and the GPU time the batch takes, each way, and checks the bytes.

    python3 benchmarks/gpu/copy_check.py --out $OUT/copy_check.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "src"))

import torch

from infermux.runtime.driver import Copy, Driver, gathered
from infermux.runtime.gather_kernel import GatherKernel

CASES = (  # (name, bytes per copy, source)
    ("resnet50 row, pinned host -> device", 3 * 224 * 224 * 2, "pinned"),
    ("bert input row, device -> device", 128 * 8, "device"),
)


WAYS = ("per-copy", "batched", "kernel")


def _copier(way: str) -> tuple[Callable[[list[Copy], int], None], str]:
    """A function queueing one batch's copies on a stream, and what it uses."""
    driver = Driver()
    driver.bind()
    if way == "kernel":
        kernel = GatherKernel(driver)
        if not kernel.function(0):
            raise RuntimeError(f"no gather kernel: {kernel.unavailable}")
        return (lambda copies, stream: kernel.copy(copies, stream, 0)), "infermux_gather kernel"
    if way == "per-copy":
        driver._batch, driver.batch_copies = None, ""
    return driver.copy, driver.batch_copies or "one cuMemcpyAsync per copy"


def measure(size: int, source: str, count: int, way: str, rounds: int) -> dict[str, Any]:
    sources = [torch.full((size,), i % 251, dtype=torch.uint8) for i in range(count)]
    sources = [s.pin_memory() if source == "pinned" else s.cuda() for s in sources]
    target = torch.empty(size * count, dtype=torch.uint8, device="cuda")
    copies = gathered(target.data_ptr(), [(s.data_ptr(), size) for s in sources])
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    handle = stream.cuda_stream
    cpu_us: list[float] = []
    gpu_us: list[float] = []
    with torch.cuda.device(0):
        copy, uses = _copier(way)
        for _ in range(10):  # warm-up
            copy(copies, handle)
        stream.synchronize()
        for _ in range(rounds):
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record(stream)
            start = time.perf_counter()
            copy(copies, handle)
            cpu_us.append((time.perf_counter() - start) * 1e6)
            end.record(stream)
            stream.synchronize()
            gpu_us.append(begin.elapsed_time(end) * 1e3)
    expected = torch.cat([s.cpu() for s in sources])
    return {
        "way": way,
        "uses": uses,
        "copies": count,
        "bytes_per_copy": size,
        "cpu_us_per_batch_p50": round(statistics.median(cpu_us), 2),
        "gpu_us_per_batch_p50": round(statistics.median(gpu_us), 2),
        "correct": bool(torch.equal(target.cpu(), expected)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--counts", default="1,8,30,46")
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args()
    rows = []
    for name, size, source in CASES:
        for count in (int(c) for c in args.counts.split(",")):
            for way in WAYS:
                if way == "kernel" and source != "device":
                    continue  # host rows go by the copy engines, never the kernel
                row = {"case": name, **measure(size, source, count, way, args.rounds)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    args.out.write_text(json.dumps({"benchmark": "copy_check", **info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
