"""Metrics, traces and logs of the real ``infermux serve``, with one process and with several.

Metrics are scraped with prometheus-client's parser after known traffic through tritonclient;
traces are received by a small OTLP/HTTP collector in the test, so the trace context is seen
crossing from a front-end process to the executor, where the spans are made.
"""

from __future__ import annotations

import json
import socket
import urllib.error
import urllib.request
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from prometheus_client.parser import text_string_to_metric_families
from tritonclient.utils import InferenceServerException

from tests.e2e.otlp import Collector
from tests.support import PICKY_MODEL, ServerProcess, start_server, write_model

pytestmark = pytest.mark.e2e

Series = dict[tuple[str, frozenset[tuple[str, str]]], float]
TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


@pytest.fixture(scope="module")
def repository(tmp_path_factory: pytest.TempPathFactory) -> Path:
    repo = tmp_path_factory.mktemp("observability")
    write_model(repo, "picky", source=PICKY_MODEL)
    return repo


def serve(repository: Path, *args: str) -> ServerProcess:
    return start_server("--model-repository", str(repository), "--ipc-arena-mb", "4", *args)


def scrape(server: ServerProcess) -> Series:
    with urllib.request.urlopen(server.metrics_url, timeout=10) as response:
        text = response.read().decode()
    series: Series = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            series[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return series


def http_input(values: list[float]) -> httpclient.InferInput:
    array = np.array([values], dtype=np.float32)
    return httpclient.InferInput("INPUT0", [1, len(values)], "FP32").set_data_from_numpy(array)


def grpc_input(values: list[float]) -> grpcclient.InferInput:
    array = np.array([values], dtype=np.float32)
    return grpcclient.InferInput("INPUT0", [1, len(values)], "FP32").set_data_from_numpy(array)


@pytest.mark.parametrize("frontends", [1, 2])
def test_metrics_count_exactly_whichever_process_answered(repository: Path, frontends: int) -> None:
    with serve(repository, "--frontends", str(frontends)) as server:
        assert server.metrics_port > 0
        # Several connections each way, so that with two front ends both take requests.
        for _ in range(4):
            http = httpclient.InferenceServerClient(server.url)
            for _ in range(3):
                http.infer("picky", [http_input([1.0, 2.0])])
            with pytest.raises(InferenceServerException, match="must not start negative"):
                http.infer("picky", [http_input([-1.0])])
            http.close()
            grpc = grpcclient.InferenceServerClient(server.grpc_url)
            grpc.infer("picky", [grpc_input([3.0])])
            grpc.close()
        http = httpclient.InferenceServerClient(server.url)
        with pytest.raises(InferenceServerException):
            http.infer("picky", [http_input([13.0])])  # the model raises
        wrong = httpclient.InferInput("INPUT0", [1, 1], "INT32")
        wrong.set_data_from_numpy(np.array([[1]], dtype=np.int32))
        with pytest.raises(InferenceServerException, match="INT32"):
            http.infer("picky", [wrong])  # refused before the model
        http.close()
        series = scrape(server)
        picky = frozenset({("model", "picky"), ("version", "1")})
        assert series[("nv_inference_request_success_total", picky)] == 16
        assert series[("nv_inference_count_total", picky)] == 16
        failures = {
            reason: series[("nv_inference_request_failure_total", picky | {("reason", reason)})]
            for reason in ("REJECTED", "CANCELED", "BACKEND", "OTHER")
        }
        assert failures == {"REJECTED": 0, "CANCELED": 0, "BACKEND": 5, "OTHER": 1}
        assert series[("infermux_request_duration_seconds_count", picky)] == 16
        models = {dict(k)["model"] for name, k in series if name == "nv_inference_count_total"}
        assert models == {"picky"}
        # The executor's (or the one process's) own figures come along.
        assert series[("process_resident_memory_bytes", frozenset())] > 0


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def test_allow_metrics_false_serves_no_metrics(repository: Path) -> None:
    port = free_port()
    with serve(
        repository, "--metrics-port", str(port), "--allow-metrics", "false", "--frontends", "2"
    ) as server:
        assert server.metrics_port == 0  # not announced
        with pytest.raises(urllib.error.URLError):
            urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5)
        client = httpclient.InferenceServerClient(server.url)
        client.infer("picky", [http_input([1.0])])  # serving is unaffected
        client.close()


def test_traces_cross_from_a_front_end_process_to_the_executor(
    repository: Path, collector: Collector
) -> None:
    server = serve(
        repository,
        "--frontends",
        "2",
        "--trace-config",
        "mode=opentelemetry",
        "--trace-config",
        "rate=1",
        "--trace-config",
        f"opentelemetry,url={collector.url}",
        "--trace-config",
        "opentelemetry,resource=deployment=test",
    )
    with server:
        client = httpclient.InferenceServerClient(server.url)
        headers = {"traceparent": f"00-{TRACE_ID}-{PARENT_ID}-01"}
        client.infer("picky", [http_input([1.0])], headers=headers, request_id="traced-1")
        client.infer("picky", [http_input([2.0])])  # no parent: a new trace (rate 1: all)
        client.close()
        assert server.stop() == 0  # the executor flushes its spans on the way out
    spans: list = collector.spans()  # type: ignore[type-arg]
    infer = [s for s in spans if s.name == "infer"]
    assert len(infer) == 2
    traced = next(s for s in infer if s.trace_id.hex() == TRACE_ID)
    assert traced.parent_span_id.hex() == PARENT_ID
    attributes = {a.key: a.value.string_value for a in traced.attributes}
    assert attributes["infermux.request.id"] == "traced-1"
    assert attributes["infermux.model.name"] == "picky"
    executes = [s for s in spans if s.name == "execute"]
    assert len(executes) == 2
    links = {(link.trace_id, link.span_id) for s in executes for link in s.links}
    assert links == {(s.trace_id, s.span_id) for s in infer}
    queues = [s for s in spans if s.name == "queue"]
    assert {(q.trace_id, q.parent_span_id) for q in queues} == {
        (s.trace_id, s.span_id) for s in infer
    }
    resource = {
        a.key: a.value.string_value
        for request in collector.requests
        for r in request.resource_spans
        for a in r.resource.attributes
    }
    assert resource["service.name"] == "infermux"
    assert resource["deployment"] == "test"


def test_json_logs_carry_the_request_id(repository: Path) -> None:
    with serve(repository, "--log-format", "json", "--log-verbose", "2") as server:
        client = httpclient.InferenceServerClient(server.url)
        client.infer("picky", [http_input([1.0])], request_id="req-42")
        with pytest.raises(InferenceServerException):
            client.infer("picky", [http_input([-1.0])], request_id="req-43")
        client.close()
        assert server.stop() == 0
    records = []
    for line in server.log:
        if line.startswith("{"):
            records.append(json.loads(line))
    assert records, server.log
    assert all({"time", "level", "logger", "message", "role"} <= set(r) for r in records)
    done = [r for r in records if r.get("request_id") == "req-42"]
    assert done
    assert done[0]["model"] == "picky"
    assert done[0]["version"] == 1
    failed = [r for r in records if r.get("request_id") == "req-43"]
    assert failed
    assert failed[0]["reason"] == "BACKEND"
    assert any("ready" in r["message"] for r in records)  # the ready line too
