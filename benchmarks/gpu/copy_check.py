"""What queueing a batch's per-request copies costs, one driver call per copy against one
``cuMemcpyBatchAsync`` for the batch (``infermux.runtime.driver.Driver.copy``).

A launched batch copies each request's rows where they lie: from pinned host memory (ResNet-50
over system shared memory: 301,056 bytes a request) or device to device from a client's CUDA
shared memory (BERT: 1,024 bytes a request and input). The executor's cProfile of BERT over CUDA
shm spent ~360 µs of its loop thread per batch of 46 in the per-copy calls. This times, on a
thread whose context is current (as the executor's loop thread is), the CPU time of queueing one
batch of copies and the GPU time the batch takes, both ways, and checks the bytes.

    python3 benchmarks/gpu/copy_check.py --out $OUT/copy_check.json
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

from infermux.runtime.driver import Driver

CASES = (  # (name, bytes per copy, source)
    ("resnet50 row, pinned host -> device", 3 * 224 * 224 * 2, "pinned"),
    ("bert input row, device -> device", 128 * 8, "device"),
)


def _driver(batched: bool) -> Driver:
    driver = Driver()
    driver.bind()
    if not batched:
        driver._batch, driver.batch_copies = None, ""
    return driver


def measure(size: int, source: str, count: int, batched: bool, rounds: int) -> dict[str, Any]:
    driver = _driver(batched)
    sources = [torch.full((size,), i % 251, dtype=torch.uint8) for i in range(count)]
    sources = [s.pin_memory() if source == "pinned" else s.cuda() for s in sources]
    target = torch.empty(size * count, dtype=torch.uint8, device="cuda")
    parts = [(s.data_ptr(), size) for s in sources]
    stream = torch.cuda.Stream()  # type: ignore[no-untyped-call]
    handle = stream.cuda_stream
    cpu_us: list[float] = []
    gpu_us: list[float] = []
    with torch.cuda.device(0):
        for _ in range(10):  # warm-up
            driver.gather_to_device(target.data_ptr(), parts, handle)
        stream.synchronize()
        for _ in range(rounds):
            begin = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            end = torch.cuda.Event(enable_timing=True)  # type: ignore[no-untyped-call]
            begin.record(stream)
            start = time.perf_counter()
            driver.gather_to_device(target.data_ptr(), parts, handle)
            cpu_us.append((time.perf_counter() - start) * 1e6)
            end.record(stream)
            stream.synchronize()
            gpu_us.append(begin.elapsed_time(end) * 1e3)
    expected = torch.cat([s.cpu() for s in sources])
    return {
        "batched": driver.batch_copies or "one cuMemcpyAsync per copy",
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
            for batched in (False, True):
                row = {"case": name, **measure(size, source, count, batched, args.rounds)}
                print(json.dumps(row), flush=True)
                rows.append(row)
    info = {"torch": torch.__version__, "gpu": torch.cuda.get_device_name(0)}
    args.out.write_text(json.dumps({"benchmark": "copy_check", **info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
