"""gRPC specifics against the real server: parameters, repository control, errors, streaming."""

from __future__ import annotations

import json
import queue
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.support import IDENTITY_MODEL, PARAMETERS_MODEL, start_server, write_model

pytestmark = pytest.mark.e2e


def _bytes_input(module: Any) -> Any:
    infer_input = module.InferInput("INPUT0", [1, 1], "BYTES")
    infer_input.set_data_from_numpy(np.array([[b"x"]], dtype=np.object_))
    return infer_input


def test_parameters_reach_the_model_over_both_protocols(tmp_path: Path) -> None:
    write_model(tmp_path, "params", datatype="BYTES", dims="[ 1 ]", source=PARAMETERS_MODEL)
    with start_server("--model-repository", str(tmp_path)) as server:
        sent = {"priority": 2, "timeout": 5000, "custom": "abc", "ratio": 0.5, "flag": True}
        g = grpcclient.InferenceServerClient(server.grpc_url)
        result = g.infer(
            "params",
            [_bytes_input(grpcclient)],
            priority=2,
            timeout=5000,
            parameters={"custom": "abc", "ratio": 0.5, "flag": True},
        )
        seen = json.loads(result.as_numpy("OUTPUT0")[0, 0])
        assert seen == sent
        h = httpclient.InferenceServerClient(server.url)
        result = h.infer(
            "params",
            [_bytes_input(httpclient)],
            priority=2,
            timeout=5000,
            parameters={"custom": "abc", "ratio": 0.5, "flag": True},
        )
        seen = json.loads(result.as_numpy("OUTPUT0")[0, 0])
        # tritonclient.http also sends binary_data_output; everything else arrives as sent.
        assert {k: v for k, v in seen.items() if k != "binary_data_output"} == sent
        g.close()
        h.close()
        assert server.stop() == 0


def test_repository_control_over_grpc(tmp_path: Path) -> None:
    write_model(tmp_path, "a", source=IDENTITY_MODEL)
    args = ["--model-repository", str(tmp_path), "--model-control-mode", "explicit"]
    with start_server(*args) as server:
        client = grpcclient.InferenceServerClient(server.grpc_url)
        assert not client.is_model_ready("a")
        client.load_model("a")
        assert client.is_model_ready("a")
        override = json.dumps(
            {
                "name": "a",
                "backend": "python",
                "max_batch_size": 3,
                "input": [{"name": "INPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
                "output": [{"name": "OUTPUT0", "data_type": "TYPE_FP32", "dims": [-1]}],
            }
        )
        client.load_model("a", config=override)
        assert client.get_model_config("a").config.max_batch_size == 3
        index = client.get_model_repository_index(as_json=True)["models"]
        assert {"name": "a", "version": "1", "state": "READY"}.items() <= index[0].items()
        client.unload_model("a")
        assert not client.is_model_ready("a")
        with pytest.raises(InferenceServerException, match="no such model") as info:
            client.load_model("zzz")
        assert "NOT_FOUND" in str(info.value.status())
        client.close()
        assert server.stop() == 0


def test_grpc_errors_and_stream_survival(test_server: Any) -> None:
    client = grpcclient.InferenceServerClient(test_server.grpc_url)
    bad = grpcclient.InferInput("INPUT0", [1, 2], "INT32")
    bad.set_data_from_numpy(np.zeros((1, 2), np.int32))
    with pytest.raises(InferenceServerException, match="expects 'FP32'") as info:
        client.infer("identity_fp32", [bad])
    assert "INVALID_ARGUMENT" in str(info.value.status())
    with pytest.raises(InferenceServerException, match="unknown model") as info:
        client.infer("nope", [bad])
    assert "NOT_FOUND" in str(info.value.status())
    # One stream: a good request, a bad one, a good one. The bad one gets its error, the stream
    # stays open and the others are answered.
    results: queue.Queue[Any] = queue.Queue()
    client.start_stream(callback=lambda result, error: results.put((result, error)))
    good = grpcclient.InferInput("INPUT0", [1, 2], "FP32")
    good.set_data_from_numpy(np.ones((1, 2), np.float32))
    client.async_stream_infer("identity_fp32", [good], request_id="1")
    client.async_stream_infer("identity_fp32", [bad], request_id="2")
    client.async_stream_infer("identity_fp32", [good], request_id="3")
    answers = [results.get(timeout=30) for _ in range(3)]
    client.stop_stream()
    errors = [e for _, e in answers if e is not None]
    oks = [r for r, e in answers if e is None]
    assert len(errors) == 1
    assert "expects 'FP32'" in str(errors[0])
    assert sorted(r.get_response().id for r in oks) == ["1", "3"]
    client.close()
