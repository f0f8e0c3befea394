"""A load request cannot make the server open a file outside the model's directory.

Explicit mode lets a client send the model config with a load (``config`` override); a config
naming ``/tmp/.../evil.py`` or ``../../evil.py`` as a Python model's ``default_model_filename``
used to import and run that file. Now the load is refused (HTTP 400 / INVALID_ARGUMENT) naming
the field, the file is never imported (it would leave a marker) and the server keeps serving.
A load that fails for any other reason of the model's is 400 too, as Triton answers it.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e

# What an attacker would plant: a model file that proves it ran by writing a marker.
EVIL = """
from pathlib import Path

Path(__file__).with_name("ran").write_text("imported")


class Model:
    def execute(self, requests):
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""


@pytest.fixture(scope="module")
def layout(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("paths")
    write_model(root / "repo", "ok_model")
    write_model(root / "repo", "raises", source="raise RuntimeError('broken on purpose')\n")
    (root / "evil").mkdir()
    (root / "evil" / "evil.py").write_text(EVIL)
    return root


@pytest.fixture(scope="module")
def server(layout: Path) -> Iterator[ServerProcess]:
    args = ["--model-repository", str(layout / "repo"), "--model-control-mode", "explicit"]
    with start_server(*args, "--load-model", "ok_model") as process:
        yield process
        assert process.stop() == 0


def evil_config(filename: str) -> str:
    return json.dumps(
        {
            "name": "ok_model",
            "backend": "python",
            "max_batch_size": 8,
            "default_model_filename": filename,
            "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
        }
    )


def escapes(layout: Path) -> list[str]:
    # The repository is <root>/repo, the version directory <root>/repo/ok_model/1.
    return [str(layout / "evil" / "evil.py"), "../../../evil/evil.py"]


def still_serving(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    data = np.arange(3, dtype=np.float32).reshape(1, 3)
    infer_input = httpclient.InferInput("INPUT0", [1, 3], "FP32")
    infer_input.set_data_from_numpy(data)
    result = client.infer("ok_model", [infer_input])
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), data)
    assert client.is_server_live()
    client.close()


def test_http_load_with_an_escaping_model_file_is_refused(
    server: ServerProcess, layout: Path
) -> None:
    url = f"http://{server.url}/v2/repository/models/ok_model/load"
    for filename in escapes(layout):
        body: dict[str, Any] = {"parameters": {"config": evil_config(filename)}}
        reply = httpx.post(url, json=body, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert error.startswith("failed to load 'ok_model'"), error
        assert f"default_model_filename '{filename}' resolves outside the model directory" in error
        assert not (layout / "evil" / "ran").exists()
        still_serving(server)


def test_grpc_load_with_an_escaping_model_file_is_refused(
    server: ServerProcess, layout: Path
) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    for filename in escapes(layout):
        with pytest.raises(InferenceServerException) as info:
            client.load_model("ok_model", config=evil_config(filename))
        assert info.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
        assert "failed to load 'ok_model'" in info.value.message()
        assert f"default_model_filename '{filename}' resolves outside" in info.value.message()
        assert not (layout / "evil" / "ran").exists()
        assert client.is_model_ready("ok_model")
    client.close()
    still_serving(server)


def test_a_load_that_fails_is_400_saying_failed_to_load(server: ServerProcess) -> None:
    reply = httpx.post(f"http://{server.url}/v2/repository/models/raises/load", timeout=60)
    assert reply.status_code == 400, reply.text
    error = reply.json()["error"]
    assert error.startswith("failed to load 'raises'")
    assert "RuntimeError: broken on purpose" in error
    bad = httpx.post(
        f"http://{server.url}/v2/repository/models/ok_model/load",
        json={"parameters": {"config": '{"name": "ok_model", "max_batch_size": "x"'}},
        timeout=60,
    )
    assert bad.status_code == 400, bad.text
    assert bad.json()["error"].startswith("failed to load 'ok_model'")
    client = grpcclient.InferenceServerClient(server.grpc_url)
    with pytest.raises(InferenceServerException, match="failed to load 'raises'") as info:
        client.load_model("raises")
    assert info.value.status() == str(grpc.StatusCode.INVALID_ARGUMENT)
    client.close()
    still_serving(server)


def config_naming(field: str, path: str) -> str:
    """ok_model's config with one more file-valued field set to ``path``."""
    config: dict[str, Any] = json.loads(evil_config("model.py"))
    if field == "label_filename":
        config["output"][0]["label_filename"] = path
    elif field == "calibration_data":
        config["parameters"] = {"calibration_data": {"string_value": path}}
    else:
        config["model_warmup"] = [
            {
                "name": "w",
                "batch_size": 1,
                "inputs": {
                    "INPUT0": {"data_type": "TYPE_FP32", "dims": [3], "input_data_file": path}
                },
            }
        ]
    return json.dumps(config)


@pytest.mark.parametrize(
    ("field", "named"),
    [
        ("label_filename", "output 'OUTPUT0' label_filename"),
        ("calibration_data", "calibration_data"),
        ("input_data_file", "warm-up sample 'w' input 'INPUT0': input_data_file"),
    ],
)
def test_every_file_a_config_names_must_be_inside_the_model_directory(
    server: ServerProcess, layout: Path, field: str, named: str
) -> None:
    """Not only the model file: every path a config builds (labels, calibration data, warm-up
    inputs) is held to the model directory, over the same load request."""
    url = f"http://{server.url}/v2/repository/models/ok_model/load"
    for path in [str(layout / "evil" / "evil.py"), "../../evil/evil.py"]:
        body: dict[str, Any] = {"parameters": {"config": config_naming(field, path)}}
        reply = httpx.post(url, json=body, timeout=60)
        assert reply.status_code == 400, reply.text
        error = reply.json()["error"]
        assert f"{named} '{path}' resolves outside the model directory" in error, error
    still_serving(server)
