"""The metrics endpoint in process: exact counts and label sets after known traffic, parsed
with prometheus-client's own parser (what a Prometheus server reads)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from prometheus_client.parser import text_string_to_metric_families

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.errors import InfermuxError
from infermux.frontends.http import HttpApp
from infermux.frontends.metrics import MetricsApp
from infermux.observability import metrics
from infermux.repository import ControlMode, ModelRepository
from infermux.runtime.nvml import GpuReading, Nvml
from infermux.types import InferRequest, Tensor
from tests.support import PICKY_MODEL, SLOW_MODEL, write_model

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]


class Server:
    def __init__(self, http: httpx.AsyncClient, scrape: httpx.AsyncClient, plane: DataPlane):
        self.http, self.scrape_client, self.plane = http, scrape, plane

    async def infer(self, model: str, values: list[float]) -> httpx.Response:
        body = {
            "inputs": [
                {"name": "INPUT0", "datatype": "FP32", "shape": [1, len(values)], "data": values}
            ]
        }
        return await self.http.post(f"/v2/models/{model}/infer", json=body)

    async def scrape(self) -> tuple[dict[str, str], Series]:
        """Family name -> type, and (sample name, labels) -> value."""
        response = await self.scrape_client.get("/metrics")
        assert response.status_code == 200
        assert response.headers["content-type"] == metrics.CONTENT_TYPE
        types: dict[str, str] = {}
        series: Series = {}
        for family in text_string_to_metric_families(response.text):
            types[family.name] = family.type
            for sample in family.samples:
                series[(sample.name, frozenset(sample.labels.items()))] = sample.value
        return types, series


def labels(**values: str) -> frozenset[tuple[str, str]]:
    return frozenset(values.items())


@pytest.fixture
async def server(tmp_path: Path) -> AsyncIterator[Server]:
    write_model(tmp_path, "picky", source=PICKY_MODEL)
    write_model(
        tmp_path,
        "slow",
        source=SLOW_MODEL,
        extra="dynamic_batching { default_queue_policy { max_queue_size: 1 } }",
    )
    repository = ModelRepository(
        [tmp_path],
        BackendRegistry(),
        control_mode=ControlMode.EXPLICIT,
        startup_models=["*"],
        histograms=True,
    )
    await repository.start()
    plane = DataPlane(repository, version="test")
    registry = metrics.registry(repository, gpu=False)
    http = httpx.AsyncClient(transport=httpx.ASGITransport(app=HttpApp(plane)), base_url="http://t")
    scrape = httpx.AsyncClient(
        transport=httpx.ASGITransport(app=MetricsApp(registry)), base_url="http://m"
    )
    async with http, scrape:
        yield Server(http, scrape, plane)
    await repository.close()


async def test_counts_and_label_sets_after_known_traffic(server: Server) -> None:
    for _ in range(3):
        assert (await server.infer("picky", [1.0, 2.0])).status_code == 200
    assert (await server.infer("picky", [-1.0])).status_code == 400  # the model refused it
    assert (await server.infer("picky", [13.0])).status_code == 500  # the model raised
    bad = {"inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    assert (await server.http.post("/v2/models/picky/infer", json=bad)).status_code == 400

    types, series = await server.scrape()
    picky = labels(model="picky", version="1")
    assert types["nv_inference_request_success"] == "counter"
    # The parser files a counter's samples under <name>_total whatever the exposition said.
    assert series[("nv_inference_request_success_total", picky)] == 3
    assert series[("nv_inference_count_total", picky)] == 3
    # The refused request ran (its batch counts); the batch that raised did not complete.
    assert series[("nv_inference_exec_count_total", picky)] == 4
    failures = {
        reason: series[("nv_inference_request_failure_total", picky | {("reason", reason)})]
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    }
    assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 2, "OTHER": 1}
    for name in ("request", "queue", "compute_input", "compute_infer", "compute_output"):
        assert series[(f"nv_inference_{name}_duration_us_total", picky)] > 0
    assert series[("nv_inference_pending_request_count", picky)] == 0
    assert series[("nv_model_load_duration_secs", picky)] > 0
    # Histograms: cumulative buckets, +Inf equals the count, one observation per success.
    assert types["infermux_request_duration_seconds"] == "histogram"
    assert series[("infermux_request_duration_seconds_count", picky)] == 3
    buckets = sorted(
        (float(dict(key)["le"]), value)
        for (name, key), value in series.items()
        if name == "infermux_request_duration_seconds_bucket" and picky <= key
    )
    assert len(buckets) == 18  # 17 bounds and +Inf
    assert [v for _, v in buckets] == sorted(v for _, v in buckets)
    assert buckets[-1] == (float("inf"), 3.0)
    assert series[("infermux_batch_size_count", picky)] == 4
    assert series[("infermux_batch_size_bucket", picky | {("le", "1.0")})] == 4
    instance = picky | {("instance", "picky_0_cpu_0")}
    assert series[("infermux_instance_busy_seconds_total", instance)] > 0
    # Time to first response: every answer the model gave, successes and its own errors (the
    # invalid input never reached it), in Triton's milliseconds and Triton's default buckets.
    first = "nv_inference_first_response_histogram_ms"
    assert types[first] == "histogram"
    assert series[(f"{first}_count", picky)] == 5
    triton_bounds = {dict(key)["le"] for (name, key) in series if name == f"{first}_bucket"}
    assert triton_bounds == {"100", "500", "2000", "5000", "+Inf"}
    assert series[("infermux_first_response_duration_seconds_count", picky)] == 5
    # Every model version has the same label names on every Triton family.
    for (name, key), _ in series.items():
        if name.startswith("nv_inference_request_failure"):
            assert {k for k, _ in key} == {"model", "version", "reason"}
        elif name.startswith(f"{first}_bucket"):
            assert {k for k, _ in key} == {"model", "version", "le"}
        elif name.startswith(("nv_inference", "nv_model")):
            assert {k for k, _ in key} == {"model", "version"}


async def test_counters_are_exposed_under_tritons_names(server: Server) -> None:
    await server.infer("picky", [1.0])
    text = (await server.scrape_client.get("/metrics")).text
    assert "# TYPE nv_inference_request_success counter\n" in text
    assert 'nv_inference_request_success{model="picky",version="1"} 1\n' in text
    assert "nv_inference_request_success_total" not in text
    # prometheus-client's own counters keep their _total (header and samples agree).
    assert "# TYPE process_cpu_seconds_total counter\n" in text
    assert "\nprocess_cpu_seconds_total " in text


async def test_rejected_and_canceled_failures(server: Server) -> None:
    slow = labels(model="slow", version="1")

    def request(seconds: float) -> InferRequest:
        data = np.array([[seconds]], dtype=np.float32)
        return InferRequest("slow", "", [Tensor("INPUT0", "FP32", (1, 1), data)])

    running = asyncio.create_task(server.plane.infer(request(0.5)))
    await asyncio.sleep(0.1)  # taken by the instance
    queued = asyncio.create_task(server.plane.infer(request(0.0)))
    await asyncio.sleep(0.05)
    _, series = await server.scrape()
    assert series[("nv_inference_pending_request_count", slow)] == 1
    assert series[("infermux_requests_in_flight", slow)] == 2
    with pytest.raises(InfermuxError, match="Exceeds maximum queue size"):
        await server.plane.infer(request(0.0))  # the queue (size 1) is full
    queued.cancel()
    with pytest.raises(asyncio.CancelledError):
        await queued
    await running
    _, series = await server.scrape()
    failures = {
        reason: series[("nv_inference_request_failure_total", slow | {("reason", reason)})]
        for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
    }
    assert failures == {"REJECTED": 1, "CANCELED": 1, "BACKEND": 0, "OTHER": 0}
    assert series[("nv_inference_request_success_total", slow)] == 1


async def test_unknown_paths_and_methods(server: Server) -> None:
    assert (await server.scrape_client.get("/other")).status_code == 404
    response = await server.scrape_client.post("/metrics")
    assert response.status_code == 405
    assert response.headers["allow"] == "GET, HEAD"
    head = await server.scrape_client.head("/metrics")
    assert head.status_code == 200
    assert head.content == b""


class FakeNvml(Nvml):
    def __init__(self, readings: list[GpuReading]) -> None:
        super().__init__()
        self._readings = readings

    def read(self) -> list[GpuReading]:
        return self._readings


async def test_gpu_gauges_carry_only_gpu_uuid() -> None:
    readings = [
        GpuReading(0, "GPU-aaa", "H200", 0.75, 10, 100, 312.5),
        GpuReading(1, "GPU-bbb", "H200", 0.0, 1, 100, None),  # no power reading
    ]
    repository = ModelRepository([], BackendRegistry())
    collector = metrics.ServerCollector(repository, nvml=FakeNvml(readings))
    text = metrics.render(collector.collect()).decode()
    # perf_analyzer's --collect-metrics matches exactly this shape.
    assert '\nnv_gpu_utilization{gpu_uuid="GPU-aaa"} 0.75\n' in text
    assert '\nnv_gpu_power_usage{gpu_uuid="GPU-aaa"} 312.5\n' in text
    assert 'nv_gpu_power_usage{gpu_uuid="GPU-bbb"}' not in text
    assert '\nnv_gpu_memory_total_bytes{gpu_uuid="GPU-bbb"} 100\n' in text
    assert '\nnv_gpu_memory_used_bytes{gpu_uuid="GPU-aaa"} 10\n' in text
    off = metrics.ServerCollector(repository, gpu=False, nvml=FakeNvml(readings))
    assert b"nv_gpu" not in metrics.render(off.collect())


def test_label_values_are_escaped() -> None:
    from prometheus_client.metrics_core import Metric

    family = Metric("x", "help with \\ and\nnewline", "gauge")
    family.add_sample("x", {"model": 'a"b\\c\nd'}, 1)
    text = metrics.render([family]).decode()
    (parsed,) = text_string_to_metric_families(text)
    assert parsed.samples[0].labels == {"model": 'a"b\\c\nd'}
    assert parsed.documentation == "help with \\ and\nnewline"


def test_every_declared_family_has_a_unique_name_and_known_type() -> None:
    assert len(metrics.METRICS) == len(metrics.TRITON) + len(metrics.GPU) + len(metrics.INFERMUX)
    for family in metrics.METRICS.values():
        assert family.kind in ("counter", "gauge", "histogram")
        assert family.name.startswith(("nv_", "infermux_"))
    assert "infermux_request_duration_seconds_bucket" in metrics.names()


def test_several_executors_merge_into_one_exposition() -> None:
    """``--executors N``: a model version hosted by two executors shows one series per label
    set, counters and histogram buckets summed, load time maximised; families only one
    executor has pass through."""
    labels = {"model": "m", "version": "1"}
    bucket = "infermux_request_duration_seconds"

    def part(success: int, load: float, le_1: int, gpu: bool) -> list[metrics.FamilyData]:
        families: list[metrics.FamilyData] = [
            ("nv_inference_request_success", "ok", "counter",
             [("nv_inference_request_success", labels, success)]),
            ("nv_model_load_duration_secs", "load", "gauge",
             [("nv_model_load_duration_secs", labels, load)]),
            (bucket, "latency", "histogram",
             [(f"{bucket}_bucket", {**labels, "le": "1.0"}, le_1),
              (f"{bucket}_bucket", {**labels, "le": "+Inf"}, le_1 + 1),
              (f"{bucket}_count", labels, le_1 + 1), (f"{bucket}_sum", labels, 0.5)]),
        ]  # fmt: skip
        if gpu:
            families.append(("nv_gpu_utilization", "util", "gauge",
                             [("nv_gpu_utilization", {"gpu_uuid": "GPU-1"}, 0.5)]))  # fmt: skip
        return families

    text = metrics.render(metrics.merge([part(3, 2.0, 4, True), part(5, 7.5, 1, False)]))
    parsed = {f.name: f for f in text_string_to_metric_families(text.decode())}
    value = {(s.name, tuple(sorted(s.labels.items()))): s.value
             for f in parsed.values() for s in f.samples}  # fmt: skip
    key = tuple(sorted(labels.items()))
    assert value[("nv_inference_request_success_total", key)] == 8  # the parser adds _total
    assert value[("nv_model_load_duration_secs", key)] == 7.5
    assert value[(f"{bucket}_bucket", tuple(sorted({**labels, "le": "1.0"}.items())))] == 5
    assert value[(f"{bucket}_count", key)] == 7
    assert value[(f"{bucket}_sum", key)] == 1.0
    assert value[("nv_gpu_utilization", (("gpu_uuid", "GPU-1"),))] == 0.5
    assert b"# TYPE nv_inference_request_success counter" in text
