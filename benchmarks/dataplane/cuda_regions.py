"""What the executor's loop spends per request on a CUDA-shm micro-batch's regions, apart from CUDA.

On the H200, BERT over gRPC + CUDA shm is bound by the executor's loop (0.9 of a core at c=256),
and its cProfile (``results/gpu/issue24/cprofile-cuda-80b6b23/``) puts the largest per-request
share in the data plane's handling of each request's slices: references parsed, bounds and
sizes checked, one device view per input and output. This harness times exactly that work for
one micro-batch as the executor receives it from a front end -- ``stacked_request`` (the inputs'
device views), ``check_output_regions`` and ``device_destinations`` (the outputs' places) --
with CUDA replaced by a stand-in (the regions "open" to fake pointers; the driver's
allocation-size query answers from a table), so it runs anywhere and measures Python only.

The workload is perf_analyzer's: BERT-base's two INT64 [128] inputs and one FP16 [768] output,
every request naming the same three regions. ``--src NAME=DIR`` (repeatable) runs each tree (a
checkout's ``src``) in its own process, alternating trees every round; medians over ``--rounds``.

    .venv/bin/python benchmarks/dataplane/cuda_regions.py --src base=/tmp/base/src --src head=src
        [--requests 6,32] [--rounds 7] [--out benchmarks/results/cuda_regions]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CONFIG = """name: "bert"
platform: "pytorch_libtorch"
max_batch_size: 64
input [ { name: "input_ids", data_type: TYPE_INT64, dims: [ 128 ] },
        { name: "attention_mask", data_type: TYPE_INT64, dims: [ 128 ] } ]
output [ { name: "pooled", data_type: TYPE_FP16, dims: [ 768 ] } ]
"""
REGION_BYTES = 1 << 20


class StandInIpc:
    """CUDA IPC without CUDA: every handle opens at its own fake address."""

    device_count = 1

    def __init__(self) -> None:
        self.opened = 0

    def open(self, handle: bytes, device_id: int) -> int:
        self.opened += 1
        return 0x7F0000000000 + self.opened * REGION_BYTES * 4

    def close(self, pointer: int, device_id: int) -> None:
        pass

    def allocation_size(self, pointer: int, device_id: int) -> int:
        return REGION_BYTES

    def to_host(self, pointer: int, target: Any, device_id: int) -> None:
        raise AssertionError("the harness's inputs stay on the device")

    def from_host(self, pointer: int, data: bytes, device_id: int) -> None:
        raise AssertionError("the harness's outputs are placed on the device")


def measure(requests: int, seconds: float) -> dict[str, float]:
    """Median µs per request of one micro-batch's region handling, in this process's tree."""
    import numpy as np
    from google.protobuf import text_format
    from tritonclient.grpc import model_config_pb2 as pb

    from infermux.dataplane.cuda_shared_memory import CudaSharedMemoryRegistry
    from infermux.dataplane.micro_batches import (
        check_output_regions,
        device_destinations,
        per_request,
        stacked_request,
    )
    from infermux.dataplane.regions import Regions
    from infermux.dataplane.shared_memory import SharedMemoryRegistry
    from infermux.model_config import ModelConfig
    from infermux.types import (
        SHM_BYTE_SIZE,
        SHM_OFFSET,
        SHM_REGION,
        InferRequest,
        Parameters,
        RequestedOutput,
        Tensor,
    )

    ipc = StandInIpc()
    cuda = CudaSharedMemoryRegistry(enabled=True, ipc=lambda: ipc)
    for index, name in enumerate(("ids", "mask", "out")):
        cuda.register(name, bytes([index]) * 64, 0, REGION_BYTES)
    regions = Regions(SharedMemoryRegistry(enabled=True), cuda)
    config = ModelConfig.from_proto(text_format.Parse(CONFIG, pb.ModelConfig()))
    rows = [1] * requests

    def micro_batch() -> InferRequest:
        # As the executor decodes a front end's frame: each request's inputs in turn, then its
        # outputs in turn, every reference a fresh parameters dict.
        inputs, outputs = [], []
        for _ in range(requests):
            for name, region in (("input_ids", "ids"), ("attention_mask", "mask")):
                where: Parameters = {SHM_REGION: region, SHM_OFFSET: 0, SHM_BYTE_SIZE: 1024}
                inputs.append(Tensor(name, "INT64", (1, 128), np.empty(0, np.int64), where))
            out: Parameters = {SHM_REGION: "out", SHM_OFFSET: 0, SHM_BYTE_SIZE: 1536}
            outputs.append(RequestedOutput("pooled", out))
        return InferRequest("bert", "", inputs, outputs)

    def once() -> float:
        request = micro_batch()
        started = time.perf_counter_ns()
        _, device = stacked_request(request, requests, True, regions, [], on_device=True)
        wanted = per_request(request.outputs, requests)
        check_output_regions(config, wanted, rows, regions)
        places = device_destinations(config, wanted, rows, regions)
        elapsed = time.perf_counter_ns() - started
        assert len(device) == 2, device  # every input stays on the device
        assert len(places) == 1, places  # and the output is placed there
        return elapsed / 1e3 / requests

    samples = []
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        samples.append(once())
    return {"us_per_request": statistics.median(samples), "batches": len(samples)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--src", action="append", default=[], help="NAME=DIR (repeatable)")
    parser.add_argument("--requests", default="6,32", help="requests per micro-batch")
    parser.add_argument("--seconds", type=float, default=1.0, help="per measurement")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cuda_regions"))
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:  # one measurement, in the tree on PYTHONPATH
        print(json.dumps(measure(int(args.child), args.seconds)))
        return
    trees = dict(s.split("=", 1) for s in args.src) or {"this": "src"}
    sizes = [int(n) for n in args.requests.split(",")]
    readings: dict[str, dict[int, list[float]]] = {t: {n: [] for n in sizes} for t in trees}
    for round_ in range(args.rounds):
        order = list(trees) if round_ % 2 == 0 else list(reversed(trees))
        for requests in sizes:
            for tree in order:
                env = {**os.environ, "PYTHONPATH": str(Path(trees[tree]).resolve())}
                child = [sys.executable, __file__, "--child", str(requests)]
                child += ["--seconds", str(args.seconds)]
                out = subprocess.run(child, env=env, check=True, capture_output=True, text=True)
                readings[tree][requests].append(json.loads(out.stdout)["us_per_request"])
    medians = {t: {n: statistics.median(v) for n, v in by.items()} for t, by in readings.items()}
    args.out.mkdir(parents=True, exist_ok=True)
    result: dict[str, Any] = {
        "command": " ".join(sys.argv),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "trees": trees,
        "readings_us_per_request": readings,
        "median_us_per_request": medians,
    }
    (args.out / "cuda_regions.json").write_text(json.dumps(result, indent=2) + "\n")
    lines = [
        "# A CUDA-shm micro-batch's region handling, µs of Python per request",
        "",
        f"`{result['command']}`; {args.rounds} rounds, medians. BERT-base's two inputs and one "
        "output per request, perf_analyzer's three shared regions; CUDA replaced by a stand-in.",
        "",
        "| requests per micro-batch | " + " | ".join(trees) + " |",
        "|---:|" + "---:|" * len(trees),
    ]
    first = next(iter(trees))
    for n in sizes:
        cells = [f"{medians[t][n]:.2f}" for t in trees]
        cells[1:] = [
            f"{medians[t][n]:.2f} ({medians[t][n] / medians[first][n]:.2f}x)"
            for t in list(trees)[1:]
        ]
        lines.append(f"| {n} | " + " | ".join(cells) + " |")
    (args.out / "cuda_regions.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
