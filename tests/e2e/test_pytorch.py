"""PyTorch models (TorchScript, torch.export) served by the real server, driven by tritonclient."""

from __future__ import annotations

import os
import queue
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest
import torch
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from tests.support import ServerProcess, start_server

pytestmark = pytest.mark.e2e

CONFIG = """
name: "{name}"
platform: "{platform}"
max_batch_size: 8
input [ {{ name: "INPUT__0", data_type: TYPE_FP32, dims: [ 4 ] }} ]
output [ {{ name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 3 ] }} ]
dynamic_batching {{ max_queue_delay_microseconds: 2000 }}
"""


class Linear(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.linear(x))


MODULE = Linear().eval()


def expected(x: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    with torch.inference_mode():
        result: npt.NDArray[np.float32] = MODULE(torch.from_numpy(x.copy())).numpy()
    return result


def write(repo: Path, name: str, platform: str, content: bytes | None = None) -> Path:
    version = repo / name / "1"
    version.mkdir(parents=True)
    (repo / name / "config.pbtxt").write_text(CONFIG.format(name=name, platform=platform))
    if platform == "torch_export":
        path = version / "model.pt2"
        batch = torch.export.Dim("batch", min=1, max=8)
        program = torch.export.export(
            MODULE, (torch.zeros(2, 4),), dynamic_shapes={"x": {0: batch}}
        )
        torch.export.save(program, str(path))
        return path
    path = version / "model.pt"
    if content is not None:
        path.write_bytes(content)
        return path
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # TorchScript is deprecated upstream
        scripted: torch.jit.ScriptModule = torch.jit.script(MODULE)
        scripted.save(str(path))
    return path


@pytest.fixture(scope="module")
def repo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("torch_repo")
    write(repo, "linear", "pytorch_libtorch")
    write(repo, "exported", "torch_export")
    write(repo, "corrupt", "pytorch_libtorch", os.urandom(4096))
    return repo


@pytest.fixture(scope="module")
def server(repo: Path) -> Iterator[ServerProcess]:
    with start_server("--model-repository", str(repo)) as server:
        yield server
        assert server.stop() == 0


def rows(n: int, seed: int) -> npt.NDArray[np.float32]:
    return np.random.default_rng(seed).standard_normal((n, 4)).astype(np.float32)


@pytest.mark.parametrize("model", ["linear", "exported"])
def test_http_answers_match_torch(server: ServerProcess, model: str) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for n, binary in ((1, True), (5, True), (3, False)):
        x = rows(n, n)
        infer_input = httpclient.InferInput("INPUT__0", [n, 4], "FP32")
        infer_input.set_data_from_numpy(x, binary_data=binary)
        result = client.infer(model, [infer_input])
        np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected(x), rtol=1e-5, atol=1e-6)
    assert client.get_model_metadata(model)["platform"] in ("pytorch_libtorch", "torch_export")
    client.close()


def test_grpc_answers_match_torch(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)
    x = rows(4, 7)
    infer_input = grpcclient.InferInput("INPUT__0", [4, 4], "FP32")
    infer_input.set_data_from_numpy(x)
    result = client.infer("linear", [infer_input])
    np.testing.assert_allclose(result.as_numpy("OUTPUT__0"), expected(x), rtol=1e-5, atol=1e-6)
    client.close()


def test_sixteen_concurrent_requests_are_batched(server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(server.grpc_url)

    def executions() -> tuple[int, int]:
        stats = client.get_inference_statistics("linear", as_json=True)["model_stats"][0]
        return int(stats.get("inference_count", 0)), int(stats.get("execution_count", 0))

    inferences_before, executions_before = executions()
    answers: queue.Queue[tuple[int, Any, Any]] = queue.Queue()
    xs = [rows(1 + i % 2, 100 + i) for i in range(16)]
    for i, x in enumerate(xs):
        infer_input = grpcclient.InferInput("INPUT__0", list(x.shape), "FP32")
        infer_input.set_data_from_numpy(x)
        client.async_infer(
            "linear",
            [infer_input],
            callback=lambda result, error, i=i: answers.put((i, result, error)),
        )
    for _ in xs:
        i, result, error = answers.get(timeout=30)
        assert error is None, error
        np.testing.assert_allclose(
            result.as_numpy("OUTPUT__0"), expected(xs[i]), rtol=1e-5, atol=1e-6
        )
    inferences, batches = executions()
    assert inferences - inferences_before == sum(len(x) for x in xs)
    assert batches - executions_before < 16  # some requests shared a forward pass
    client.close()


def test_a_corrupt_model_fails_alone_with_a_clear_reason(server: ServerProcess, repo: Path) -> None:
    client = httpclient.InferenceServerClient(server.url)
    index = {entry["name"]: entry for entry in client.get_model_repository_index()}
    assert index["linear"]["state"] == "READY"
    assert index["exported"]["state"] == "READY"
    corrupt = index["corrupt"]
    assert corrupt["state"] == "UNAVAILABLE"
    assert f"cannot load {repo / 'corrupt' / '1' / 'model.pt'}: " in corrupt["reason"]
    assert "Traceback" not in corrupt["reason"]
    assert not client.is_model_ready("corrupt")
    assert client.is_model_ready("linear")
    client.close()


def test_statistics_report_the_weights_in_memory_usage(server: ServerProcess) -> None:
    weights = (4 * 3 + 3) * 4  # Linear(4, 3) in fp32, one instance on the CPU
    http = httpclient.InferenceServerClient(server.url)
    (stats,) = http.get_inference_statistics("linear")["model_stats"]
    assert stats["memory_usage"] == [{"type": "CPU", "id": 0, "byte_size": weights}]
    http.close()
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    (message,) = grpc.get_inference_statistics("linear").model_stats
    assert [(m.type, m.id, m.byte_size) for m in message.memory_usage] == [("CPU", 0, weights)]
    grpc.close()
