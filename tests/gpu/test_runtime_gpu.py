"""The GPU runtime under PyTorch instances: shared weights, a stream each, no steady-state
allocations."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.pytorch import PyTorchBackend, PyTorchInstance
from infermux.repository import load_model_config
from infermux.runtime import WEIGHTS

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

WIDTH = 16


class Wide(torch.nn.Module):
    """64 MiB of weights: large enough that a second copy would show."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.up = torch.nn.Linear(WIDTH, 4096)
        self.square = torch.nn.Linear(4096, 4096)
        self.down = torch.nn.Linear(4096, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.down(torch.relu(self.square(torch.relu(self.up(x)))) / 64)
        return out


class Chain(torch.nn.Module):
    """Dependent 256x1024x1024 FP32 matmuls: each kernel runs for tens of microseconds (longer than
    launching it) on a fraction of the SMs, so two streams can run side by side. (A first version
    with 8-row matmuls measured 1.86x on an H200: its time was kernel launches, not GPU work.)"""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(1)
        self.up = torch.nn.Linear(WIDTH, 1024)
        self.weight = torch.nn.Parameter(torch.randn(1024, 1024) / 32)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        up: torch.Tensor = self.up(x)
        h = up.repeat(32, 1)
        for _ in range(100):
            h = torch.tanh(h @ self.weight)
        return h[: x.shape[0]]


def write(repo: Path, model: torch.nn.Module, parameters: str = "") -> Path:
    model_dir = repo / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        'name: "m"\nplatform: "pytorch_libtorch"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ {WIDTH} ] }} ]\n'
        'output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ -1 ] } ]\n'
        "instance_group [ { kind: KIND_GPU, count: 1 } ]\n" + parameters
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated
        scripted: torch.jit.ScriptModule = torch.jit.script(model.eval())
        scripted.save(str(model_dir / "1" / "model.pt"))
    return model_dir


def load(model_dir: Path, device: str, count: int) -> list[PyTorchInstance]:
    config = load_model_config(model_dir)
    backend = PyTorchBackend()
    return [
        backend.load(ModelContext(config, 1, model_dir, model_dir / "1", f"m_{i}", device))
        for i in range(count)
    ]


def run(instance: PyTorchInstance, x: npt.NDArray[np.float32]) -> npt.NDArray[Any]:
    (result,) = instance.execute([ModelRequest({"INPUT__0": x}, ("OUTPUT__0",))])
    assert not isinstance(result, Exception), result
    return np.asarray(result["OUTPUT__0"])


def rows(n: int, seed: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, WIDTH)).astype(np.float32)


def close(instances: list[PyTorchInstance]) -> None:
    for instance in instances:
        instance.close()


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
