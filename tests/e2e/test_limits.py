"""Limits a client cannot push past, black-box: shared-memory regions registered at once
(``--max-shm-regions``), elements per input (``--max-input-elements``, also for inputs read from
shared memory), the size of a BYTES element (``--max-bytes-element-size``) and of a gRPC message
(``--grpc-max-message-size``). Each refusal is a 400 / INVALID_ARGUMENT (RESOURCE_EXHAUSTED for
the message) naming the flag, and the server keeps serving."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server


def test_shared_memory_regions_are_bounded() -> None:
    handles = [
        shm.create_shared_memory_region(f"lim{i}", f"/infermux_lim{i}", 64) for i in range(3)
    ]
    try:
        with start_server("--allow-client-shm", "--max-shm-regions", "2") as server:
            with httpclient.InferenceServerClient(server.url) as client:
                client.register_system_shared_memory("lim0", "/infermux_lim0", 64)
                client.register_system_shared_memory("lim1", "/infermux_lim1", 64)
                with pytest.raises(InferenceServerException, match="--max-shm-regions") as info:
                    client.register_system_shared_memory("lim2", "/infermux_lim2", 64)
                assert info.value.status() == "400"
                client.unregister_system_shared_memory("lim0")
                client.register_system_shared_memory("lim2", "/infermux_lim2", 64)
                assert len(client.get_system_shared_memory_status()) == 2
                assert client.is_server_ready()
                client.unregister_system_shared_memory()
            assert server.stop() == 0
    finally:
        for handle in handles:
            shm.destroy_shared_memory_region(handle)


@pytest.fixture(scope="module")
def limited() -> Iterator[ServerProcess]:
    with start_server(
        "--allow-client-shm", "--max-input-elements", "64", "--max-bytes-element-size", "10",
        "--grpc-max-message-size", "65536",
    ) as server:  # fmt: skip
        yield server
        assert server.stop() == 0


def fp32(module: object, elements: int) -> list[object]:
    tensor = module.InferInput("INPUT0", [1, elements], "FP32")  # type: ignore[attr-defined]
    tensor.set_data_from_numpy(np.ones((1, elements), np.float32))
    return [tensor]


def test_elements_per_input_are_bounded_over_http_and_grpc(limited: ServerProcess) -> None:
    http = httpclient.InferenceServerClient(limited.url)
    grpc = grpcclient.InferenceServerClient(limited.grpc_url)
    assert http.infer("identity_fp32", fp32(httpclient, 64)).as_numpy("OUTPUT0").size == 64
    with pytest.raises(InferenceServerException, match="--max-input-elements") as info:
        http.infer("identity_fp32", fp32(httpclient, 65))
    assert info.value.status() == "400"
    assert "input 'INPUT0' for model 'identity_fp32' has 65 elements" in str(info.value)
    with pytest.raises(InferenceServerException, match="--max-input-elements") as info:
        grpc.infer("identity_fp32", fp32(grpcclient, 65))
    assert info.value.status() == "StatusCode.INVALID_ARGUMENT"
    assert grpc.infer("identity_fp32", fp32(grpcclient, 64)).as_numpy("OUTPUT0").size == 64
    http.close()  # a client left open is a socket collected unclosed later: a ResourceWarning
    grpc.close()


def test_inputs_in_shared_memory_are_bounded_too(limited: ServerProcess) -> None:
    handle = shm.create_shared_memory_region("big", "/infermux_lim_big", 4 * 100)
    try:
        shm.set_shared_memory_region(handle, [np.ones(100, np.float32)])
        client = httpclient.InferenceServerClient(limited.url)
        client.register_system_shared_memory("big", "/infermux_lim_big", 400)
        tensor = httpclient.InferInput("INPUT0", [1, 100], "FP32")
        tensor.set_shared_memory("big", 400)
        with pytest.raises(InferenceServerException, match="--max-input-elements") as info:
            client.infer("identity_fp32", [tensor])
        assert info.value.status() == "400"
        client.unregister_system_shared_memory("big")
        client.close()
    finally:
        shm.destroy_shared_memory_region(handle)


def test_bytes_elements_are_bounded(limited: ServerProcess) -> None:
    client = httpclient.InferenceServerClient(limited.url)

    def strings(longest: int) -> list[httpclient.InferInput]:
        tensor = httpclient.InferInput("INPUT0", [1, 16], "BYTES")
        tensor.set_data_from_numpy(np.array([[b"x" * longest] + [b"1"] * 15], dtype=np.object_))
        return [tensor]

    assert client.infer("simple_identity", strings(10)).as_numpy("OUTPUT0")[0, 0] == b"x" * 10
    with pytest.raises(InferenceServerException, match="--max-bytes-element-size") as info:
        client.infer("simple_identity", strings(11))
    assert info.value.status() == "400"
    assert "has a BYTES element of 11 bytes" in str(info.value)
    client.close()


def test_grpc_messages_are_bounded(limited: ServerProcess) -> None:
    grpc = grpcclient.InferenceServerClient(limited.grpc_url)
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "BYTES")
    tensor.set_data_from_numpy(np.array([[b"x" * 70_000]], dtype=np.object_))
    with pytest.raises(InferenceServerException) as info:
        grpc.infer("simple_identity", [tensor])
    assert info.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    assert grpc.is_server_ready()
