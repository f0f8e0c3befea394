"""Metrics of a real ``infermux serve`` with a PyTorch model on the GPU: the GPU gauges in the
shape perf_analyzer's ``--collect-metrics`` parses, the model's GPU memory by component, and the
instance's busy time, with one process and with several."""

from __future__ import annotations

import re
import urllib.request
from collections.abc import Iterator

import numpy as np
import pytest
import torch
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families

from tests.gpu.torch_models import WIDTH, Wide, rows, write
from tests.support import ServerProcess, start_server

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA"),
]

# perf_analyzer's pattern (client_backend/triton/triton_client_backend.cc): gpu_uuid the only label.
PERF_ANALYZER = r"\n{name}\{{gpu_uuid=\"([^\"]+)\"\}} (\d+(?:\.\d+)?(?:e[+-]?\d+)?)"


@pytest.fixture(scope="module", params=[1, 2])
def server(
    tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[ServerProcess]:
    model_dir = write(tmp_path_factory.mktemp("metrics"), Wide())
    with start_server(
        "--model-repository",
        str(model_dir.parent),
        "--frontends",
        str(request.param),
        "--ipc-arena-mb",
        "16",
    ) as server:
        yield server
        assert server.stop() == 0


def scrape(server: ServerProcess) -> str:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text: str = response.read().decode()
        return text


def test_gpu_metrics(server: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(server.url)
    for seed in range(20):
        x = rows(4, seed)
        tensor = httpclient.InferInput("INPUT__0", [4, WIDTH], "FP32").set_data_from_numpy(x)
        result = client.infer("m", [tensor])
        assert np.asarray(result.as_numpy("OUTPUT__0")).shape[0] == 4
    client.close()
    text = scrape(server)
    uuids: set[str] = set()
    for name in (
        "nv_gpu_utilization",
        "nv_gpu_memory_total_bytes",
        "nv_gpu_memory_used_bytes",
        "nv_gpu_power_usage",
    ):
        found = re.findall(PERF_ANALYZER.format(name=name), text)
        assert len(found) == torch.cuda.device_count(), name
        uuids.update(uuid for uuid, _ in found)
    assert all(u.startswith("GPU-") for u in uuids)
    series = {
        (s.name, frozenset(s.labels.items())): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    model = frozenset({("model", "m"), ("version", "1")})
    assert series[("nv_inference_request_success_total", model)] == 20
    assert series[("nv_inference_count_total", model)] == 80
    weights = model | {("kind", "GPU"), ("device", "0"), ("component", "weights")}
    assert series[("infermux_model_memory_bytes", weights)] >= 64 * 2**20  # Wide's 64 MiB
    busy = model | {("instance", "m_0_cuda0_0")}
    assert series[("infermux_instance_busy_seconds_total", busy)] > 0
    total = sum(v for (n, _), v in series.items() if n == "nv_gpu_memory_total_bytes")
    used = sum(v for (n, _), v in series.items() if n == "nv_gpu_memory_used_bytes")
    assert 0 < used < total
