from __future__ import annotations

import numpy as np
import pytest
from google.protobuf import text_format

from infermux.backends import ModelRequest
from infermux.backends.outputs import to_output_tensors
from infermux.errors import InternalError, InvalidArgumentError
from infermux.model_config import ModelConfig, pb

# Outputs only: Y (INT32 [2]) and S (BYTES [1]) of a batching model.
CONFIG = ModelConfig.from_proto(
    text_format.Parse(
        """
        name: "m" max_batch_size: 4
        input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } ]
        output [ { name: "Y" data_type: TYPE_INT32 dims: [ 2 ] },
                 { name: "S" data_type: TYPE_STRING dims: [ 1 ] } ]
        """,
        pb.ModelConfig(),
    )
)


def model_request(rows: int = 1, outputs: tuple[str, ...] = ("Y", "S")) -> ModelRequest:
    return ModelRequest({"A": np.zeros((rows, 2), np.int32)}, outputs)


def test_outputs_are_cast_and_bytes_normalised() -> None:
    out = to_output_tensors(
        CONFIG,
        model_request(),
        {"Y": np.array([[1, 2]], np.int64), "S": [["héllo"]]},
    )
    assert out[0].data.dtype == np.int32
    assert out[1].data[0, 0] == "héllo".encode()
    assert out[1].datatype == "BYTES"


@pytest.mark.parametrize(
    ("result", "message"),
    [
        ({"Y": np.zeros((1, 2), np.int32)}, "did not return output 'S'"),
        ({"Y": np.zeros((1, 2), np.float32), "S": [[b"x"]]}, "cannot become INT32"),
        ({"Y": np.zeros((1, 3), np.int32), "S": [[b"x"]]}, r"shape \[1, 3\], expected \[1, 2\]"),
        ("nonsense", "returned str"),
        (RuntimeError("bad"), "failed the request: RuntimeError: bad"),
    ],
)
def test_bad_outputs_are_internal_errors(result: object, message: str) -> None:
    with pytest.raises(InternalError, match=message):
        to_output_tensors(CONFIG, model_request(), result)  # type: ignore[arg-type]


def test_model_chosen_error_code_is_kept() -> None:
    with pytest.raises(InvalidArgumentError, match="mine"):
        to_output_tensors(CONFIG, model_request(), InvalidArgumentError("mine"))


def test_an_output_with_reshape_reaches_the_client_in_its_dims() -> None:
    # Triton's densenet_onnx: the model returns [N, 1000, 1, 1], the client sees [N, 1000].
    config = ModelConfig.from_proto(
        text_format.Parse(
            """
            name: "m" max_batch_size: 2
            input [ { name: "A" data_type: TYPE_INT32 dims: [ 2 ] } ]
            output [ { name: "Y" data_type: TYPE_FP32 dims: [ 4 ] reshape { shape: [ 4, 1, 1 ] } },
                     { name: "V" data_type: TYPE_FP32 dims: [ -1 ] reshape { shape: [ -1, 1 ] } } ]
            """,
            pb.ModelConfig(),
        )
    )
    request = ModelRequest({"A": np.zeros((2, 2), np.int32)}, ("Y", "V"))
    y, v = to_output_tensors(
        config, request, {"Y": np.ones((2, 4, 1, 1), np.float32), "V": np.ones((2, 3, 1))}
    )
    assert (y.shape, y.data.shape) == ((2, 4), (2, 4))
    assert (v.shape, v.data.shape) == ((2, 3), (2, 3))
