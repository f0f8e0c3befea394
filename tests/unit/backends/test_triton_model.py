"""A Triton ``TritonPythonModel`` loaded by the Python backend: what it is given, what its
responses become."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendInstance, BackendRegistry, ModelContext, ModelRequest
from infermux.backends.pb_utils.custom_metrics import CUSTOM_METRICS
from infermux.backends.python import PythonBackend
from infermux.errors import ErrorCode, InfermuxError, InternalError, ModelLoadError
from infermux.repository import load_model_config
from tests.support import write_model

# Echoes INPUT0 and, as OUTPUT0 of a request whose INPUT0 is negative, an INVALID_ARG error.
# initialize keeps its args; finalize writes a file, so a test sees it ran.
ECHO = """
import json
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.args = args
        self.family = pb_utils.MetricFamily("t_adapter_calls", "calls", pb_utils.COUNTER)
        self.calls = self.family.Metric(labels={"instance": args["model_instance_name"]})

    def execute(self, requests):
        self.calls.increment(1)
        self.seen = requests
        responses = []
        for request in requests:
            x = pb_utils.get_input_tensor_by_name(request, "INPUT0")
            if x.as_numpy().min() < 0:
                error = pb_utils.TritonError("negative", pb_utils.TritonError.INVALID_ARG)
                responses.append(pb_utils.InferenceResponse([], error))
            else:
                out = pb_utils.Tensor("OUTPUT0", x.as_numpy())
                responses.append(pb_utils.InferenceResponse([out]))
        return responses

    def finalize(self):
        open(self.args["model_repository"] + "/finalized", "w").close()
"""


def load(tmp_path: Path, source: str, extra: str = "dynamic_batching { }") -> BackendInstance:
    model_dir = write_model(tmp_path, "m", source=source, extra=extra)
    config = load_model_config(model_dir)
    return PythonBackend().load(ModelContext(config, 1, model_dir, model_dir / "1", "m_0"))


def request(values: list[float], id: str = "") -> ModelRequest:
    array = np.array([values], dtype=np.float32)
    return ModelRequest({"INPUT0": array}, ("OUTPUT0",), {"k": "v"}, id)


def test_initialize_gets_tritons_args(tmp_path: Path) -> None:
    instance = load(tmp_path, ECHO)
    args = instance.model.args  # type: ignore[attr-defined]
    assert args["model_name"] == "m"
    assert args["model_version"] == "1"
    assert args["model_instance_kind"] == "CPU"
    assert args["model_instance_name"] == "m_0"
    assert args["model_instance_device_id"] == "0"
    assert args["model_repository"] == str(tmp_path / "m")
    config = json.loads(args["model_config"])
    assert config["input"][0]["data_type"] == "TYPE_FP32"
    assert config["input"][0]["dims"] == [-1]  # numbers, as Triton writes them
    assert config["max_batch_size"] == 8
    instance.close()


def test_one_request_each_and_an_error_for_one_alone(tmp_path: Path) -> None:
    instance = load(tmp_path, ECHO)
    good = request([1.0, 2.0], id="a")
    ok, failed = instance.execute([good, request([-1.0], id="b")])
    assert isinstance(ok, dict)
    assert ok["OUTPUT0"] is good.inputs["INPUT0"]  # no copy either way
    assert isinstance(failed, InfermuxError)
    assert failed.code is ErrorCode.INVALID_ARG
    assert failed.message == "negative"
    given = instance.model.seen  # type: ignore[attr-defined]
    assert [r.request_id() for r in given] == ["a", "b"]
    assert json.loads(given[0].parameters()) == {"k": "v"}
    assert given[0].requested_output_names() == ["OUTPUT0"]
    instance.close()


def test_finalize_runs_and_metrics_leave_on_close(tmp_path: Path) -> None:
    instance = load(tmp_path, ECHO)
    instance.execute([request([1.0])])
    assert any(f.name == "t_adapter_calls" for f in CUSTOM_METRICS.collect())
    instance.close()
    assert (tmp_path / "m" / "finalized").exists()
    assert not any(f.name == "t_adapter_calls" for f in CUSTOM_METRICS.collect())


def test_async_execute_runs_to_its_end(tmp_path: Path) -> None:
    source = ECHO.replace(
        "    def execute(self, requests):", "    async def execute(self, requests):"
    )
    instance = load(tmp_path, source)
    (result,) = instance.execute([request([3.0])])
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["OUTPUT0"], [[3.0]])
    instance.close()


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("return []", "one InferenceResponse per request"),
        ("return [None]", "returned NoneType for request 0"),
        ("return [pb_utils.InferenceResponse([np.ones(1)])]", "not a pb_utils.Tensor"),
    ],
)
def test_wrong_responses_are_said(tmp_path: Path, body: str, message: str) -> None:
    source = (
        "import numpy as np\nimport triton_python_backend_utils as pb_utils\n"
        "class TritonPythonModel:\n"
        f"    def execute(self, requests):\n        {body}\n"
    )
    instance = load(tmp_path, source)
    try:
        (result,) = instance.execute([request([1.0])])
    except InternalError as exc:
        result = exc
    assert isinstance(result, InternalError)
    assert message in result.message
    instance.close()


def test_an_exception_from_execute_fails_the_batch(tmp_path: Path) -> None:
    source = (
        "import triton_python_backend_utils as pb_utils\nclass TritonPythonModel:\n"
        "    def execute(self, requests):\n        raise pb_utils.TritonModelException('boom')\n"
    )
    instance = load(tmp_path, source)
    with pytest.raises(Exception, match="boom"):
        instance.execute([request([1.0])])
    instance.close()


@pytest.mark.parametrize(
    ("source", "extra", "message"),
    [
        (
            "class TritonPythonModel:\n    def initialize(self, args): raise ValueError('no')\n"
            "    def execute(self, r): return []\n",
            "",
            "TritonPythonModel.initialize failed: ValueError: no",
        ),
        ("class TritonPythonModel:\n    pass\n", "", "has no execute(requests) method"),
    ],
)
def test_load_errors_are_clear(tmp_path: Path, source: str, extra: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        load(tmp_path, source, extra)


AUTO = """
class TritonPythonModel:
    @staticmethod
    def auto_complete_config(config):
        config.add_input({"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [2]})
        config.add_output({"name": "EXTRA", "data_type": "TYPE_FP32", "dims": [2]})
        config.set_max_batch_size(4)
        return config

    def execute(self, requests):
        return []
"""


def test_auto_complete_config_fills_in_before_validation(tmp_path: Path) -> None:
    model_dir = tmp_path / "m"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text('backend: "python"\n')
    (model_dir / "1" / "model.py").write_text(AUTO.replace("INT32", "FP32"))
    (model_dir / "2").mkdir()  # the highest version's model.py is the one asked
    (model_dir / "2" / "model.py").write_text(AUTO)
    config = load_model_config(model_dir, complete=BackendRegistry().complete_config)
    assert [(t.name, t.datatype, t.dims) for t in config.inputs] == [("INPUT0", "INT32", (2,))]
    assert [t.name for t in config.outputs] == ["EXTRA"]
    assert config.max_batch_size == 4


def test_auto_complete_config_conflicts_fail_the_load(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "m", source=AUTO)  # INPUT0 is FP32 [-1] there
    with pytest.raises(ModelLoadError, match=r"auto_complete_config failed: .*data_type"):
        load_model_config(model_dir, complete=BackendRegistry().complete_config)
