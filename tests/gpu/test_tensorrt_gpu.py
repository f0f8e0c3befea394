"""The TensorRT backend on a CUDA device.

Two layers, skipped independently:

* with ``tensorrt`` installed, a real engine (``y = 2 * x``, two optimisation profiles) is built,
  saved as ``model.plan`` and served, through the backend and through a model repository;
* with only cupy (the GPU machine has no TensorRT), the backend's CUDA side (device and pinned
  buffers, the instance stream, profile switches, two instances on two threads) runs against the
  unit tests' fake engine, whose "kernel" is a cupy computation on the raw device pointers.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest
import torch

from infermux.backends import BackendRegistry, ModelContext, ModelRequest
from infermux.backends import tensorrt as trt_backend
from infermux.backends.tensorrt import EngineCache, TensorRTBackend, TensorRTInstance
from infermux.errors import InvalidArgumentError
from infermux.repository import ModelRepository, load_model_config
from infermux.types import numpy_dtype
from tests.unit.backends import test_tensorrt as fakes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

CONFIG = """
name: "double"
platform: "tensorrt_plan"
max_batch_size: 16
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 3 ] } ]
instance_group [ { kind: KIND_GPU, count: 2 } ]
dynamic_batching { }
"""


def rows(n: int, seed: int = 0) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, 3)).astype(np.float32)


def outputs(instance: TensorRTInstance, *batches: npt.NDArray[Any]) -> list[npt.NDArray[Any]]:
    results = instance.execute([ModelRequest({"INPUT0": x}, ("OUTPUT0",)) for x in batches])
    arrays = []
    for result in results:
        assert not isinstance(result, Exception), result
        arrays.append(np.asarray(result["OUTPUT0"]))
    return arrays


# --- a real TensorRT engine ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def plan(tmp_path_factory: pytest.TempPathFactory) -> bytes:
    trt: Any = pytest.importorskip("tensorrt")
    builder = trt.Builder(trt.Logger(trt.Logger.WARNING))
    network = builder.create_network(0)  # TensorRT 10: every network has an explicit batch
    x = network.add_input("INPUT0", trt.float32, (-1, 3))
    two = network.add_constant((1, 3), np.full((1, 3), 2, np.float32))
    y = network.add_elementwise(x, two.get_output(0), trt.ElementWiseOperation.PROD).get_output(0)
    y.name = "OUTPUT0"
    network.mark_output(y)
    config = builder.create_builder_config()
    for low, best, high in [((1, 3), (2, 3), (4, 3)), ((5, 3), (8, 3), (16, 3))]:
        profile = builder.create_optimization_profile()
        profile.set_shape("INPUT0", low, best, high)
        config.add_optimization_profile(profile)
    serialized = builder.build_serialized_network(network, config)
    assert serialized is not None, "TensorRT could not build the test engine"
    return bytes(serialized)


def write_plan(repo: Path, plan: bytes) -> Path:
    model_dir = repo / "double"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(CONFIG)
    (model_dir / "1" / "model.plan").write_bytes(plan)
    return model_dir


def test_a_real_engine_serves_batches_across_profiles(tmp_path: Path, plan: bytes) -> None:
    model_dir = write_plan(tmp_path, plan)
    config = load_model_config(model_dir)
    cache = EngineCache(trt_backend._deserialize)
    backend = TensorRTBackend(cache)
    first, second = (
        backend.load(ModelContext(config, 1, model_dir, model_dir / "1", f"i{i}", "cuda:0"))
        for i in range(2)
    )
    path = str(model_dir / "1" / "model.plan")
    key = (path, os.stat(path).st_mtime_ns, "cuda:0")
    assert cache.users(key) == 2  # one engine, deserialised once, for both instances
    # Read-only inputs, as decoded from a request body, are staged like any other.
    frozen = np.frombuffer(rows(3, 1).tobytes(), np.float32).reshape(3, 3)
    for instance in (first, second):
        xs = [rows(1, 2), frozen, rows(12, 3)]  # a stacked batch of 4 (profile 0), then 12
        for x, y in zip(xs[:2], outputs(instance, *xs[:2]), strict=True):
            np.testing.assert_array_equal(y, x * 2)
        (y,) = outputs(instance, xs[2])
        np.testing.assert_array_equal(y, xs[2] * 2)
    (error,) = first.execute([ModelRequest({"INPUT0": rows(17)}, ("OUTPUT0",))])
    assert isinstance(error, InvalidArgumentError)
    assert "profile 1: [5, 3] to [16, 3]" in str(error)
    first.close()
    second.close()
    assert cache.users(key) == 0


async def test_a_real_engine_through_the_repository(tmp_path: Path, plan: bytes) -> None:
    write_plan(tmp_path, plan)
    repository = ModelRepository([tmp_path], BackendRegistry())
    await repository.start()
    try:
        assert repository.all_ready(), repository.index()
        x = rows(5, 4)
        done = await repository.get("double").scheduler.submit(
            ModelRequest({"INPUT0": x}, ("OUTPUT0",))
        )
        np.testing.assert_array_equal(np.asarray(done.outputs[0].data), x * 2)
    finally:
        await repository.close()


# --- the CUDA side without TensorRT -------------------------------------------------------------


class StreamHandle:
    """A raw stream handle behind the CUDA stream protocol, as cupy's ``from_external`` takes."""

    def __init__(self, handle: int) -> None:
        self.handle = handle

    def __cuda_stream__(self) -> tuple[int, int]:
        return (0, self.handle)


def external_stream(cupy: Any, handle: int) -> Any:
    if hasattr(cupy.cuda.Stream, "from_external"):  # ExternalStream is deprecated in new cupy
        return cupy.cuda.Stream.from_external(StreamHandle(handle))
    return cupy.cuda.ExternalStream(handle)


class CupyContext(fakes.FakeContext):
    """The fake execution context, computing on the device pointers with cupy."""

    def _device_array(self, name: str) -> Any:
        cupy: Any = pytest.importorskip("cupy")
        datatype = trt_backend.v2_datatype(self.engine.tensors[name].dtype)
        dtype = numpy_dtype(datatype or "UINT8")
        shape = tuple(self.get_tensor_shape(name))
        size = int(np.prod(shape)) * dtype.itemsize
        memory = cupy.cuda.MemoryPointer(
            cupy.cuda.UnownedMemory(self.addresses[name], max(size, 1), None), 0
        )
        if dtype == ml_dtypes.bfloat16:  # cupy has no bfloat16: move the bytes
            return cupy.ndarray((size,), np.uint8, memory)
        return cupy.ndarray(shape, dtype, memory)

    def execute_async_v3(self, stream: int) -> bool:
        cupy: Any = pytest.importorskip("cupy")
        # The backend must hand TensorRT its instance stream, current on this thread.
        assert stream == torch.cuda.current_stream().cuda_stream
        with external_stream(cupy, stream):
            x, y = self._device_array("INPUT0"), self._device_array("OUTPUT0")
            if x.dtype == np.uint8:
                y[...] = x
                return True
            # Slow work first: a missing synchronisation before the copy back would show.
            busy = cupy.ones((2048, 2048), cupy.float32)
            for _ in range(4):
                busy = busy @ busy / 2048.0
            y[...] = x * 2 + (busy[0, 0] - 1).astype(x.dtype)
        return True


def cupy_engine(dtype: fakes.DataType = fakes.DataType.FLOAT) -> fakes.FakeEngine:
    engine = fakes.identity_engine(dtype, profiles=fakes.TWO_PROFILES)

    def create_execution_context() -> fakes.FakeContext:
        engine.contexts.append(CupyContext(engine))
        return engine.contexts[-1]

    engine.create_execution_context = create_execution_context  # type: ignore[method-assign]
    return engine


@pytest.fixture
def cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("cupy")
    monkeypatch.setattr(trt_backend, "_import_runtime", lambda: (object(), torch))


@pytest.mark.usefixtures("cuda_only")
def test_cuda_staging_streams_and_profiles(tmp_path: Path) -> None:
    engine = cupy_engine()
    cache = EngineCache(fakes.Deserializer(lambda: engine))
    model_dir = fakes.write_version(tmp_path)
    first, second = (TensorRTBackend(cache).load(fakes.context_for(model_dir)) for _ in range(2))
    assert first._stream is not second._stream
    for sizes in [(2,), (1,), (3, 3), (4, 2), (1,), (16,)]:
        batch = fakes.requests(*sizes)
        for request, result in zip(batch, first.execute(batch), strict=True):
            assert isinstance(result, dict), result
            np.testing.assert_array_equal(result["OUTPUT0"], request.inputs["INPUT0"] * 2)
    assert engine.contexts[0].profiles == [0, 1, 0, 1]

    failures: list[BaseException] = []

    def hammer(instance: TensorRTInstance, seed: int) -> None:
        try:
            rng = np.random.default_rng(seed)
            for _ in range(40):
                x = rng.standard_normal((int(rng.integers(1, 17)), 3)).astype(np.float32)
                (y,) = outputs(instance, x)
                np.testing.assert_array_equal(y, x * 2)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=hammer, args=(i, n)) for n, i in enumerate([first, second])]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not failures, failures
    first.close()
    second.close()


@pytest.mark.usefixtures("cuda_only")
def test_cuda_bf16_round_trip_is_byte_exact(tmp_path: Path) -> None:
    config = fakes.CONFIG.replace("TYPE_FP32", "TYPE_BF16")
    engine = cupy_engine(fakes.DataType.BF16)
    instance = TensorRTBackend(EngineCache(fakes.Deserializer(lambda: engine))).load(
        fakes.context_for(fakes.write_version(tmp_path, config), config)
    )
    x = np.array([[1.5, -2.25, 3.0], [0.5, 8.0, -1.0]], dtype=ml_dtypes.bfloat16)
    (y,) = outputs(instance, x)
    assert y.dtype == x.dtype
    assert y.tobytes() == x.tobytes()
    instance.close()
