"""Triton's classification extension, black-box with tritonclient's ``class_count``: the top
classes of an output with the labels of its ``label_filename``, over HTTP (JSON and binary) and
gRPC, with one process and with several."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import start_server, write_classifier, write_model

pytestmark = pytest.mark.e2e

SCORES = np.array([[0.1, 0.6, 0.3], [0.2, 0.0, 0.8]], np.float32)
TOP_2 = [
    ["0.600000:1:dog", "0.300000:2:eel"],
    ["0.800000:2:eel", "0.200000:0:cat"],
]


def texts(array: np.ndarray | None) -> list[list[str]]:
    # Binary BYTES come back as bytes, JSON ones as str.
    assert array is not None
    return [[v.decode() if isinstance(v, bytes) else v for v in row] for row in array.tolist()]


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("classification")
    write_classifier(repo, "animals", ["cat", "dog", "eel"])
    write_model(repo, "text", datatype="BYTES")
    return repo


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_class_count_over_http_and_grpc(repository: Path, frontends: str) -> None:
    with start_server("--model-repository", str(repository), "--frontends", frontends) as server:
        http = httpclient.InferenceServerClient(server.url)
        for binary in (True, False):
            tensor = httpclient.InferInput("INPUT0", [2, 3], "FP32")
            tensor.set_data_from_numpy(SCORES, binary_data=binary)
            wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary, class_count=2)
            result = http.infer("animals", [tensor], outputs=[wanted])
            assert texts(result.as_numpy("OUTPUT0")) == TOP_2
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        tensor = grpcclient.InferInput("INPUT0", [2, 3], "FP32")
        tensor.set_data_from_numpy(SCORES)
        wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=2)
        result = grpc.infer("animals", [tensor], outputs=[wanted])
        assert texts(result.as_numpy("OUTPUT0")) == TOP_2
        # More classes asked for than there are: all of them.
        wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=10)
        result = grpc.infer("animals", [tensor], outputs=[wanted])
        assert result.as_numpy("OUTPUT0").shape == (2, 3)

        text = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
        text.set_data_from_numpy(np.array([[b"x"]], dtype=np.object_))
        wanted = grpcclient.InferRequestedOutput("OUTPUT0", class_count=1)
        with pytest.raises(InferenceServerException, match="unsupported type 'BYTES'") as e:
            grpc.infer("text", [text], outputs=[wanted])
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        http.close()
        grpc.close()
        assert server.stop() == 0
