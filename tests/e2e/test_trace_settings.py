"""Triton's trace extension, black-box with tritonclient: /v2[/models/{m}]/trace/setting and gRPC
TraceSetting read and change which requests the executor traces, globally and per model, with
one process and with several (spans are made in the executor, received here by a small OTLP
collector)."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.e2e.otlp import Collector
from tests.support import start_server, wait_for

pytestmark = pytest.mark.e2e


def infer(client: httpclient.InferenceServerClient, model: str, request_id: str) -> None:
    # identity_fp32 takes FP32 vectors, simple_identity BYTES ones.
    data = np.ones((1, 2), np.float32) if model == "identity_fp32" else np.array([[b"a", b"b"]])
    tensor = httpclient.InferInput("INPUT0", [1, 2], "FP32" if data.dtype.kind == "f" else "BYTES")
    tensor.set_data_from_numpy(data.astype(object) if data.dtype.kind == "S" else data)
    client.infer(model, [tensor], request_id=request_id)


def traced_ids(collector: Collector) -> list[str]:
    ids = []
    for span in collector.spans():
        if span.name == "infer":  # type: ignore[attr-defined]
            attributes = {a.key: a.value.string_value for a in span.attributes}  # type: ignore[attr-defined]
            ids.append(attributes["infermux.request.id"])
    return sorted(ids)


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_settings_read_and_change_over_http_and_grpc(frontends: str) -> None:
    with start_server("--frontends", frontends) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        defaults = http.get_trace_settings()
        assert defaults["trace_level"] == ["OFF"]
        assert defaults["trace_rate"] == "1000"
        assert defaults["trace_count"] == "-1"
        assert defaults["log_frequency"] == "0"
        assert defaults["trace_mode"] == "opentelemetry"
        got = grpc.get_trace_settings(as_json=True)["settings"]
        assert got["trace_rate"] == {"value": ["1000"]}

        # A model's settings: its own, merged with the global ones.
        changed = http.update_trace_settings("simple_identity", {"trace_rate": "7"})
        assert changed == {**defaults, "trace_rate": "7"}
        got = grpc.get_trace_settings("simple_identity", as_json=True)["settings"]
        assert got["trace_rate"] == {"value": ["7"]}
        assert http.get_trace_settings()["trace_rate"] == "1000"
        changed = grpc.update_trace_settings(settings={"trace_count": "3"}, as_json=True)
        assert changed["settings"]["trace_count"] == {"value": ["3"]}
        assert http.get_trace_settings("simple_identity")["trace_count"] == "3"
        # Every front end answers the same (new connections spread over the front ends).
        for _ in range(6):
            reply = httpx.get(f"http://{server.url}/v2/models/simple_identity/trace/setting")
            assert reply.json()["trace_rate"] == "7"
        # None clears: the model falls back to the global settings.
        grpc.update_trace_settings("simple_identity", {"trace_rate": None})
        assert http.get_trace_settings("simple_identity") == {**defaults, "trace_count": "3"}

        with pytest.raises(InferenceServerException, match="Request for unknown model : nobody"):
            http.get_trace_settings("nobody")
        with pytest.raises(InferenceServerException) as e:
            grpc.update_trace_settings("nobody", {"trace_rate": "1"})
        assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
        message = "trace file location can not be updated through network protocol"
        with pytest.raises(InferenceServerException, match=message) as e:
            http.update_trace_settings(settings={"trace_file": "t.json"})
        assert e.value.status() == "501"
        with pytest.raises(InferenceServerException, match=message) as e:
            grpc.update_trace_settings(settings={"trace_file": "t.json"})
        assert e.value.status() == "StatusCode.UNIMPLEMENTED"
        with pytest.raises(InferenceServerException, match="TENSORS") as e:
            http.update_trace_settings(settings={"trace_level": ["TIMESTAMPS", "TENSORS"]})
        assert e.value.status() == "501"
        with pytest.raises(InferenceServerException, match="'trace_rate'"):
            grpc.update_trace_settings(settings={"trace_rate": "often"})
        assert http.get_trace_settings() == {**defaults, "trace_count": "3"}
        http.close()
        grpc.close()
        assert server.stop() == 0


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_rate_level_and_model_settings_change_which_requests_make_spans(
    frontends: str, collector: Collector
) -> None:
    # Tracing off at start; log_frequency 1 hands each trace to the collector at once.
    url = f"opentelemetry,url={collector.url}"
    with start_server("--frontends", frontends, "--trace-config", url) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        infer(http, "identity_fp32", "before")
        settings = {"trace_level": ["TIMESTAMPS"], "trace_rate": "2", "log_frequency": "1"}
        grpc.update_trace_settings(settings=settings)
        for i in range(4):
            infer(http, "identity_fp32", f"rate-{i}")
        wait_for(lambda: len(traced_ids(collector)) == 2, 15)
        assert traced_ids(collector) == ["rate-1", "rate-3"]  # every 2nd request

        # Global level off; one model traced, every request of it.
        http.update_trace_settings(settings={"trace_level": ["OFF"]})
        http.update_trace_settings(
            "simple_identity", {"trace_level": ["TIMESTAMPS"], "trace_rate": "1"}
        )
        for i in range(2):
            infer(http, "identity_fp32", f"off-{i}")
            infer(http, "simple_identity", f"model-{i}")
        wait_for(lambda: len(traced_ids(collector)) == 4, 15)
        assert traced_ids(collector) == ["model-0", "model-1", "rate-1", "rate-3"]
        http.close()
        grpc.close()
        assert server.stop() == 0
    assert "off-0" not in traced_ids(collector)
    assert "before" not in traced_ids(collector)
