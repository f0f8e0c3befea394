"""The gRPC service in-process: a grpc.aio server on port 0, driven by tritonclient's aio client.

The data plane is a scripted double (``fake_plane``), so these tests pin the front end alone:
decoding, the one data-plane call, encoding, and Triton's status for each error code.
"""

from __future__ import annotations

import base64
import json
import logging
from typing import Any

import grpc  # type: ignore[import-untyped,unused-ignore]  # grpcio ships no type information
import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput, service_pb2
from tritonclient.utils import InferenceServerException

from infermux.errors import ErrorCode
from infermux.frontends.grpc.servicer import STATUS_OF

from .fake_plane import FakePlane, fp32_input


async def expect_status(call: Any, status: str, message: str) -> None:
    with pytest.raises(InferenceServerException) as caught:
        await call
    assert caught.value.status() == f"StatusCode.{status}"
    assert message in caught.value.message()


async def test_health_and_metadata(client: Any, plane: FakePlane) -> None:
    assert await client.is_server_live()
    assert await client.is_server_ready()
    plane.is_ready = False
    assert not await client.is_server_ready()
    assert await client.is_model_ready("echo")
    assert not await client.is_model_ready("echo", "2")
    assert not await client.is_model_ready("nobody")  # unknown is "not ready", not an error
    await expect_status(client.is_model_ready("echo", "x"), "INVALID_ARGUMENT", "not a number")
    server = await client.get_server_metadata()
    assert (server.name, server.version) == ("infermux", "9.9")
    assert list(server.extensions) == ["statistics", "system_shared_memory"]
    meta = await client.get_model_metadata("echo", as_json=True)
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1", "4"]}]
    config = await client.get_model_config("echo")
    assert config.config.max_batch_size == 8
    assert config.config.input[0].name == "INPUT0"


async def test_infer(client: Any) -> None:
    result = await client.infer(
        "echo",
        [fp32_input([1.0, 2.0, 3.0, 4.0])],
        request_id="r7",
        outputs=[InferRequestedOutput("OUTPUT0")],
        parameters={"custom": "x"},
    )
    assert result.as_numpy("OUTPUT0").tolist() == [[1.0, 2.0, 3.0, 4.0]]
    response = result.get_response()
    assert (response.id, response.model_name, response.model_version) == ("r7", "echo", "1")
    assert response.parameters["seen"].bool_param


async def test_infer_errors_carry_triton_status(client: Any) -> None:
    await expect_status(
        client.infer("fail", [fp32_input([1.0])], request_id="q"),
        "INVALID_ARGUMENT",
        "request 'q' refused",
    )
    await expect_status(client.infer("nobody", [fp32_input([1.0])]), "NOT_FOUND", "nobody")


@pytest.mark.parametrize("code", list(ErrorCode))
async def test_every_error_code_maps_to_tritons_grpc_status(client: Any, code: ErrorCode) -> None:
    status = STATUS_OF[code].name
    await expect_status(
        client.get_model_metadata(f"error-{code.name}"), status, f"scripted {code.value} error"
    )


async def test_unexpected_exceptions_are_internal_and_logged(
    client: Any, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.ERROR, logger="infermux.frontends.grpc.servicer"):
        await expect_status(client.get_model_metadata("crash"), "INTERNAL", "kaboom")
    assert any(r.exc_info for r in caplog.records)


async def test_statistics(client: Any) -> None:
    stats = await client.get_inference_statistics("echo")
    (entry,) = stats.model_stats
    assert (entry.name, entry.version, entry.inference_count, entry.execution_count) == (
        "echo",
        "1",
        10,
        5,
    )
    assert (entry.inference_stats.success.count, entry.inference_stats.success.ns) == (10, 5000)
    assert entry.last_inference == 1234
    everything = await client.get_inference_statistics()
    assert len(everything.model_stats) == 5
    await expect_status(client.get_inference_statistics("nobody"), "NOT_FOUND", "nobody")


async def test_repository(client: Any, plane: FakePlane) -> None:
    index = await client.get_model_repository_index()
    assert [(m.name, m.state) for m in index.models][-1] == ("broken", "UNAVAILABLE")
    assert index.models[-1].reason == "load failed"
    override = json.dumps({"max_batch_size": 2})
    await client.load_model("echo")
    await client.load_model("echo", config=override)
    await client.unload_model("echo")
    assert plane.loads == [("echo", None), ("echo", override)]
    assert plane.unloads == ["echo"]
    # File overrides travel as bytes_param and reach the plane without their "file:" prefix.
    await client.load_model("echo", config=override, files={"file:1/model.py": b"x"})
    assert plane.loads[-1] == ("echo", override)
    assert plane.load_files[-1] == {"1/model.py": b"x"}


async def test_system_shared_memory(client: Any, plane: FakePlane) -> None:
    await client.register_system_shared_memory("r", "/infermux_key", 64, offset=8)
    status = await client.get_system_shared_memory_status()
    region = status.regions["r"]
    assert (region.name, region.key, region.offset, region.byte_size) == (
        "r",
        "/infermux_key",
        8,
        64,
    )
    await expect_status(
        client.register_system_shared_memory("r", "/other", 8), "ALREADY_EXISTS", "'r'"
    )
    await expect_status(client.get_system_shared_memory_status("zz"), "NOT_FOUND", "'zz'")
    await client.unregister_system_shared_memory()
    assert plane.regions == {}


async def test_trace_settings_travel_as_lists_of_strings(client: Any, plane: FakePlane) -> None:
    got = await client.get_trace_settings(as_json=True)
    assert got["settings"]["trace_rate"] == {"value": ["1000"]}
    assert got["settings"]["trace_level"] == {"value": ["OFF"]}
    changes = {"trace_rate": "5", "trace_level": ["TIMESTAMPS"], "trace_count": None}
    got = await client.update_trace_settings("echo", changes, as_json=True)
    # One string is sent as a list of one; None, as an empty list, clears the setting.
    assert plane.traced == [
        ("echo", {"trace_rate": ["5"], "trace_level": ["TIMESTAMPS"], "trace_count": None})
    ]
    assert got["settings"]["trace_level"] == {"value": ["TIMESTAMPS"]}
    await expect_status(
        client.update_trace_settings(settings={"trace_file": "t"}), "UNIMPLEMENTED", "trace file"
    )
    await expect_status(
        client.get_trace_settings("nobody"), "INVALID_ARGUMENT", "Request for unknown model"
    )


async def test_load_config_must_be_a_string(client: Any) -> None:
    # tritonclient always sends a string; a hand-built request can send anything.
    request = service_pb2.RepositoryModelLoadRequest(model_name="echo")
    request.parameters["config"].bool_param = True
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client._client_stub.RepositoryModelLoad(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert caught.value.details() == (
        "failed to load 'echo': parameter 'config' must be a ModelConfig JSON string"
    )


async def test_load_file_must_be_bytes(client: Any) -> None:
    request = service_pb2.RepositoryModelLoadRequest(model_name="echo")
    request.parameters["file:1/model.py"].string_param = "x"
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await client._client_stub.RepositoryModelLoad(request)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "failed to load 'echo': load parameter 'file:1/model.py'" in caught.value.details()


async def test_cuda_shared_memory_register_status_unregister(client: Any, plane: FakePlane) -> None:
    handle = bytes(range(64))
    # tritonclient sends the handle base64-encoded, as get_raw_handle() returns it.
    await client.register_cuda_shared_memory("c", base64.b64encode(handle), 1, 256)
    assert plane.cuda_handles["c"] == handle
    status = await client.get_cuda_shared_memory_status()
    region = status.regions["c"]
    assert (region.name, region.device_id, region.byte_size) == ("c", 1, 256)
    await expect_status(client.get_cuda_shared_memory_status("d"), "NOT_FOUND", "'d'")
    await expect_status(
        client.register_cuda_shared_memory("e", base64.b64encode(b"short"), 0, 16),
        "INVALID_ARGUMENT",
        "64 bytes",
    )
    await client.unregister_cuda_shared_memory()
    assert not (await client.get_cuda_shared_memory_status()).regions


async def test_unknown_model_is_answered_before_a_malformed_request(client: Any) -> None:
    # Raw contents one element short: a body fault, but the model is unknown, which comes first.
    short = InferInput("INPUT0", [1, 3], "FP32")
    short.set_data_from_numpy(np.zeros((1, 3), np.float32)).set_shape([1, 4])
    await expect_status(client.infer("nobody", [short]), "NOT_FOUND", "unknown model: 'nobody'")
    await expect_status(client.infer("echo", [short]), "INVALID_ARGUMENT", "INPUT0")


async def test_log_settings_convert_each_value_kind(client: Any, plane: FakePlane) -> None:
    got = await client.get_log_settings(as_json=True)
    assert got["settings"] == {
        "log_info": {"bool_param": True},
        "log_verbose_level": {"uint32_param": 0},
    }
    await client.update_log_settings({"log_info": False, "log_verbose_level": 3})
    assert plane.logging == {"log_info": False, "log_verbose_level": 3}
    await expect_status(
        client.update_log_settings({"log_colour": True}), "INVALID_ARGUMENT", "log_colour"
    )
