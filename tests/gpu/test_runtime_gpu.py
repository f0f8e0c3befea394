"""The GPU runtime under PyTorch instances: shared weights, a stream each, no steady-state
allocations."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from infermux.runtime import WEIGHTS
from tests.gpu.torch_models import Wide, close, load, rows, run, write

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]


def test_instances_on_one_gpu_share_one_copy_of_the_weights(tmp_path: Path) -> None:
    model = Wide()
    one_copy = sum(p.numel() * p.element_size() for p in model.parameters())
    model_dir = write(tmp_path, model)
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated(0)
    instances = load(model_dir, "cuda:0", 4)
    try:
        torch.cuda.synchronize()
        grown = torch.cuda.memory_allocated(0) - before
        assert one_copy * 0.9 < grown < one_copy * 1.5, (grown, one_copy)
        assert len([key for key in WEIGHTS.held() if key[0].startswith(str(tmp_path))]) == 1
    finally:
        close(instances)
    # The last close frees the weights (and empties torch's cache).
    assert torch.cuda.memory_allocated(0) - before < one_copy * 0.1
    assert not [key for key in WEIGHTS.held() if key[0].startswith(str(tmp_path))]


def test_each_instance_has_its_own_stream_and_answers_as_on_the_cpu(tmp_path: Path) -> None:
    model_dir = write(
        tmp_path, Wide(), 'parameters { key: "STREAM_PRIORITY" value { string_value: "high" } }\n'
    )
    gpus = load(model_dir, "cuda:0", 3)
    (cpu,) = load(model_dir, "cpu", 1)
    try:
        streams = [instance.stream for instance in gpus]
        assert all(stream is not None for stream in streams)
        handles = {stream.cuda_stream for stream in streams if stream is not None}
        assert len(handles) == 3
        assert torch.cuda.default_stream(0).cuda_stream not in handles
        cuda: Any = torch.cuda  # the stubs make the static priority_range an instance method
        greatest = cuda.Stream.priority_range()[1]
        assert {stream.priority for stream in streams if stream is not None} == {greatest}
        assert cpu.stream is None
        for n, seed in ((1, 1), (5, 2), (8, 3)):
            x = rows(n, seed)
            expected = run(cpu, x)
            for instance in gpus:
                np.testing.assert_allclose(run(instance, x), expected, rtol=1e-3, atol=1e-4)
    finally:
        close([*gpus, cpu])


def test_no_device_allocations_after_warm_up(tmp_path: Path) -> None:
    (instance,) = load(write(tmp_path, Wide()), "cuda:0", 1)
    try:
        sizes = [1, 3, 8]
        for _ in range(3):  # TorchScript's profiling executor settles within a few runs
            for n in sizes:
                run(instance, rows(n, n))
        torch.cuda.synchronize()
        # segment.*: cudaMalloc calls. (allocation.all.allocated counts every tensor the caching
        # allocator hands out, cache hits included, so it grows with any forward pass.)
        keys = ("segment.all.allocated", "reserved_bytes.all.current", "num_alloc_retries")
        stats = torch.cuda.memory_stats(0)
        warm = {key: stats[key] for key in keys}
        for i in range(50):
            run(instance, rows(sizes[i % 3], i))
        torch.cuda.synchronize()
        stats = torch.cuda.memory_stats(0)
        assert {key: stats[key] for key in keys} == warm
    finally:
        instance.close()


def test_instance_streams_run_batches_concurrently() -> None:
    """Two instance streams driven from two threads overlap on the GPU.

    Each "batch" is one ``torch.cuda._sleep`` kernel (a single thread spinning for a fixed number of
    cycles), so the GPU has room for both and only the streams can serialise them.
    """
    import threading
    import time

    from infermux.runtime import InstanceStream

    device = torch.device("cuda", 0)
    streams = [InstanceStream(device), InstanceStream(device)]
    cycles = 200_000_000  # ~0.1 s on an H200

    def batch(stream: InstanceStream) -> None:
        with stream.batch():
            torch.cuda._sleep(cycles)  # type: ignore[no-untyped-call]  # private, untyped

    batch(streams[0])  # warm-up: the kernel and both streams exist before timing
    batch(streams[1])
    started = time.perf_counter()
    batch(streams[0])
    alone = time.perf_counter() - started
    threads = [threading.Thread(target=batch, args=(s,)) for s in streams]
    started = time.perf_counter()
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    together = time.perf_counter() - started
    for stream in streams:
        stream.close()
    assert together < 1.4 * alone, (together, alone)


GRAPHS = "optimization { cuda { graphs: true } }\n"


class DataDependent(torch.nn.Module):
    """A branch on a value computed on the GPU: the host must wait for it, which a capture
    cannot."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = Wide()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.inner(x)
        if bool(out.sum() > 0):
            return out
        return -out


def test_graph_replays_answer_as_eager_for_every_padded_batch(tmp_path: Path) -> None:
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    (graphed,) = load(write(tmp_path / "graphs", Wide(), GRAPHS), "cuda:0", 1)
    try:
        gpu = graphed.gpu
        assert gpu is not None
        assert gpu.graphs is not None
        assert not gpu.graph_error
        assert gpu.graphs.batch_sizes == [1, 2, 3, 4, 6, 8]
        for n in range(1, 9):  # 5 and 7 are padded up to 6 and 8
            for seed in (n, 100 + n):  # a second batch: stale padding rows must not matter
                x = rows(n, seed)
                np.testing.assert_allclose(run(graphed, x), run(eager, x), rtol=1e-5, atol=1e-6)
        assert gpu.replays == 16
    finally:
        close([eager, graphed])


def test_graph_spec_buckets_and_the_eager_fallback_for_other_batches(tmp_path: Path) -> None:
    spec = (
        "optimization { cuda { graphs: true graph_spec [ { batch_size: 4 "
        "graph_lower_bound { batch_size: 3 } } ] } }\n"
    )
    (eager,) = load(write(tmp_path / "eager", Wide()), "cuda:0", 1)
    (graphed,) = load(write(tmp_path / "graphs", Wide(), spec), "cuda:0", 1)
    try:
        gpu = graphed.gpu
        assert gpu is not None
        assert gpu.graphs is not None
        for n, replays in ((2, 0), (3, 1), (4, 2), (8, 2)):
            x = rows(n, n)
            np.testing.assert_allclose(run(graphed, x), run(eager, x), rtol=1e-5, atol=1e-6)
            assert gpu.replays == replays, n
    finally:
        close([eager, graphed])


def test_a_model_that_cannot_be_captured_runs_eagerly_and_says_why(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level("WARNING"):
        (instance,) = load(write(tmp_path, DataDependent(), GRAPHS), "cuda:0", 1)
    try:
        gpu = instance.gpu
        assert gpu is not None
        assert gpu.graphs is None
        assert "capturing batch size 8 failed" in gpu.graph_error
        assert "CUDA graphs are off, running eagerly" in caplog.text
        x = rows(3, 3)
        np.testing.assert_allclose(
            run(instance, x), DataDependent()(torch.from_numpy(x)).detach().numpy(), rtol=1e-4
        )
        assert gpu.replays == 0
    finally:
        instance.close()


def test_no_device_allocations_after_capture(tmp_path: Path) -> None:
    (instance,) = load(write(tmp_path, Wide(), GRAPHS), "cuda:0", 1)
    try:
        keys = ("segment.all.allocated", "reserved_bytes.all.current", "num_alloc_retries")
        torch.cuda.synchronize()
        before = torch.cuda.memory_stats(0)
        for i in range(40):
            run(instance, rows(1 + i % 8, i))
        torch.cuda.synchronize()
        after = torch.cuda.memory_stats(0)
        assert {k: after[k] for k in keys} == {k: before[k] for k in keys}
        gpu = instance.gpu
        assert gpu is not None
        assert gpu.replays == 40
    finally:
        instance.close()


def test_memory_usage_counts_shared_weights_once_and_matches_the_allocator(
    tmp_path: Path,
) -> None:
    from infermux.runtime import total_by_device
    from infermux.runtime.memory import instance_memory

    model = Wide()
    one_copy = sum(p.numel() * p.element_size() for p in model.parameters())
    # torch keeps a cuBLAS workspace per stream handle for the process's life, and a new stream
    # may get the handle of an earlier test's: its workspace would be counted, not allocated.
    clear = getattr(torch._C, "_cuda_clearCublasWorkspaces", None)
    if clear is not None:
        clear()
    torch.cuda.synchronize()
    allocated = torch.cuda.memory_allocated(0)
    instances = load(write(tmp_path, model, GRAPHS), "cuda:0", 4)
    try:
        torch.cuda.synchronize()
        grown_allocated = torch.cuda.memory_allocated(0) - allocated
        uses = instance_memory(instances)
        weights = [u for u in uses if u.component == "weights"]
        assert len(weights) == 4
        assert {u.byte_size for u in weights} == {one_copy}
        assert all(u.byte_size > 0 for u in uses if u.component in ("graphs", "buffers"))
        assert all(u.byte_size > 0 for u in uses if u.component == "workspace")
        gpu_total = next(m.byte_size for m in total_by_device(uses) if m.type == "GPU")
        pools = sum(u.byte_size for u in uses if u.component == "graphs")
        # Everything but the graph pools is allocated tensors; the pools are reserved segments,
        # of which only the graphs' outputs stay allocated between replays.
        assert 0 <= gpu_total - grown_allocated <= pools, (gpu_total, grown_allocated, pools)
    finally:
        close(instances)


def test_stream_busy_time_gives_an_occupancy(tmp_path: Path) -> None:
    from infermux.runtime import Occupancy

    (instance,) = load(write(tmp_path, Wide()), "cuda:0", 1)
    try:
        gpu = instance.gpu
        assert gpu is not None
        occupancy = Occupancy(gpu.stream.busy_seconds)
        for i in range(20):
            run(instance, rows(8, i))
        assert gpu.stream.busy_seconds > 0
        assert 0 < occupancy.sample(gpu.stream.busy_seconds) <= 1
    finally:
        instance.close()


def test_nvml_reads_the_gpu_and_this_process() -> None:
    import os

    from infermux.runtime.nvml import Nvml

    nvml = Nvml()
    readings = nvml.read()
    assert readings
    assert readings[0].uuid.startswith("GPU-")
    assert 0 <= readings[0].utilization <= 1
    assert 0 < readings[0].memory_used_bytes <= readings[0].memory_total_bytes
    torch.zeros(1, device="cuda:0")
    # Inside a container NVML may not see the host PID namespace's processes; 0 then, not wrong.
    assert nvml.process_memory(os.getpid()) >= 0
