"""System shared memory over HTTP and gRPC with tritonclient's own shm utilities."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import (
    InferenceServerException,
    serialize_byte_tensor,
)

from tests.support import ServerProcess, start_server

pytestmark = pytest.mark.e2e

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture(scope="module")
def shm_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with start_server("--allow-client-shm") as server:
        yield server
        assert server.stop() == 0


@pytest.fixture
def regions() -> Iterator[dict[str, Any]]:
    """Input region holding A then B, and an output region for two 64-byte outputs."""
    tag = uuid.uuid4().hex[:8]
    handles = {
        "in": shm.create_shared_memory_region(f"in_{tag}", f"/infermux_in_{tag}", 128),
        "out": shm.create_shared_memory_region(f"out_{tag}", f"/infermux_out_{tag}", 128),
    }
    shm.set_shared_memory_region(handles["in"], [A, B])
    yield {"tag": tag, **handles}
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def _client(module: Any, server: ServerProcess) -> Any:
    return module.InferenceServerClient(server.url if module is httpclient else server.grpc_url)


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_simple_through_shared_memory(
    shm_server: ServerProcess, regions: dict[str, Any], module: Any
) -> None:
    client = _client(module, shm_server)
    tag = regions["tag"]
    client.unregister_system_shared_memory()
    client.register_system_shared_memory(f"in_{tag}", f"/infermux_in_{tag}", 128)
    client.register_system_shared_memory(f"out_{tag}", f"/infermux_out_{tag}", 128)
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(f"in_{tag}", 64)
    inputs[1].set_shared_memory(f"in_{tag}", 64, offset=64)
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(f"out_{tag}", 64)
    outputs[1].set_shared_memory(f"out_{tag}", 64, offset=64)
    result = client.infer("simple", inputs, outputs=outputs)
    placed = result.get_output("OUTPUT0")
    # The data is in shared memory, not in the response.
    if module is httpclient:
        assert set(placed) == {"name", "datatype", "shape"}
    else:
        assert not placed.parameters
        assert not result.get_response().raw_output_contents[0]
    out0 = shm.get_contents_as_numpy(regions["out"], np.int32, [1, 16])
    out1 = shm.get_contents_as_numpy(regions["out"], np.int32, [1, 16], offset=64)
    np.testing.assert_array_equal(out0, A + B)
    np.testing.assert_array_equal(out1, A - B)
    status = client.get_system_shared_memory_status()
    names = {r["name"] for r in status} if isinstance(status, list) else set(status.regions)
    assert {f"in_{tag}", f"out_{tag}"} <= names
    client.unregister_system_shared_memory(f"in_{tag}")
    client.unregister_system_shared_memory()
    client.close()


@pytest.mark.parametrize("module", [httpclient, grpcclient], ids=["http", "grpc"])
def test_bytes_through_shared_memory(shm_server: ServerProcess, module: Any) -> None:
    data = np.array([[b"alpha", "wörld".encode(), b""]], dtype=np.object_)
    serialized = serialize_byte_tensor(data)
    size = len(serialized.item())
    tag = uuid.uuid4().hex[:8]
    handle_in = shm.create_shared_memory_region(f"bin_{tag}", f"/infermux_bin_{tag}", size)
    handle_out = shm.create_shared_memory_region(f"bout_{tag}", f"/infermux_bout_{tag}", size)
    try:
        shm.set_shared_memory_region(handle_in, [serialized])
        client = _client(module, shm_server)
        client.register_system_shared_memory(f"bin_{tag}", f"/infermux_bin_{tag}", size)
        client.register_system_shared_memory(f"bout_{tag}", f"/infermux_bout_{tag}", size)
        infer_input = module.InferInput("INPUT0", [1, 3], "BYTES")
        infer_input.set_shared_memory(f"bin_{tag}", size)
        output = module.InferRequestedOutput("OUTPUT0")
        output.set_shared_memory(f"bout_{tag}", size)
        client.infer("simple_identity", [infer_input], outputs=[output])
        got = shm.get_contents_as_numpy(handle_out, np.object_, [1, 3])
        np.testing.assert_array_equal(got, data)
        client.unregister_system_shared_memory()
        client.close()
    finally:
        shm.destroy_shared_memory_region(handle_in)
        shm.destroy_shared_memory_region(handle_out)


def _post(server: ServerProcess, path: str, body: Any) -> httpx.Response:
    return httpx.post(f"http://{server.url}{path}", json=body, timeout=30)


def test_bad_registrations_are_rejected(shm_server: ServerProcess, regions: dict[str, Any]) -> None:
    tag = regions["tag"]
    key = f"/infermux_in_{tag}"
    register = f"/v2/systemsharedmemory/region/r_{tag}/register"
    cases = [
        ({"key": "/no_such_key_here", "offset": 0, "byte_size": 8}, "unable to open"),
        ({"key": "/a/b", "offset": 0, "byte_size": 8}, "not a valid POSIX shm name"),
        ({"key": key, "offset": 120, "byte_size": 64}, "exceeds the 128 bytes"),
        ({"key": key, "offset": -1, "byte_size": 8}, "offset must be >= 0"),
        ({"key": key, "offset": 0, "byte_size": 0}, "byte_size > 0"),
        ({"key": key, "byte_size": "8"}, "'byte_size' must be an integer"),
    ]
    for body, fragment in cases:
        reply = _post(shm_server, register, body)
        assert reply.status_code == 400, reply.text
        assert fragment in reply.json()["error"]
    assert (
        _post(shm_server, register, {"key": key, "offset": 0, "byte_size": 128}).status_code == 200
    )
    again = _post(shm_server, register, {"key": key, "offset": 0, "byte_size": 128})
    assert again.status_code == 400
    assert "already registered" in again.json()["error"]
    missing = _post(shm_server, "/v2/systemsharedmemory/region/nope/unregister", None)
    assert missing.status_code == 404
    status = httpx.get(f"http://{shm_server.url}/v2/systemsharedmemory/region/r_{tag}/status")
    assert status.json() == [{"name": f"r_{tag}", "key": key, "offset": 0, "byte_size": 128}]
    assert _post(shm_server, "/v2/systemsharedmemory/unregister", None).status_code == 200


@pytest.mark.parametrize(
    ("input_params", "output_params", "fragment"),
    [
        (
            {"shared_memory_region": "ghost", "shared_memory_byte_size": 64},
            None,
            "'ghost' is not registered",
        ),
        (
            {
                "shared_memory_region": "R",
                "shared_memory_byte_size": 64,
                "shared_memory_offset": 100,
            },
            None,
            "outside region",
        ),
        ({"shared_memory_region": "R", "shared_memory_byte_size": 60}, None, "needs 64 bytes"),
        (
            {"shared_memory_region": "R", "shared_memory_byte_size": 64},
            {"shared_memory_region": "R", "shared_memory_byte_size": 8},
            "needs 64 bytes but its shared memory byte size is 8",
        ),
        ({"shared_memory_region": "R"}, None, "'shared_memory_byte_size' must be an integer"),
    ],
)
def test_bad_shared_memory_tensors_are_rejected(
    shm_server: ServerProcess,
    regions: dict[str, Any],
    input_params: dict[str, Any],
    output_params: dict[str, Any] | None,
    fragment: str,
) -> None:
    tag = regions["tag"]
    name = f"R{tag}"
    _post(
        shm_server,
        f"/v2/systemsharedmemory/region/{name}/register",
        {"key": f"/infermux_in_{tag}", "offset": 0, "byte_size": 128},
    )
    params = {k: (name if v == "R" else v) for k, v in input_params.items()}
    body: dict[str, Any] = {
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": params},
            {
                "name": "INPUT1",
                "datatype": "INT32",
                "shape": [1, 16],
                "data": B.reshape(-1).tolist(),
            },
        ]
    }
    if output_params:
        body["outputs"] = [
            {
                "name": "OUTPUT0",
                "parameters": {k: (name if v == "R" else v) for k, v in output_params.items()},
            }
        ]
    reply = _post(shm_server, "/v2/models/simple/infer", body)
    assert reply.status_code == 400, reply.text
    assert fragment in reply.json()["error"]
    _post(shm_server, f"/v2/systemsharedmemory/region/{name}/unregister", None)
    # still serving
    ok = _post(
        shm_server,
        "/v2/models/simple/infer",
        {
            "inputs": [
                {
                    "name": "INPUT0",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "data": A.reshape(-1).tolist(),
                },
                {
                    "name": "INPUT1",
                    "datatype": "INT32",
                    "shape": [1, 16],
                    "data": B.reshape(-1).tolist(),
                },
            ]
        },
    )
    assert ok.status_code == 200


def test_grpc_bad_region_is_invalid_argument(shm_server: ServerProcess) -> None:
    client = grpcclient.InferenceServerClient(shm_server.grpc_url)
    with pytest.raises(InferenceServerException, match="unable to open") as info:
        client.register_system_shared_memory("g", "/definitely_missing_key", 16)
    assert "INVALID_ARGUMENT" in str(info.value.status())
    client.close()


def test_shared_memory_needs_the_flag(examples_server: ServerProcess) -> None:
    reply = _post(
        examples_server,
        "/v2/systemsharedmemory/region/x/register",
        {"key": "/x", "offset": 0, "byte_size": 8},
    )
    assert reply.status_code == 501
    assert "--allow-client-shm" in reply.json()["error"]
    client = grpcclient.InferenceServerClient(examples_server.grpc_url)
    with pytest.raises(InferenceServerException, match="--allow-client-shm"):
        client.register_system_shared_memory("x", "/x", 8)
    client.close()
    extensions = httpx.get(f"http://{examples_server.url}/v2").json()["extensions"]
    assert "system_shared_memory" not in extensions
    assert "statistics" in extensions


def test_unix_sockets(tmp_path: Path) -> None:
    http_sock, grpc_sock = tmp_path / "http.sock", tmp_path / "grpc.sock"
    # A stale socket file left by a dead server must not stop a new one.
    import socket

    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(http_sock))
    stale.close()
    with start_server("--http-uds", str(http_sock), "--grpc-uds", str(grpc_sock)) as server:
        assert oct(http_sock.stat().st_mode & 0o777) == "0o660"
        assert oct(grpc_sock.stat().st_mode & 0o777) == "0o660"
        transport = httpx.HTTPTransport(uds=str(http_sock))
        with httpx.Client(transport=transport, base_url="http://infermux") as http:
            assert http.get("/v2/health/ready").status_code == 200
            reply = http.post(
                "/v2/models/identity_fp32/infer",
                json={
                    "inputs": [
                        {"name": "INPUT0", "datatype": "FP32", "shape": [1, 2], "data": [1.0, 2.0]}
                    ]
                },
            )
            assert reply.json()["outputs"][0]["data"] == [1.0, 2.0]
        client = grpcclient.InferenceServerClient(f"unix://{grpc_sock}")
        assert client.is_server_ready()
        data = np.ones((1, 4), dtype=np.float32)
        infer_input = grpcclient.InferInput("INPUT0", [1, 4], "FP32")
        infer_input.set_data_from_numpy(data)
        np.testing.assert_array_equal(
            client.infer("identity_fp32", [infer_input]).as_numpy("OUTPUT0"), data
        )
        client.close()
        # A second server cannot take over a socket that is in use.
        with pytest.raises(RuntimeError, match="in use by a running server"):
            start_server("--http-uds", str(http_sock), timeout=30)
        assert server.stop() == 0
    assert not http_sock.exists()
    assert not grpc_sock.exists()


def test_unix_socket_only(tmp_path: Path) -> None:
    sock = tmp_path / "only.sock"
    import subprocess
    import sys
    import time

    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "infermux",
            "serve",
            "--http-port",
            "-1",
            "--http-uds",
            str(sock),
            "--allow-grpc",
            "false",
            "--metrics-port",
            "0",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        while not sock.exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        with httpx.Client(
            transport=httpx.HTTPTransport(uds=str(sock)), base_url="http://x"
        ) as http:
            for _ in range(100):
                try:
                    if http.get("/v2/health/ready").status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                time.sleep(0.1)
            assert http.get("/v2/models/simple/ready").status_code == 200
    finally:
        process.terminate()
        _, err = process.communicate(timeout=30)
    assert process.returncode == 0, err
    assert "HTTP on unix:" in err
