"""Triton's logging extension, black-box with tritonclient: GET/POST /v2/logging and gRPC
LogSettings read and change what every process of the server logs."""

from __future__ import annotations

import grpc as grpc_
import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.grpc import service_pb2, service_pb2_grpc
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server, wait_for

pytestmark = pytest.mark.e2e

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}


def infer(url: str) -> None:
    client = httpclient.InferenceServerClient(url)
    tensor = httpclient.InferInput("INPUT0", [1, 16], "INT32")
    tensor.set_data_from_numpy(np.zeros((1, 16), np.int32))
    tensor1 = httpclient.InferInput("INPUT1", [1, 16], "INT32")
    tensor1.set_data_from_numpy(np.ones((1, 16), np.int32))
    client.infer("simple", [tensor, tensor1], request_id="logged")
    client.close()


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_log_settings_reach_every_process(frontends: str) -> None:
    with start_server("--frontends", frontends) as server:
        http = httpclient.InferenceServerClient(server.url)
        grpc = grpcclient.InferenceServerClient(server.grpc_url)
        assert http.get_log_settings() == DEFAULTS
        assert grpc.get_log_settings(as_json=True)["settings"]["log_info"] == {"bool_param": True}
        infer(server.url)
        assert not any("request 'logged'" in line for line in server.log)

        # Every request logged (the executor's lines) once the verbose level is 2.
        changed = grpc.update_log_settings({"log_verbose_level": 2}, as_json=True)
        assert changed["settings"]["log_verbose_level"] == {"uint32_param": 2}
        infer(server.url)
        wait_for(lambda: any("request 'logged'" in line for line in server.log), 10)

        # Each front end answers with the settings changed through another (new connections
        # are spread over the front ends by the kernel).
        for _ in range(8):
            assert httpx.get(f"http://{server.url}/v2/logging").json()["log_verbose_level"] == 2

        assert http.update_log_settings({"log_verbose_level": 0, "log_format": "ISO8601"}) == {
            **DEFAULTS,
            "log_format": "ISO8601",
        }
        http.close()
        grpc.close()
        assert server.stop() == 0


def test_refused_settings_name_the_setting(examples_server: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(examples_server.url)
    with pytest.raises(InferenceServerException, match="unknown log setting 'log_colour'") as e:
        http.update_log_settings({"log_colour": True})
    assert e.value.status() == "400"
    with pytest.raises(InferenceServerException, match="'log_info' must be a boolean"):
        http.update_log_settings({"log_info": "yes"})
    with pytest.raises(InferenceServerException, match="log_file") as e:
        http.update_log_settings({"log_file": "/tmp/elsewhere.log"})
    assert e.value.status() == "501"
    grpc = grpcclient.InferenceServerClient(examples_server.grpc_url)
    with pytest.raises(InferenceServerException, match="log_file") as e:
        grpc.update_log_settings({"log_file": "x.log"})
    assert e.value.status() == "StatusCode.UNIMPLEMENTED"
    # tritonclient sets each setting's field by its name; a raw stub can send the wrong one.
    request = service_pb2.LogSettingsRequest()
    request.settings["log_info"].string_param = "yes"
    with grpc_.insecure_channel(examples_server.grpc_url) as channel:
        stub = service_pb2_grpc.GRPCInferenceServiceStub(channel)
        with pytest.raises(grpc_.RpcError) as raw:
            stub.LogSettings(request, timeout=10)
    assert raw.value.code() == grpc_.StatusCode.INVALID_ARGUMENT
    assert "'log_info' must be a boolean" in str(raw.value.details())
    assert http.get_log_settings() == DEFAULTS
    http.close()
    grpc.close()
