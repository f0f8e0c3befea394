"""Triton's model repository extension as its clients use it: load errors that say ``failed to
load``, and a model loaded from override files (``file:<version>/<name>``) over HTTP and gRPC, in
one process and with several front-end processes."""

from __future__ import annotations

import json
import tempfile
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.onnx_models import add_sub_model
from tests.support import ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e

CONFIG = json.dumps(
    {
        "backend": "onnxruntime",
        "max_batch_size": 8,
        "input": [
            {"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
            {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]},
        ],
        "output": [
            {"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
            {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]},
        ],
    }
)
MODEL = add_sub_model().SerializeToString()


def overrides_left() -> set[Path]:
    return set(Path(tempfile.gettempdir()).glob("infermux-override-*"))


@pytest.fixture(scope="module", params=["1", "2"], ids=["one-process", "frontends-2"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    repo = tmp_path_factory.mktemp("repo")
    write_model(repo, "ident")
    args = ["--model-repository", str(repo), "--model-control-mode", "explicit"]
    with start_server(*args, "--load-model", "ident", "--frontends", request.param) as server:
        yield server
        assert server.stop() == 0


def add_sub(client: object, module: object, name: str) -> None:
    a = np.arange(16, dtype=np.int32).reshape(1, 16)
    inputs = [module.InferInput(n, [1, 16], "INT32") for n in ("INPUT0", "INPUT1")]  # type: ignore[attr-defined]
    inputs[0].set_data_from_numpy(a)
    inputs[1].set_data_from_numpy(a)
    result = client.infer(name, inputs)  # type: ignore[attr-defined]
    np.testing.assert_array_equal(result.as_numpy("OUTPUT0"), a + a)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_malformed_config_fails_to_load(server: ServerProcess, module: object) -> None:
    url = server.url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    with pytest.raises(InferenceServerException, match="failed to load 'ident'") as caught:
        client.load_model("ident", config="{not json")
    assert "config" in str(caught.value)
    with pytest.raises(
        InferenceServerException,
        match=r"failed to load 'ident'.*sequence_batching is not supported yet",
    ):
        client.load_model("ident", config='{"backend": "python", "sequence_batching": {}}')
    assert client.is_model_ready("ident")  # the served model never noticed


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_a_model_loads_from_override_files(server: ServerProcess, module: object) -> None:
    url = server.url if module is httpclient else server.grpc_url
    client = module.InferenceServerClient(url)  # type: ignore[attr-defined]
    name = f"override_{module.__name__.rsplit('.', 1)[-1]}"  # type: ignore[attr-defined]
    client.load_model(name, config=CONFIG, files={"file:1/model.onnx": MODEL})
    assert client.is_model_ready(name, "1")
    add_sub(client, module, name)
    client.unload_model(name)
    assert not client.is_model_ready(name)


@pytest.mark.parametrize(
    "path", ["../escape.onnx", "/tmp/escape.onnx", "1/" + "x" * 256, "1/../../escape.onnx"]
)
def test_an_override_path_leaving_the_directory_is_refused(
    server: ServerProcess, path: str
) -> None:
    before = overrides_left()
    for client in (
        httpclient.InferenceServerClient(server.url),
        grpcclient.InferenceServerClient(server.grpc_url),
    ):
        with pytest.raises(InferenceServerException, match="failed to load") as caught:
            client.load_model(
                "evil", config=CONFIG, files={"file:1/model.onnx": MODEL, f"file:{path}": b"x"}
            )
        assert f"file:{path[:30]}" in str(caught.value)
        assert caught.value.status() in ("400", "StatusCode.INVALID_ARGUMENT")
    assert not (Path(tempfile.gettempdir()) / "escape.onnx").exists()
    assert overrides_left() == before
    http = httpclient.InferenceServerClient(server.url)
    assert http.is_server_live()
    assert http.is_model_ready("ident")


def test_override_files_need_a_config(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    with pytest.raises(InferenceServerException, match=r"failed to load 'ident'.*'config'"):
        client.load_model("ident", files={"file:1/model.onnx": MODEL})
    assert client.is_model_ready("ident")
