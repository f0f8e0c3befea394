"""Traces in process, captured with OpenTelemetry's in-memory exporter: the caller's W3C trace
context (HTTP headers, gRPC metadata) is the parent of the request span, the queue wait is its
child, and the batch span is linked to every request span it carried."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from tritonclient.grpc import InferInput
from tritonclient.grpc.aio import InferenceServerClient

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.frontends.grpc import GrpcServer
from infermux.frontends.http import HttpApp
from infermux.observability.tracing import TRACING, carrier
from infermux.repository import ControlMode, ModelRepository
from infermux.settings import TraceSettings
from tests.support import write_model

TRACE_ID = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT_ID = "00f067aa0ba902b7"


def traceparent(trace_id: str = TRACE_ID, sampled: bool = True) -> str:
    return f"00-{trace_id}-{PARENT_ID}-{'01' if sampled else '00'}"


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    exporter = InMemorySpanExporter()
    # As infermux configures it, but exporting synchronously for the test; rate 1000, so that
    # only requests with a sampled traceparent are traced here.
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TRACING.use(provider, rate=1000)
    yield exporter
    TRACING.shutdown()


@pytest.fixture
async def plane(tmp_path: Path) -> AsyncIterator[DataPlane]:
    # Batches form over 200 ms, so that concurrent requests share one.
    write_model(
        tmp_path, "batched", extra="dynamic_batching { max_queue_delay_microseconds: 200000 }"
    )
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    yield DataPlane(repository, version="test")
    await repository.close()


@pytest.fixture
async def http(plane: DataPlane) -> AsyncIterator[httpx.AsyncClient]:
    transport = httpx.ASGITransport(app=HttpApp(plane))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client


BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1, 2]}]}


def by_name(spans: tuple[ReadableSpan, ...], name: str) -> list[ReadableSpan]:
    return [s for s in spans if s.name == name]


async def test_http_traceparent_is_the_parent_and_the_batch_links_every_request(
    exporter: InMemorySpanExporter, http: httpx.AsyncClient
) -> None:
    other = "0af7651916cd43dd8448eb211c80319c"
    responses = await asyncio.gather(
        http.post("/v2/models/batched/infer", json=BODY, headers={"traceparent": traceparent()}),
        http.post(
            "/v2/models/batched/infer",
            json={**BODY, "id": "req-2"},
            headers={"traceparent": traceparent(other), "tracestate": "vendor=1"},
        ),
    )
    assert [r.status_code for r in responses] == [200, 200]
    spans = exporter.get_finished_spans()
    requests = by_name(spans, "infer")
    assert {format(s.context.trace_id, "032x") for s in requests} == {TRACE_ID, other}
    for span in requests:
        assert span.parent is not None
        assert format(span.parent.span_id, "016x") == PARENT_ID
        assert span.attributes is not None
        assert span.attributes["infermux.model.name"] == "batched"
        assert span.attributes["infermux.model.version"] == "1"
        assert span.attributes["infermux.request.batch_size"] == 1
    second = next(s for s in requests if format(s.context.trace_id, "032x") == other)
    assert second.attributes is not None
    assert second.attributes["infermux.request.id"] == "req-2"
    assert second.context.trace_state.get("vendor") == "1"
    # One queue span per request, the child of its request span.
    queues = by_name(spans, "queue")
    assert sorted((q.context.trace_id, q.parent.span_id) for q in queues if q.parent) == sorted(
        (r.context.trace_id, r.context.span_id) for r in requests
    )
    # Both requests ran in one batch: one execute span, linked to both request spans.
    (batch,) = by_name(spans, "execute")
    assert batch.attributes is not None
    assert batch.attributes["infermux.batch.size"] == 2
    assert batch.attributes["infermux.batch.requests"] == 2
    linked = {(link.context.trace_id, link.context.span_id) for link in batch.links}
    assert linked == {(r.context.trace_id, r.context.span_id) for r in requests}
    for queue in queues:
        assert queue.start_time is not None
        assert queue.end_time is not None
        assert batch.start_time is not None
        assert queue.end_time <= batch.start_time + 1
        assert queue.start_time <= queue.end_time


async def test_grpc_metadata_carries_the_trace_context(
    exporter: InMemorySpanExporter, plane: DataPlane
) -> None:
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=1)
    await server.start()
    try:
        async with InferenceServerClient(f"127.0.0.1:{server.bound_port}") as client:
            array = np.array([[1.0, 2.0]], dtype=np.float32)
            tensor = InferInput("INPUT0", [1, 2], "FP32").set_data_from_numpy(array)
            await client.infer("batched", [tensor], headers={"traceparent": traceparent()})
    finally:
        await server.stop()
    (span,) = by_name(exporter.get_finished_spans(), "infer")
    assert format(span.context.trace_id, "032x") == TRACE_ID
    assert span.parent is not None
    assert format(span.parent.span_id, "016x") == PARENT_ID


async def test_an_unsampled_parent_is_not_traced(
    exporter: InMemorySpanExporter, http: httpx.AsyncClient
) -> None:
    headers = {"traceparent": traceparent(sampled=False)}
    assert (await http.post("/v2/models/batched/infer", json=BODY, headers=headers)).is_success
    assert exporter.get_finished_spans() == ()


async def test_a_failed_request_span_says_so(
    exporter: InMemorySpanExporter, http: httpx.AsyncClient
) -> None:
    bad = {"inputs": [{"name": "NOPE", "datatype": "FP32", "shape": [1, 1], "data": [1]}]}
    headers = {"traceparent": traceparent()}
    response = await http.post("/v2/models/batched/infer", json=bad, headers=headers)
    assert response.status_code == 400
    (span,) = exporter.get_finished_spans()
    assert span.name == "infer"
    assert not span.status.is_ok
    assert span.status.description is not None
    assert "NOPE" in span.status.description


async def test_rate_traces_one_request_in_n(
    exporter: InMemorySpanExporter, http: httpx.AsyncClient
) -> None:
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    TRACING.use(provider, rate=3)
    for _ in range(9):
        assert (await http.post("/v2/models/batched/infer", json=BODY)).is_success
    requests = by_name(exporter.get_finished_spans(), "infer")
    assert len(requests) == 3
    assert all(span.parent is None for span in requests)  # new traces
    # A caller's decision wins over the count, either way; a malformed traceparent is ignored.
    exporter.clear()
    sampled, unsampled = traceparent(), traceparent(sampled=False)
    for header in (unsampled, unsampled, unsampled, sampled, "00-bad", "00-bad", "00-bad"):
        headers = {"traceparent": header}
        assert (await http.post("/v2/models/batched/infer", json=BODY, headers=headers)).is_success
    requests = by_name(exporter.get_finished_spans(), "infer")
    assert len(requests) == 2  # the sampled parent, and 1 in 3 of the malformed ones
    assert sum(format(s.context.trace_id, "032x") == TRACE_ID for s in requests) == 1


def test_sampling_decisions() -> None:
    TRACING.use(TracerProvider(), rate=2)
    try:
        picks = [TRACING.sampled("m", {}) is not None for _ in range(4)]
        assert picks == [False, True, False, True]
        assert TRACING.sampled("m", {"traceparent": traceparent()})
        assert not TRACING.sampled("m", {"traceparent": traceparent(sampled=False)})
        assert TRACING.current() is None  # outside any request span
    finally:
        TRACING.shutdown()


async def test_off_by_default(http: httpx.AsyncClient) -> None:
    assert TRACING.tracer is None
    headers = {"traceparent": traceparent()}
    assert (await http.post("/v2/models/batched/infer", json=BODY, headers=headers)).is_success


def test_carrier_picks_only_trace_headers() -> None:
    assert carrier({"traceparent": "a", "content-type": "b"}) == {"traceparent": "a"}
    assert carrier([("tracestate", "x=1"), ("user-agent", "u")]) == {"tracestate": "x=1"}
    assert carrier({}) == {}


def test_start_needs_the_level_on() -> None:
    TRACING.start(TraceSettings())  # level OFF: nothing happens
    assert TRACING.tracer is None


def test_start_exports_over_otlp() -> None:
    TRACING.start(TraceSettings(level="TIMESTAMPS", rate=1, url="http://127.0.0.1:9/v1/traces"))
    try:
        tracer: Any = TRACING.tracer
        assert tracer is not None
    finally:
        TRACING.shutdown()
    assert TRACING.tracer is None


@pytest.fixture
async def two_models(tmp_path: Path) -> AsyncIterator[httpx.AsyncClient]:
    for name in ("a", "b"):
        write_model(tmp_path, name)
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    transport = httpx.ASGITransport(app=HttpApp(DataPlane(repository, version="test")))
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        yield client
    await repository.close()


async def traced_models(http: httpx.AsyncClient, exporter: InMemorySpanExporter) -> list[str]:
    exporter.clear()
    for model in ("a", "b", "a", "b", "a", "b", "a", "b"):
        assert (await http.post(f"/v2/models/{model}/infer", json=BODY)).is_success
    spans = by_name(exporter.get_finished_spans(), "infer")
    return [str((s.attributes or {})["infermux.model.name"]) for s in spans]


async def test_trace_settings_change_which_requests_make_spans(
    exporter: InMemorySpanExporter, two_models: httpx.AsyncClient
) -> None:
    http = two_models
    assert await traced_models(http, exporter) == []  # rate 1000
    reply = await http.post("/v2/trace/setting", json={"trace_rate": "2"})
    assert reply.status_code == 200, reply.text
    assert reply.json()["trace_rate"] == "2"
    assert await traced_models(http, exporter) == ["b", "b", "b", "b"]  # every 2nd request
    # Model a: every request; b keeps the global rate, counted over its own requests now.
    reply = await http.post("/v2/models/a/trace/setting", json={"trace_rate": "1"})
    assert reply.json()["trace_rate"] == "1"
    assert sorted(await traced_models(http, exporter)) == ["a"] * 4 + ["b"] * 2
    # The global level off: b is not traced; a, which did not set its level, neither.
    await http.post("/v2/trace/setting", json={"trace_level": ["OFF"]})
    assert await traced_models(http, exporter) == []
    assert TRACING.tracer is None  # nothing traces: the untraced fast path again
    await http.post("/v2/models/a/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
    assert await traced_models(http, exporter) == ["a"] * 4
    # Back to the global settings; a count of 1.
    await http.post("/v2/models/a/trace/setting", json={"trace_level": None, "trace_rate": None})
    assert (await http.get("/v2/models/a/trace/setting")).json()["trace_level"] == ["OFF"]
    body = {"trace_level": ["TIMESTAMPS"], "trace_rate": "1", "trace_count": "1"}
    assert (await http.post("/v2/trace/setting", json=body)).json()["trace_count"] == "1"
    assert await traced_models(http, exporter) == ["a"]
    assert (await http.get("/v2/trace/setting")).json()["trace_count"] == "0"


async def test_trace_setting_refusals(
    exporter: InMemorySpanExporter, two_models: httpx.AsyncClient
) -> None:
    http = two_models
    reply = await http.get("/v2/models/nobody/trace/setting")
    assert reply.status_code == 400
    assert reply.json() == {"error": "Request for unknown model : nobody"}
    reply = await http.post("/v2/trace/setting", json={"trace_file": "x.json"})
    assert reply.status_code == 501
    assert "trace file location can not be updated" in reply.json()["error"]
    reply = await http.post("/v2/models/a/trace/setting", json={"trace_level": ["TENSORS"]})
    assert reply.status_code == 501
    assert "TENSORS" in reply.json()["error"]
    reply = await http.post("/v2/trace/setting", json={"trace_rate": "2", "trace_count": "x"})
    assert reply.status_code == 400
    assert (await http.get("/v2/trace/setting")).json()["trace_rate"] == "1000"  # unchanged
    assert (await http.put("/v2/trace/setting")).status_code == 405


async def test_log_frequency_hands_spans_to_the_exporter_at_once(
    two_models: httpx.AsyncClient,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    # An exporter schedule far longer than the test: spans arrive only when flushed.
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=600_000))
    TRACING.use(provider, rate=1)
    try:
        assert (await two_models.post("/v2/models/a/infer", json=BODY)).is_success
        await asyncio.sleep(0.2)
        assert exporter.get_finished_spans() == ()
        await two_models.post("/v2/trace/setting", json={"log_frequency": "1"})
        assert (await two_models.post("/v2/models/a/infer", json=BODY)).is_success
        for _ in range(100):
            if len(by_name(exporter.get_finished_spans(), "infer")) == 2:
                break
            await asyncio.sleep(0.05)
        assert len(by_name(exporter.get_finished_spans(), "infer")) == 2
    finally:
        TRACING.shutdown()


async def test_turning_tracing_on_at_run_time_makes_the_exporter(
    two_models: httpx.AsyncClient,
) -> None:
    TRACING.start(TraceSettings(url="http://127.0.0.1:9/v1/traces"))  # level OFF
    try:
        assert TRACING.tracer is None
        reply = await two_models.post("/v2/trace/setting", json={"trace_level": ["TIMESTAMPS"]})
        assert reply.json()["trace_level"] == ["TIMESTAMPS"]
        assert reply.json()["url"] == "http://127.0.0.1:9/v1/traces"
        tracer: Any = TRACING.tracer  # (mypy narrowed it to None above)
        assert tracer is not None
    finally:
        TRACING.shutdown()
