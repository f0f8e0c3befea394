from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import BackendRegistry, ModelContext, ModelRequest
from infermux.backends.python import PythonBackend
from infermux.errors import InternalError, ModelLoadError
from infermux.repository import load_model_config
from tests.support import IDENTITY_MODEL, write_model


def context_for(model_dir: Path) -> ModelContext:
    config = load_model_config(model_dir)
    return ModelContext(config, 1, model_dir, model_dir / "1", "m_0")


def load(tmp_path: Path, source: str) -> object:
    return PythonBackend().load(context_for(write_model(tmp_path, "m", source=source)))


def test_loads_and_executes(tmp_path: Path) -> None:
    instance = PythonBackend().load(context_for(write_model(tmp_path, "m")))
    request = ModelRequest({"INPUT0": np.ones((1, 2), np.float32)}, ("OUTPUT0",))
    (result,) = instance.execute([request])
    assert isinstance(result, dict)
    np.testing.assert_array_equal(result["OUTPUT0"], np.ones((1, 2)))
    instance.close()


def test_helper_modules_beside_model_py_can_be_imported(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "m", source="from helper import Model\n")
    (model_dir / "1" / "helper.py").write_text(IDENTITY_MODEL)
    PythonBackend().load(context_for(model_dir)).close()


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("x = 1\n", "must define a class named 'Model'"),
        ("class Model:\n    pass\n", "has no execute(requests) method"),
        ("raise ValueError('nope')\n", "import failed: ValueError: nope"),
        (
            "class Model:\n    def initialize(self, c): raise RuntimeError('no gpu')\n"
            "    def execute(self, r): return r\n",
            "Model.initialize failed: RuntimeError: no gpu",
        ),
    ],
)
def test_load_errors_are_clear(tmp_path: Path, source: str, message: str) -> None:
    with pytest.raises(ModelLoadError, match=re.escape(message)):
        load(tmp_path, source)


def test_missing_model_file(tmp_path: Path) -> None:
    model_dir = write_model(tmp_path, "m")
    (model_dir / "1" / "model.py").unlink()
    with pytest.raises(ModelLoadError, match=r"model\.py not found"):
        PythonBackend().load(context_for(model_dir))


def test_wrong_result_count_is_an_internal_error(tmp_path: Path) -> None:
    source = "class Model:\n    def execute(self, requests):\n        return []\n"
    instance = PythonBackend().load(context_for(write_model(tmp_path, "m", source=source)))
    with pytest.raises(InternalError, match="one result per request"):
        instance.execute([ModelRequest({}, ())])


def test_finalize_is_called(tmp_path: Path) -> None:
    marker = tmp_path / "finalized"
    source = (
        "class Model:\n    def execute(self, requests):\n        return []\n"
        f"    def finalize(self):\n        open({str(marker)!r}, 'w').close()\n"
    )
    PythonBackend().load(context_for(write_model(tmp_path, "m", source=source))).close()
    assert marker.exists()


def test_registry_resolves_and_explains(tmp_path: Path) -> None:
    registry = BackendRegistry()
    assert "python" in registry.names
    model_dir = write_model(tmp_path, "m")
    assert registry.get(load_model_config(model_dir)).name == "python"
    torch_dir = tmp_path / "t"
    torch_dir.mkdir()
    (torch_dir / "config.pbtxt").write_text('name: "t"\nplatform: "tensorflow_savedmodel"\n')
    with pytest.raises(ModelLoadError, match=r"no backend 'tensorflow_savedmodel'.*python"):
        registry.get(load_model_config(torch_dir))
    (torch_dir / "config.pbtxt").write_text('name: "t"\n')
    with pytest.raises(ModelLoadError, match="neither 'backend' nor 'platform'"):
        registry.get(load_model_config(torch_dir))
