"""ONNX models built with ``onnx.helper`` (no downloads), shared by the ONNX Runtime tests."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

ort = pytest.importorskip("onnxruntime")
onnx = pytest.importorskip("onnx")

OPSET = 17
WEIGHTS = np.random.default_rng(3).standard_normal((4, 3)).astype(np.float32)
BIAS = np.random.default_rng(4).standard_normal(3).astype(np.float32)


def make_model(nodes: list[Any], inputs: list[Any], outputs: list[Any], **graph: Any) -> Any:
    g = onnx.helper.make_graph(nodes, "g", inputs, outputs, **graph)
    # IR 8 / opset 17 load in every onnxruntime the ``onnx`` extra allows (>= 1.18).
    return onnx.helper.make_model(
        g, opset_imports=[onnx.helper.make_opsetid("", OPSET)], ir_version=8
    )


def tensor(name: str, elem_type: int, shape: list[Any] | None) -> Any:
    return onnx.helper.make_tensor_value_info(name, elem_type, shape)


def mlp_model(k: str | int = 4) -> Any:
    """Y = relu(X @ W + B) with a symbolic batch dim ``N``: X [N, 4] float -> Y [N, 3]."""
    T = onnx.TensorProto
    return make_model(
        [
            onnx.helper.make_node("MatMul", ["X", "W"], ["XW"]),
            onnx.helper.make_node("Add", ["XW", "B"], ["XWB"]),
            onnx.helper.make_node("Relu", ["XWB"], ["Y"]),
        ],
        [tensor("X", T.FLOAT, ["N", k])],
        [tensor("Y", T.FLOAT, ["N", 3])],
        initializer=[
            onnx.numpy_helper.from_array(WEIGHTS, "W"),
            onnx.numpy_helper.from_array(BIAS, "B"),
        ],
    )


WIDTH = 32
CLASSIFIER_CONFIG = f"""
platform: "onnxruntime_onnx"
max_batch_size: 16
input [ {{ name: "X", data_type: TYPE_FP32, dims: [ {WIDTH} ] }} ]
output [ {{ name: "Y", data_type: TYPE_FP32, dims: [ 10 ] }} ]
"""


def classifier(seed: int = 0) -> Any:
    """Y = relu(X @ W1 + B1) @ W2 with X [N, WIDTH] and Y [N, 10]: a small classifier, large
    enough to quantise (the reduced-precision tests)."""
    rng = np.random.default_rng(seed)
    T = onnx.TensorProto
    w1 = (rng.standard_normal((WIDTH, 64)) / np.sqrt(WIDTH)).astype(np.float32)
    b1 = rng.standard_normal(64).astype(np.float32) * 0.1
    w2 = (rng.standard_normal((64, 10)) / 8).astype(np.float32)
    return make_model(
        [
            onnx.helper.make_node("MatMul", ["X", "W1"], ["H0"]),
            onnx.helper.make_node("Add", ["H0", "B1"], ["H1"]),
            onnx.helper.make_node("Relu", ["H1"], ["H"]),
            onnx.helper.make_node("MatMul", ["H", "W2"], ["Y"]),
        ],
        [tensor("X", T.FLOAT, ["N", WIDTH])],
        [tensor("Y", T.FLOAT, ["N", 10])],
        initializer=[
            onnx.numpy_helper.from_array(w1, "W1"),
            onnx.numpy_helper.from_array(b1, "B1"),
            onnx.numpy_helper.from_array(w2, "W2"),
        ],
    )


def add_sub_model() -> Any:
    """Triton's "simple" model: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 - INPUT1 (INT32)."""
    T = onnx.TensorProto
    return make_model(
        [
            onnx.helper.make_node("Add", ["INPUT0", "INPUT1"], ["OUTPUT0"]),
            onnx.helper.make_node("Sub", ["INPUT0", "INPUT1"], ["OUTPUT1"]),
        ],
        [tensor("INPUT0", T.INT32, ["N", 16]), tensor("INPUT1", T.INT32, ["N", 16])],
        [tensor("OUTPUT0", T.INT32, ["N", 16]), tensor("OUTPUT1", T.INT32, ["N", 16])],
    )


def identity_model(elem_type: int) -> Any:
    """INPUT0 -> Identity -> OUTPUT0 with shape [N, M] (strings, bfloat16, ...)."""
    return make_model(
        [onnx.helper.make_node("Identity", ["INPUT0"], ["OUTPUT0"])],
        [tensor("INPUT0", elem_type, ["N", "M"])],
        [tensor("OUTPUT0", elem_type, ["N", "M"])],
    )


def offset_model() -> Any:
    """Y = X + OFFSET, where OFFSET is a graph input with a default (an overridable initializer)."""
    T = onnx.TensorProto
    return make_model(
        [onnx.helper.make_node("Add", ["X", "OFFSET"], ["Y"])],
        [tensor("X", T.FLOAT, ["N", 2]), tensor("OFFSET", T.FLOAT, [2])],
        [tensor("Y", T.FLOAT, ["N", 2])],
        initializer=[onnx.numpy_helper.from_array(np.array([10, 20], np.float32), "OFFSET")],
    )


MLP_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "X", data_type: TYPE_FP32, dims: [ 4 ] } ]
output [ { name: "Y", data_type: TYPE_FP32, dims: [ 3 ] } ]
"""

ADD_SUB_CONFIG = """
platform: "onnxruntime_onnx"
max_batch_size: 8
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
        { name: "INPUT1", data_type: TYPE_INT32, dims: [ 16 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 16 ] },
         { name: "OUTPUT1", data_type: TYPE_INT32, dims: [ 16 ] } ]
"""


def identity_config(type_name: str) -> str:
    return (
        'backend: "onnxruntime"\nmax_batch_size: 8\n'
        f'input [ {{ name: "INPUT0", data_type: {type_name}, dims: [ -1 ] }} ]\n'
        f'output [ {{ name: "OUTPUT0", data_type: {type_name}, dims: [ -1 ] }} ]\n'
    )


def write_onnx_model(
    repo: Path, name: str, model: Any, config: str, filename: str = "model.onnx"
) -> Path:
    """``repo/name`` with ``config.pbtxt`` and version 1 holding the serialized ``model``."""
    model_dir = repo / name
    (model_dir / "1").mkdir(parents=True, exist_ok=True)
    (model_dir / "config.pbtxt").write_text(f'name: "{name}"\n{config}')
    if model is not None:
        (model_dir / "1" / filename).write_bytes(model.SerializeToString())
    return model_dir


def direct(model: Any, feed: dict[str, npt.NDArray[Any]]) -> list[npt.NDArray[Any]]:
    """What onnxruntime itself answers, with default session options."""
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return list(session.run(None, feed))
