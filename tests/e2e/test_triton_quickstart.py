"""A copy of Triton's quick-start repository (``docs/examples/model_repository`` in
triton-inference-server/server) served unchanged: the config.pbtxt files as Triton ships them,
tiny ONNX files built here where the platform is ONNX Runtime, and the other models' files left
out (no TensorFlow or custom backend here). The index over tritonclient HTTP and gRPC must show
the supported models READY and every other one UNAVAILABLE with a reason naming the field,
never a model that loads as if its unsupported block were absent."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.onnx_models import add_sub_model, make_model, onnx, tensor
from tests.support import ServerProcess, start_server

pytestmark = pytest.mark.e2e

# The configs as read from triton-inference-server/server (licence headers left out).
CONFIGS = {
    "densenet_onnx": """
name: "densenet_onnx"
platform: "onnxruntime_onnx"
max_batch_size : 1
input [
  {
    name: "data_0"
    data_type: TYPE_FP32
    format: FORMAT_NCHW
    dims: [ 3, 224, 224 ]
  }
]
output [
  {
    name: "fc6_1"
    data_type: TYPE_FP32
    dims: [ 1000 ]
    reshape { shape: [ 1000, 1, 1 ] }
    label_filename: "densenet_labels.txt"
  }
]""",
    "inception_graphdef": """
name: "inception_graphdef"
platform: "tensorflow_graphdef"
max_batch_size: 128
input [
  {
    name: "input"
    data_type: TYPE_FP32
    format: FORMAT_NHWC
    dims: [ 299, 299, 3 ]
  }
]
output [
  {
    name: "InceptionV3/Predictions/Softmax"
    data_type: TYPE_FP32
    dims: [ 1001 ]
    label_filename: "inception_labels.txt"
  }
]
""",
    "simple": """
name: "simple"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT32
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT32
    dims: [ 16 ]
  }
]
""",
    "simple_dyna_sequence": """
name: "simple_dyna_sequence"
platform: "custom"
max_batch_size: 8
default_model_filename: "libdyna_sequence.so"
sequence_batching {
    max_sequence_idle_microseconds: 10000000
    oldest {
      max_candidate_sequences: 1024
      max_queue_delay_microseconds: 10000
    }

  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "END"
      control [
        {
          kind: CONTROL_SEQUENCE_END
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "READY"
      control [
        {
          kind: CONTROL_SEQUENCE_READY
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "CORRID"
      control [
        {
          kind: CONTROL_SEQUENCE_CORRID
          data_type: TYPE_UINT64
        }
      ]
    }
  ]
}
input [
  {
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
output [
  {
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
parameters [
  {
    key: "execute_delay_ms"
    value: { string_value: "3" }
  }
]
instance_group [
  {
    count: 2
    kind: KIND_CPU
  }
]
""",
    "simple_identity": """
name: "simple_identity"
platform: "tensorflow_savedmodel"
max_batch_size: 8

input [
  {
    name: "INPUT0"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_STRING
    dims: [ -1 ]
  }
]
""",
    "simple_int8": """
name: "simple_int8"
platform: "onnxruntime_onnx"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_INT8
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_INT8
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_INT8
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_INT8
    dims: [ 16 ]
  }
]
""",
    "simple_sequence": """
name: "simple_sequence"
platform: "onnxruntime_onnx"
max_batch_size: 8
sequence_batching {
  control_input [
    {
      name: "START"
      control [
        {
          kind: CONTROL_SEQUENCE_START
          int32_false_true: [ 0, 1 ]
        }
      ]
    },
    {
      name: "READY"
      control [
        {
          kind: CONTROL_SEQUENCE_READY
          int32_false_true: [ 0, 1 ]
        }
      ]
    }
  ]
}
input [
  {
    name: "INPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
output [
  {
    name: "OUTPUT"
    data_type: TYPE_INT32
    dims: [ 1 ]
  }
]
instance_group [
  {
    kind: KIND_CPU
  }
]
""",
    "simple_string": """
name: "simple_string"
platform: "tensorflow_graphdef"
max_batch_size: 8
input [
  {
    name: "INPUT0"
    data_type: TYPE_STRING
    dims: [ 16 ]
  },
  {
    name: "INPUT1"
    data_type: TYPE_STRING
    dims: [ 16 ]
  }
]
output [
  {
    name: "OUTPUT0"
    data_type: TYPE_STRING
    dims: [ 16 ]
  },
  {
    name: "OUTPUT1"
    data_type: TYPE_STRING
    dims: [ 16 ]
  }
]
""",
}

READY = {"densenet_onnx", "simple", "simple_int8"}
UNAVAILABLE = {
    "inception_graphdef": "platform 'tensorflow_graphdef' is not supported",
    "simple_dyna_sequence": "sequence_batching is not supported yet",
    "simple_identity": "platform 'tensorflow_savedmodel' is not supported",
    "simple_sequence": "sequence_batching is not supported yet",
    "simple_string": "platform 'tensorflow_graphdef' is not supported",
}


def densenet_model() -> object:
    """data_0 [N, 3, 224, 224] -> global average pool -> 1x1 conv to 1000 channels: fc6_1 of
    shape [N, 1000, 1, 1], which the config's reshape shows as [N, 1000]."""
    T = onnx.TensorProto
    weights = np.random.default_rng(0).standard_normal((1000, 3, 1, 1)).astype(np.float32)
    return make_model(
        [
            onnx.helper.make_node("GlobalAveragePool", ["data_0"], ["pooled"]),
            onnx.helper.make_node("Conv", ["pooled", "W"], ["fc6_1"]),
        ],
        [tensor("data_0", T.FLOAT, ["N", 3, 224, 224])],
        [tensor("fc6_1", T.FLOAT, ["N", 1000, 1, 1])],
        initializer=[onnx.numpy_helper.from_array(weights, "W")],
    )


def int8_add_sub_model() -> object:
    model = add_sub_model()
    for value in [*model.graph.input, *model.graph.output]:
        value.type.tensor_type.elem_type = onnx.TensorProto.INT8
    return model


def sequence_model() -> object:
    """simple_sequence's tensors (INPUT -> OUTPUT, INT32 [N, 1]): a model that would load and
    answer if its sequence_batching block were ignored."""
    T = onnx.TensorProto
    return make_model(
        [onnx.helper.make_node("Identity", ["INPUT"], ["OUTPUT"])],
        [tensor("INPUT", T.INT32, ["N", 1])],
        [tensor("OUTPUT", T.INT32, ["N", 1])],
    )


def write_quickstart(repo: Path) -> None:
    for name, text in CONFIGS.items():
        (repo / name / "1").mkdir(parents=True)
        (repo / name / "config.pbtxt").write_text(text)
    (repo / "densenet_onnx" / "densenet_labels.txt").write_text(
        "".join(f"class_{i}\n" for i in range(1000))
    )
    (repo / "inception_graphdef" / "inception_labels.txt").write_text("a\nb\n")
    for name, model in (
        ("densenet_onnx", densenet_model()),
        ("simple", add_sub_model()),
        ("simple_int8", int8_add_sub_model()),
        ("simple_sequence", sequence_model()),
    ):
        onnx.save(model, str(repo / name / "1" / "model.onnx"))


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("model_repository")
    write_quickstart(repo)
    with start_server("--model-repository", str(repo), "--strict-readiness", "false") as server:
        yield server
        assert server.stop() == 0


def test_the_http_index_shows_states_and_reasons(quickstart: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(quickstart.url)
    index = {row["name"]: row for row in client.get_model_repository_index()}
    assert set(index) == set(CONFIGS)
    for name in READY:
        assert (index[name]["state"], index[name]["version"]) == ("READY", "1"), index[name]
    for name, reason in UNAVAILABLE.items():
        assert index[name]["state"] == "UNAVAILABLE", index[name]
        assert reason in index[name]["reason"], index[name]


def test_the_grpc_index_shows_states_and_reasons(quickstart: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(quickstart.grpc_url)
    index = {m.name: m for m in client.get_model_repository_index().models}
    assert set(index) == set(CONFIGS)
    for name in READY:
        assert index[name].state == "READY"
    for name, reason in UNAVAILABLE.items():
        assert index[name].state == "UNAVAILABLE"
        assert reason in index[name].reason
    assert not client.is_model_ready("simple_sequence")


def test_the_supported_models_answer(quickstart: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(quickstart.url)
    for name, dtype in (("simple", np.int32), ("simple_int8", np.int8)):
        a = np.arange(16, dtype=dtype).reshape(1, 16)
        b = np.ones((1, 16), dtype=dtype)
        datatype = "INT32" if dtype is np.int32 else "INT8"
        inputs = [httpclient.InferInput(n, [1, 16], datatype) for n in ("INPUT0", "INPUT1")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(b)
        result = client.infer(name, inputs)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + b)
        np.testing.assert_array_equal(result.as_numpy("OUTPUT1"), a - b)
    image = httpclient.InferInput("data_0", [1, 3, 224, 224], "FP32")
    image.set_data_from_numpy(np.ones((1, 3, 224, 224), np.float32))
    assert client.infer("densenet_onnx", [image]).as_numpy("fc6_1").shape == (1, 1000)


def test_the_load_failure_metric_counts_each_refused_model(quickstart: ServerProcess) -> None:
    text = httpx.get(quickstart.metrics_url, timeout=10).text
    for name in UNAVAILABLE:
        assert f'infermux_model_load_failures_total{{model="{name}"}} 1\n' in text
    for name in READY:
        assert f'infermux_model_load_failures_total{{model="{name}"}} 0\n' in text
