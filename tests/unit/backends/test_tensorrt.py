"""The TensorRT backend on CPU: a fake engine stands in for TensorRT, a fake CUDA for the GPU.

The pure logic (dtype mapping, binding checks, profile choice, engine sharing) never touches
TensorRT; ``run`` is driven through real CPU torch tensors whose addresses the fake execution
context reads and writes, so staging, buffer reuse and profile switching are checked too.
"""

from __future__ import annotations

import contextlib
import ctypes
import enum
import importlib.util
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import ml_dtypes
import numpy as np
import numpy.typing as npt
import pytest

from infermux.backends import BackendRegistry, ModelContext, ModelRequest
from infermux.backends import tensorrt as trt_backend
from infermux.backends.tensorrt import (
    TRT_DATATYPES,
    V2_DATATYPES,
    EngineCache,
    TensorRTBackend,
    TensorRTInstance,
    check_bindings,
    engine_bindings,
    select_profile,
    v2_datatype,
)
from infermux.errors import InvalidArgumentError, ModelLoadError
from infermux.model_config import ModelConfig
from infermux.repository.config_file import parse_config_text
from infermux.types import DATATYPES, numpy_dtype

Shape = tuple[int, ...]


class DataType(enum.Enum):
    """Stands in for ``trt.DataType`` (only member names matter to the backend)."""

    FLOAT = 0
    HALF = 1
    BF16 = 2
    INT8 = 3
    INT32 = 4
    INT64 = 5
    BOOL = 6
    UINT8 = 7
    FP8 = 8


class Mode(enum.Enum):
    INPUT = 1
    OUTPUT = 2


@dataclass
class FakeTensor:
    mode: Mode
    dtype: DataType
    shape: Shape
    profiles: list[tuple[Shape, Shape, Shape]] = field(default_factory=list)
    shape_tensor: bool = False


def doubled(inputs: dict[str, npt.NDArray[Any]]) -> dict[str, npt.NDArray[Any]]:
    return {"OUTPUT0": inputs["INPUT0"] * 2}


class FakeEngine:
    """The subset of ``trt.ICudaEngine`` the backend calls; outputs take INPUT0's shape."""

    def __init__(
        self,
        tensors: dict[str, FakeTensor],
        compute: Callable[[dict[str, npt.NDArray[Any]]], dict[str, npt.NDArray[Any]]] = doubled,
    ) -> None:
        self.tensors = tensors
        self.compute = compute
        self.contexts: list[FakeContext] = []

    @property
    def num_io_tensors(self) -> int:
        return len(self.tensors)

    @property
    def num_optimization_profiles(self) -> int:
        return max((len(t.profiles) for t in self.tensors.values()), default=1) or 1

    def get_tensor_name(self, index: int) -> str:
        return list(self.tensors)[index]

    def get_tensor_mode(self, name: str) -> Mode:
        return self.tensors[name].mode

    def get_tensor_dtype(self, name: str) -> DataType:
        return self.tensors[name].dtype

    def get_tensor_shape(self, name: str) -> list[int]:
        return list(self.tensors[name].shape)

    def is_shape_inference_io(self, name: str) -> bool:
        return self.tensors[name].shape_tensor

    def get_tensor_profile_shape(self, name: str, profile: int) -> list[list[int]]:
        return [list(s) for s in self.tensors[name].profiles[profile]]

    def create_execution_context(self) -> FakeContext:
        self.contexts.append(FakeContext(self))
        return self.contexts[-1]


class FakeContext:
    """``trt.IExecutionContext`` over host memory: addresses are CPU tensors' data pointers."""

    def __init__(self, engine: FakeEngine) -> None:
        self.engine = engine
        self.shapes: dict[str, Shape] = {}
        self.addresses: dict[str, int] = {}
        self.profiles: list[int] = []

    def set_optimization_profile_async(self, profile: int, stream: int) -> bool:
        self.profiles.append(profile)
        return True

    def set_input_shape(self, name: str, shape: Shape) -> bool:
        self.shapes[name] = tuple(shape)
        return True

    def get_tensor_shape(self, name: str) -> list[int]:
        return list(self.shapes.get(name, self.shapes["INPUT0"]))

    def set_tensor_address(self, name: str, address: int) -> bool:
        self.addresses[name] = address
        return True

    def _array(self, name: str) -> npt.NDArray[Any]:
        v2 = v2_datatype(self.engine.tensors[name].dtype)
        dtype = numpy_dtype(v2) if v2 else np.dtype(np.uint8)
        shape = tuple(self.get_tensor_shape(name))
        size = int(np.prod(shape)) * dtype.itemsize
        memory = (ctypes.c_char * size).from_address(self.addresses[name])
        return np.frombuffer(memoryview(memory).cast("B"), dtype).reshape(shape)

    def execute_async_v3(self, stream: int) -> bool:
        inputs = {
            n: self._array(n).copy() for n, t in self.engine.tensors.items() if t.mode is Mode.INPUT
        }
        for name, value in self.engine.compute(inputs).items():
            self._array(name)[...] = value
        return True


class FakeCuda:
    def __init__(self, gpus: int) -> None:
        self.gpus = gpus

    def is_available(self) -> bool:
        return self.gpus > 0

    def device_count(self) -> int:
        return self.gpus

    def device(self, device: object) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def stream(self, stream: object) -> contextlib.nullcontext[None]:
        return contextlib.nullcontext()

    def Stream(self, device: object) -> SimpleNamespace:  # torch's name
        return SimpleNamespace(cuda_stream=7, synchronize=lambda: None)


class FakeTorch:
    """torch with CUDA faked: "device" and "pinned" buffers are plain CPU tensors."""

    __version__ = "0.0+fake"
    version = SimpleNamespace(cuda=None)

    def __init__(self, gpus: int = 1) -> None:
        self.cuda = FakeCuda(gpus)
        self.allocations = 0

    def device(self, name: str) -> str:
        return name

    def empty(
        self, length: int, *, dtype: Any, device: Any = None, pin_memory: bool = False
    ) -> Any:
        torch = pytest.importorskip("torch")
        self.allocations += 1
        return torch.empty(length, dtype=torch.uint8)

    uint8 = "uint8"


CONFIG = """
name: "m"
platform: "tensorrt_plan"
max_batch_size: 16
input [ { name: "INPUT0", data_type: TYPE_FP32, dims: [ 3 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""


def make_config(text: str = CONFIG) -> ModelConfig:
    return ModelConfig.from_proto(parse_config_text(text, "config.pbtxt"), "config.pbtxt")


def identity_engine(
    dtype: DataType = DataType.FLOAT,
    profiles: list[tuple[Shape, Shape, Shape]] | None = None,
) -> FakeEngine:
    profiles = profiles if profiles is not None else [((1, 3), (4, 3), (16, 3))]
    return FakeEngine(
        {
            "INPUT0": FakeTensor(Mode.INPUT, dtype, (-1, 3), profiles),
            "OUTPUT0": FakeTensor(Mode.OUTPUT, dtype, (-1, 3)),
        }
    )


def write_version(tmp_path: Path, config: str = CONFIG, filename: str = "model.plan") -> Path:
    (tmp_path / "m" / "1").mkdir(parents=True)
    (tmp_path / "m" / "config.pbtxt").write_text(config)
    (tmp_path / "m" / "1" / filename).write_bytes(b"plan")
    return tmp_path / "m"


def context_for(model_dir: Path, config: str = CONFIG, device: str = "cuda:0") -> ModelContext:
    return ModelContext(make_config(config), 1, model_dir, model_dir / "1", "m_0", device)


@pytest.fixture
def fake_torch(monkeypatch: pytest.MonkeyPatch) -> FakeTorch:
    torch = FakeTorch()
    monkeypatch.setattr(trt_backend, "_import_runtime", lambda: (object(), torch))
    return torch


class Deserializer:
    def __init__(self, make: Callable[[], Any] = identity_engine) -> None:
        self.make = make
        self.calls: list[tuple[bytes, str]] = []

    def __call__(self, plan: bytes, device: str) -> Any:
        self.calls.append((plan, device))
        return self.make()


# --- installation -------------------------------------------------------------------------------


@pytest.mark.skipif(importlib.util.find_spec("tensorrt") is not None, reason="tensorrt installed")
def test_without_tensorrt_load_names_the_extra(tmp_path: Path) -> None:
    model_dir = write_version(tmp_path)
    with pytest.raises(ModelLoadError) as info:
        TensorRTBackend().load(context_for(model_dir))
    assert "pip install 'infermux[tensorrt]'" in str(info.value)
    assert "NVIDIA GPU" in str(info.value)


def test_without_torch_load_names_the_extra(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", SimpleNamespace())
    monkeypatch.setitem(sys.modules, "torch", None)  # makes the import fail
    with pytest.raises(ModelLoadError, match=r"torch .*pip install 'infermux\[tensorrt\]'"):
        TensorRTBackend().load(context_for(write_version(tmp_path)))


def test_without_cuda_load_says_a_gpu_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(trt_backend, "_import_runtime", lambda: (object(), FakeTorch(gpus=0)))
    with pytest.raises(ModelLoadError, match=r"TensorRT needs an NVIDIA GPU.*no CUDA device"):
        TensorRTBackend().load(context_for(write_version(tmp_path)))


@pytest.mark.parametrize("precision", ["fp16", "bf16", "int8"])
def test_a_reduced_precision_parameter_is_refused_saying_plans_carry_their_own(
    tmp_path: Path, precision: str
) -> None:
    config = CONFIG + f'parameters {{ key: "precision" value {{ string_value: "{precision}" }} }}\n'
    if precision == "int8":
        config += 'parameters { key: "calibration_data" value { string_value: "cal.npz" } }\n'
    model_dir = write_version(tmp_path, config)
    np.savez(model_dir / "cal.npz", x=np.zeros(1))
    with pytest.raises(ModelLoadError, match=r"precision is fixed when the plan is built"):
        TensorRTBackend().load(context_for(model_dir, config))


def test_registry_maps_tensorrt_plan_to_this_backend() -> None:
    backend = BackendRegistry().get(make_config())
    assert isinstance(backend, TensorRTBackend)
    assert (backend.name, backend.stacks_inputs) == ("tensorrt", True)


# --- datatypes ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("trt_name", "v2"),
    [
        ("FLOAT", "FP32"),
        ("HALF", "FP16"),
        ("BF16", "BF16"),
        ("INT8", "INT8"),
        ("INT32", "INT32"),
        ("INT64", "INT64"),
        ("BOOL", "BOOL"),
        ("UINT8", "UINT8"),
    ],
)
def test_dtype_mapping_both_ways(trt_name: str, v2: str) -> None:
    assert v2_datatype(DataType[trt_name]) == v2
    assert TRT_DATATYPES[v2] == trt_name
    assert v2 in DATATYPES


def test_types_without_a_v2_datatype_map_to_none() -> None:
    assert v2_datatype(DataType.FP8) is None
    assert set(V2_DATATYPES.values()) == set(TRT_DATATYPES)


# --- optimisation profiles ----------------------------------------------------------------------

TWO_PROFILES: list[tuple[Shape, Shape, Shape]] = [
    ((1, 3), (2, 3), (4, 3)),
    ((5, 3), (8, 3), (16, 3)),
]


@pytest.mark.parametrize(("batch", "profile"), [(1, 0), (4, 0), (5, 1), (16, 1)])
def test_first_covering_profile_is_chosen(batch: int, profile: int) -> None:
    engine = identity_engine(profiles=TWO_PROFILES)
    assert select_profile(engine, engine_bindings(engine), {"INPUT0": (batch, 3)}) == profile


def test_no_covering_profile_names_the_input_and_ranges() -> None:
    engine = identity_engine(profiles=TWO_PROFILES)
    with pytest.raises(InvalidArgumentError) as info:
        select_profile(engine, engine_bindings(engine), {"INPUT0": (17, 3)})
    assert str(info.value) == (
        "input 'INPUT0' has shape [17, 3], outside every optimisation profile of the TensorRT "
        "engine (profile 0: [1, 3] to [4, 3]; profile 1: [5, 3] to [16, 3])"
    )


def test_one_profile_must_cover_every_input() -> None:
    engine = FakeEngine(
        {
            "A": FakeTensor(
                Mode.INPUT, DataType.FLOAT, (-1,), [((1,), (1,), (2,)), ((3,), (3,), (4,))]
            ),
            "B": FakeTensor(
                Mode.INPUT, DataType.FLOAT, (-1,), [((3,), (3,), (4,)), ((1,), (1,), (2,))]
            ),
        }
    )
    bindings = engine_bindings(engine)
    assert select_profile(engine, bindings, {"A": (3,), "B": (1,)}) == 1
    with pytest.raises(
        InvalidArgumentError, match=r"input 'B' has shape \[1\].*profile 0: \[3\] to \[4\]"
    ):
        select_profile(engine, bindings, {"A": (1,), "B": (1,)})


def test_static_inputs_need_no_profile_but_must_match() -> None:
    engine = FakeEngine({"S": FakeTensor(Mode.INPUT, DataType.FLOAT, (2, 3))})
    bindings = engine_bindings(engine)
    assert select_profile(engine, bindings, {"S": (2, 3)}) == 0
    with pytest.raises(InvalidArgumentError, match=r"takes only \[2, 3\]"):
        select_profile(engine, bindings, {"S": (1, 3)})


# --- bindings -----------------------------------------------------------------------------------


def test_matching_bindings_pass() -> None:
    check_bindings(make_config(), engine_bindings(identity_engine()))


@pytest.mark.parametrize(
    ("tensors", "message"),
    [
        (
            {"OUTPUT0": FakeTensor(Mode.OUTPUT, DataType.FLOAT, (-1, 3))},
            "input 'INPUT0' is not an input of the TensorRT engine (engine inputs: )",
        ),
        (
            {"INPUT0": FakeTensor(Mode.INPUT, DataType.FLOAT, (-1, 3))},
            "output 'OUTPUT0' is not an output of the TensorRT engine",
        ),
        (
            {
                "INPUT0": FakeTensor(Mode.INPUT, DataType.HALF, (-1, 3)),
                "OUTPUT0": FakeTensor(Mode.OUTPUT, DataType.FLOAT, (-1, 3)),
            },
            "input 'INPUT0' is FP32 in the config but HALF in the TensorRT engine (expected FLOAT)",
        ),
        (
            {
                "INPUT0": FakeTensor(Mode.INPUT, DataType.FLOAT, (-1, 3)),
                "OUTPUT0": FakeTensor(Mode.OUTPUT, DataType.FP8, (-1, 3)),
            },
            "output 'OUTPUT0' is FP32 in the config but FP8 in the TensorRT engine",
        ),
        (
            {
                "INPUT0": FakeTensor(Mode.INPUT, DataType.FLOAT, (-1, 4)),
                "OUTPUT0": FakeTensor(Mode.OUTPUT, DataType.FLOAT, (-1, 3)),
            },
            "input 'INPUT0' has shape [-1, 3] in the config (batch dimension included) but "
            "[-1, 4] in the TensorRT engine",
        ),
        (
            {
                "INPUT0": FakeTensor(Mode.INPUT, DataType.FLOAT, (3,)),
                "OUTPUT0": FakeTensor(Mode.OUTPUT, DataType.FLOAT, (-1, 3)),
            },
            "input 'INPUT0' has shape [-1, 3] in the config",
        ),
        (
            {
                "INPUT0": FakeTensor(Mode.INPUT, DataType.FLOAT, (-1, 3)),
                "EXTRA": FakeTensor(Mode.INPUT, DataType.FLOAT, (-1,)),
                "OUTPUT0": FakeTensor(Mode.OUTPUT, DataType.FLOAT, (-1, 3)),
            },
            "engine input 'EXTRA' is not in the config",
        ),
    ],
)
def test_binding_mismatches_name_the_tensor(tensors: dict[str, FakeTensor], message: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(f"model 'm': {message}")):
        check_bindings(make_config(), engine_bindings(FakeEngine(tensors)))


def test_shape_tensors_are_refused() -> None:
    engine = FakeEngine({"S": FakeTensor(Mode.INPUT, DataType.INT64, (2,), shape_tensor=True)})
    with pytest.raises(ModelLoadError, match="'S' is a shape tensor"):
        engine_bindings(engine)


def test_undeclared_outputs_are_allowed() -> None:
    engine = identity_engine()
    engine.tensors["DEBUG"] = FakeTensor(Mode.OUTPUT, DataType.FP8, (-1, 3))
    check_bindings(make_config(), engine_bindings(engine))


# --- engine sharing -----------------------------------------------------------------------------


def test_instances_share_one_engine_released_after_the_last_close(
    tmp_path: Path, fake_torch: FakeTorch
) -> None:
    deserialize = Deserializer()
    cache = EngineCache(deserialize)
    backend = TensorRTBackend(cache)
    model_dir = write_version(tmp_path)
    plan = str(model_dir / "1" / "model.plan")
    key = (plan, os.stat(plan).st_mtime_ns, "cuda:0")

    first = backend.load(context_for(model_dir))
    second = backend.load(context_for(model_dir))
    assert deserialize.calls == [(b"plan", "cuda:0")]
    assert first._engine is second._engine
    assert len(first._engine.contexts) == 2  # one execution context each
    assert first._stream is not second._stream
    assert cache.users(key) == 2

    first.close()
    assert cache.users(key) == 1
    first.close()  # closing twice releases once
    assert cache.users(key) == 1
    second.close()
    assert cache.users(key) == 0

    backend.load(context_for(model_dir)).close()
    assert len(deserialize.calls) == 2  # released, so deserialised afresh


def test_engines_are_per_device_and_per_file_version(tmp_path: Path, fake_torch: FakeTorch) -> None:
    fake_torch.cuda.gpus = 2
    deserialize = Deserializer()
    backend = TensorRTBackend(EngineCache(deserialize))
    model_dir = write_version(tmp_path)
    on_0 = backend.load(context_for(model_dir, device="cuda:0"))
    on_1 = backend.load(context_for(model_dir, device="cuda:1"))
    assert on_0._engine is not on_1._engine
    plan = model_dir / "1" / "model.plan"
    os.utime(plan, ns=(0, os.stat(plan).st_mtime_ns + 10**9))  # the file was rewritten
    rebuilt = backend.load(context_for(model_dir, device="cuda:0"))
    assert rebuilt._engine is not on_0._engine
    assert [device for _, device in deserialize.calls] == ["cuda:0", "cuda:1", "cuda:0"]
    for instance in (on_0, on_1, rebuilt):
        instance.close()


def test_a_failed_load_releases_the_engine(tmp_path: Path, fake_torch: FakeTorch) -> None:
    cache = EngineCache(Deserializer(lambda: identity_engine(DataType.HALF)))
    model_dir = write_version(tmp_path)
    with pytest.raises(ModelLoadError, match="is FP32 in the config but HALF"):
        TensorRTBackend(cache).load(context_for(model_dir))
    plan = str(model_dir / "1" / "model.plan")
    assert cache.users((plan, os.stat(plan).st_mtime_ns, "cuda:0")) == 0


def test_a_plan_tensorrt_refuses_is_a_load_error(tmp_path: Path, fake_torch: FakeTorch) -> None:
    backend = TensorRTBackend(EngineCache(Deserializer(lambda: None)))
    with pytest.raises(ModelLoadError, match="TensorRT cannot deserialise this plan"):
        backend.load(context_for(write_version(tmp_path)))


# --- files and devices --------------------------------------------------------------------------


def test_model_engine_is_found_when_there_is_no_model_plan(
    tmp_path: Path, fake_torch: FakeTorch
) -> None:
    deserialize = Deserializer()
    model_dir = write_version(tmp_path, filename="model.engine")
    TensorRTBackend(EngineCache(deserialize)).load(context_for(model_dir)).close()
    assert len(deserialize.calls) == 1


def test_default_model_filename_is_honoured(tmp_path: Path, fake_torch: FakeTorch) -> None:
    config = CONFIG + 'default_model_filename: "resnet.trt"\n'
    model_dir = write_version(tmp_path, config, filename="resnet.trt")
    backend = TensorRTBackend(EngineCache(Deserializer()))
    backend.load(context_for(model_dir, config)).close()
    (model_dir / "1" / "resnet.trt").rename(model_dir / "1" / "model.plan")
    with pytest.raises(ModelLoadError, match=r"resnet\.trt not found"):
        backend.load(context_for(model_dir, config))


def test_cpu_instance_groups_run_on_the_first_gpu(tmp_path: Path, fake_torch: FakeTorch) -> None:
    deserialize = Deserializer()
    TensorRTBackend(EngineCache(deserialize)).load(
        context_for(write_version(tmp_path), device="cpu")
    ).close()
    assert deserialize.calls[0][1] == "cuda:0"


def test_a_missing_gpu_is_a_load_error(tmp_path: Path, fake_torch: FakeTorch) -> None:
    with pytest.raises(ModelLoadError, match=r"cuda:3 requested, but only 1 CUDA device"):
        TensorRTBackend(EngineCache(Deserializer())).load(
            context_for(write_version(tmp_path), device="cuda:3")
        )


def test_cuda_graphs_are_reported_as_unsupported(
    tmp_path: Path, fake_torch: FakeTorch, caplog: pytest.LogCaptureFixture
) -> None:
    config = CONFIG + "optimization { cuda { graphs: true } }\n"
    with caplog.at_level(logging.WARNING):
        TensorRTBackend(EngineCache(Deserializer())).load(
            context_for(write_version(tmp_path, config), config)
        ).close()
    assert "CUDA graphs are not supported yet" in caplog.text


# --- running a batch ----------------------------------------------------------------------------


@pytest.fixture
def loaded(tmp_path: Path, fake_torch: FakeTorch) -> Iterator[tuple[TensorRTInstance, FakeEngine]]:
    pytest.importorskip("torch")
    engine = identity_engine(profiles=TWO_PROFILES)
    instance = TensorRTBackend(EngineCache(Deserializer(lambda: engine))).load(
        context_for(write_version(tmp_path))
    )
    yield instance, engine
    instance.close()


def requests(*batches: int) -> list[ModelRequest]:
    return [
        ModelRequest({"INPUT0": np.arange(3 * n, dtype=np.float32).reshape(n, 3) + i}, ("OUTPUT0",))
        for i, n in enumerate(batches)
    ]


def test_a_stacked_batch_runs_and_splits(
    loaded: tuple[TensorRTInstance, FakeEngine], fake_torch: FakeTorch
) -> None:
    instance, engine = loaded
    batch = requests(1, 2)
    results = instance.execute(batch)
    for request, result in zip(batch, results, strict=True):
        assert isinstance(result, dict)
        np.testing.assert_array_equal(result["OUTPUT0"], request.inputs["INPUT0"] * 2)
    assert engine.contexts[0].profiles == [0]
    assert engine.contexts[0].shapes["INPUT0"] == (3, 3)


def test_profiles_switch_only_when_needed_and_buffers_only_grow(
    loaded: tuple[TensorRTInstance, FakeEngine], fake_torch: FakeTorch
) -> None:
    instance, engine = loaded
    for sizes in [(2,), (1,), (3, 3), (4, 2), (1,)]:
        for request, result in zip(
            requests(*sizes), instance.execute(requests(*sizes)), strict=True
        ):
            assert isinstance(result, dict)
            np.testing.assert_array_equal(result["OUTPUT0"], request.inputs["INPUT0"] * 2)
    assert engine.contexts[0].profiles == [0, 1, 0]
    # Input and output, each a device and a pinned buffer: allocated for batch 2, then 6.
    assert fake_torch.allocations == 2 * 2 * 2


def test_a_batch_outside_the_profiles_fails_its_requests(
    loaded: tuple[TensorRTInstance, FakeEngine],
) -> None:
    instance, _ = loaded
    results = instance.execute(requests(16, 1))
    assert all(isinstance(r, InvalidArgumentError) for r in results)
    assert "outside every optimisation profile" in str(results[0])


@pytest.mark.parametrize("datatype", ["BF16", "FP16", "BOOL", "INT64", "UINT8"])
def test_every_dtype_is_staged_byte_for_byte(
    tmp_path: Path, fake_torch: FakeTorch, datatype: str
) -> None:
    pytest.importorskip("torch")
    config = CONFIG.replace("TYPE_FP32", f"TYPE_{datatype}")
    dtype = DataType[TRT_DATATYPES[datatype]]
    engine = identity_engine(dtype)
    engine.compute = lambda inputs: {"OUTPUT0": inputs["INPUT0"]}
    instance = TensorRTBackend(EngineCache(Deserializer(lambda: engine))).load(
        context_for(write_version(tmp_path, config), config)
    )
    data = np.array([[1, 0, 1], [0, 1, 1]]).astype(numpy_dtype(datatype))
    if datatype == "BF16":
        data = np.array([[1.5, -2.25, 3.0], [0.5, 8.0, -1.0]], dtype=ml_dtypes.bfloat16)
    (result,) = instance.execute([ModelRequest({"INPUT0": data}, ("OUTPUT0",))])
    assert isinstance(result, dict)
    assert result["OUTPUT0"].dtype == data.dtype
    assert result["OUTPUT0"].tobytes() == data.tobytes()
    instance.close()


def test_undeclared_outputs_are_bound_but_not_returned(
    tmp_path: Path, fake_torch: FakeTorch
) -> None:
    pytest.importorskip("torch")
    engine = identity_engine()
    engine.tensors["DEBUG"] = FakeTensor(Mode.OUTPUT, DataType.FP8, (-1, 3))
    instance = TensorRTBackend(EngineCache(Deserializer(lambda: engine))).load(
        context_for(write_version(tmp_path))
    )
    (result,) = instance.execute(requests(2))
    assert isinstance(result, dict)
    assert set(result) == {"OUTPUT0"}
    assert "DEBUG" in engine.contexts[0].addresses
    instance.close()
