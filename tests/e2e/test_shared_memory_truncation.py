"""A client that shrinks a registered shm object cannot crash the server.

The attack: create ``/dev/shm/x``, ``ftruncate`` it to 4096, register it, ``ftruncate`` it to
0, infer with an input in it. The server used to touch the mapping past the object's end and die
of SIGBUS (status 135 with one process; the executor, with every registration, with
``--frontends 2``). Now the request is refused (400 / INVALID_ARGUMENT naming the region) and the
server, and every other registration, keeps serving.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from typing import Any

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import start_server

pytestmark = pytest.mark.e2e

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)


@pytest.fixture
def objects() -> Iterator[dict[str, Any]]:
    """A 4096-byte object to shrink, and a healthy pair (inputs A, B; room for two outputs)."""
    tag = uuid.uuid4().hex[:8]
    keys = {role: f"/infermux_{role}_{tag}" for role in ("victim", "in", "out")}
    sizes = {"victim": 4096, "in": 128, "out": 128}
    handles = {
        role: shm.create_shared_memory_region(f"{role}_{tag}", key, sizes[role])
        for role, key in keys.items()
    }
    shm.set_shared_memory_region(handles["victim"], [A, B])
    shm.set_shared_memory_region(handles["in"], [A, B])
    yield {"tag": tag, "keys": keys, "sizes": sizes, "handles": handles}
    for handle in handles.values():
        shm.destroy_shared_memory_region(handle)


def _inputs(module: Any, region: str) -> list[Any]:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(region, 64)
    inputs[1].set_shared_memory(region, 64, offset=64)
    return inputs


def _outputs(module: Any, region: str) -> list[Any]:
    outputs = [module.InferRequestedOutput("OUTPUT0"), module.InferRequestedOutput("OUTPUT1")]
    outputs[0].set_shared_memory(region, 64)
    outputs[1].set_shared_memory(region, 64, offset=64)
    return outputs


def _refused(client: Any, module: Any, inputs: list[Any], outputs: list[Any] | None) -> str:
    """The infer call's error message, once it is known to be 400 / INVALID_ARGUMENT."""
    with pytest.raises(InferenceServerException) as info:
        client.infer("simple", inputs, outputs=outputs)
    expected = "400" if module is httpclient else str(grpc.StatusCode.INVALID_ARGUMENT)
    assert info.value.status() == expected, info.value
    return str(info.value)


@pytest.mark.parametrize("frontends", ["1", "2"])
def test_a_truncated_region_is_refused_and_the_server_keeps_serving(
    frontends: str, objects: dict[str, Any]
) -> None:
    tag, keys, sizes = objects["tag"], objects["keys"], objects["sizes"]
    victim, healthy_in, healthy_out = f"victim_{tag}", f"in_{tag}", f"out_{tag}"
    with start_server("--allow-client-shm", "--frontends", frontends) as server:
        children = server.children()
        clients: dict[Any, Any] = {
            httpclient: httpclient.InferenceServerClient(server.url),
            grpcclient: grpcclient.InferenceServerClient(server.grpc_url),
        }
        http = clients[httpclient]
        for role, key in keys.items():
            http.register_system_shared_memory(f"{role}_{tag}", key, sizes[role])
        assert http.infer("simple", _inputs(httpclient, victim)).as_numpy("OUTPUT0") is not None
        os.truncate(f"/dev/shm{keys['victim']}", 0)
        expected = f"shared memory region '{victim}' was truncated to 0 bytes"
        for module, client in clients.items():
            # An input in the shrunk object, then an output into it.
            assert expected in _refused(client, module, _inputs(module, victim), None)
            outputs = _outputs(module, victim)
            assert expected in _refused(client, module, _inputs(module, healthy_in), outputs)
        # Still the same processes, every registration kept, the healthy regions serving.
        assert server.process.poll() is None
        assert server.children() == children
        assert {r["name"] for r in http.get_system_shared_memory_status()} == {
            victim,
            healthy_in,
            healthy_out,
        }
        for module, client in clients.items():
            client.infer(
                "simple", _inputs(module, healthy_in), outputs=_outputs(module, healthy_out)
            )
            total = shm.get_contents_as_numpy(objects["handles"]["out"], np.int32, [1, 16])
            np.testing.assert_array_equal(total, A + B)
        # Grown back, the region serves again.
        os.truncate(f"/dev/shm{keys['victim']}", sizes["victim"])
        http.infer("simple", _inputs(httpclient, victim))
        http.unregister_system_shared_memory()
        for client in clients.values():
            client.close()
        assert server.stop() == 0
