from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from infermux.dataplane.inputs import to_model_request
from infermux.errors import InvalidArgumentError
from infermux.model_config import ModelConfig, pb
from infermux.types import InferRequest, RequestedOutput, Tensor

CONFIG = ModelConfig.from_proto(
    text_format.Parse(
        """
        name: "m" max_batch_size: 4
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] },
                { name: "B" data_type: TYPE_FP32 dims: [ -1 ] optional: true },
                { name: "R" data_type: TYPE_FP32 dims: [ 4 ] reshape: { shape: [ 2, 2 ] }
                  optional: true } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] },
                 { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        pb.ModelConfig(),
    )
)


def tensor(name: str, datatype: str, data: np.typing.ArrayLike) -> Tensor:
    array = np.asarray(data)
    return Tensor(name, datatype, tuple(array.shape), array)


def request(*inputs: Tensor, outputs: tuple[str, ...] = ()) -> InferRequest:
    return InferRequest("m", "", list(inputs), [RequestedOutput(o) for o in outputs])


def test_valid_request_with_reshape_and_default_outputs() -> None:
    model_request = to_model_request(
        CONFIG,
        request(
            tensor("A", "INT32", np.zeros((3, 2), np.int32)),
            tensor("R", "FP32", np.zeros((3, 4), np.float32)),
        ),
    )
    assert model_request.inputs["R"].shape == (3, 2, 2)
    assert model_request.requested_outputs == ("Y", "S")
    assert model_request.batch_size == 3


@pytest.mark.parametrize(
    ("inputs", "outputs", "message"),
    [
        (
            [tensor("A", "INT32", np.zeros((1, 3), np.int32))],
            (),
            r"got \[1, 3\], expected \[-1, 2\]",
        ),
        ([tensor("A", "INT32", np.zeros((2,), np.int32))], (), "unexpected shape for input 'A'"),
        ([tensor("A", "INT32", np.zeros((5, 2), np.int32))], (), "batch-size must be <= 4"),
        ([tensor("A", "INT32", np.zeros((0, 2), np.int32))], (), "batch size 0"),
        (
            [
                tensor("A", "INT32", np.zeros((1, 2), np.int32)),
                tensor("B", "FP32", np.zeros((2, 2), np.float32)),
            ],
            (),
            "input 'B' has batch size 2",
        ),
        ([tensor("B", "FP32", np.zeros((1, 2), np.float32))], (), "missing: A"),
        ([tensor("A", "INT32", np.zeros((1, 2), np.int32))], ("Y", "Y"), "more than once"),
    ],
)
def test_invalid_requests(inputs: list[Tensor], outputs: tuple[str, ...], message: str) -> None:
    with pytest.raises(InvalidArgumentError, match=message):
        to_model_request(CONFIG, request(*inputs, outputs=outputs))
