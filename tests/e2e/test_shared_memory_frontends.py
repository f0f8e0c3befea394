"""System shared memory with several front-end processes, each reading the regions itself
(transport/regions.py): whichever front end a client's connection lands on, it reads what the
executor has registered now, never a region unregistered or registered again meanwhile."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import ServerProcess, start_server

pytestmark = pytest.mark.e2e

A = np.arange(16, dtype=np.int32).reshape(1, 16)
B = np.full((1, 16), 3, dtype=np.int32)
CONNECTIONS = 6  # per protocol: SO_REUSEPORT spreads them over both front ends


@pytest.fixture(scope="module")
def server() -> Iterator[ServerProcess]:
    with start_server("--allow-client-shm", "--frontends", "2") as running:
        yield running
        assert running.stop() == 0


@pytest.fixture
def objects() -> Iterator[dict[str, Any]]:
    tag = uuid.uuid4().hex[:8]
    made = {
        "first": shm.create_shared_memory_region(f"f_{tag}", f"/imx_first_{tag}", 128),
        "second": shm.create_shared_memory_region(f"s_{tag}", f"/imx_second_{tag}", 128),
        "out": shm.create_shared_memory_region(f"o_{tag}", f"/imx_out_{tag}", 64 * CONNECTIONS * 2),
    }
    shm.set_shared_memory_region(made["first"], [A, B])
    shm.set_shared_memory_region(made["second"], [A * 10, B * 10])
    yield {"tag": tag, **made}
    for handle in made.values():
        shm.destroy_shared_memory_region(handle)


def _infer(client: Any, module: Any, tag: str, slot: int) -> None:
    inputs = [
        module.InferInput("INPUT0", [1, 16], "INT32"),
        module.InferInput("INPUT1", [1, 16], "INT32"),
    ]
    inputs[0].set_shared_memory(f"in_{tag}", 64)
    inputs[1].set_shared_memory(f"in_{tag}", 64, offset=64)
    output = module.InferRequestedOutput("OUTPUT0")
    output.set_shared_memory(f"out_{tag}", 64, offset=64 * slot)
    client.infer("simple", inputs, outputs=[output])


def test_every_front_end_follows_registrations_made_through_any_other(
    server: ServerProcess, objects: dict[str, Any]
) -> None:
    tag = objects["tag"]
    clients = [
        (module, slot, module.InferenceServerClient(url))
        for slot, (module, url) in enumerate(
            [(grpcclient, server.grpc_url)] * CONNECTIONS + [(httpclient, server.url)] * CONNECTIONS
        )
    ]
    registrar = clients[0][2]
    registrar.register_system_shared_memory(f"out_{tag}", f"/imx_out_{tag}", 64 * len(clients))

    def results() -> list[list[int]]:
        sums = []
        for module, slot, client in clients:
            for _ in range(3):  # the first may meet a front end that does not know the region
                _infer(client, module, tag, slot)
            got = shm.get_contents_as_numpy(objects["out"], np.int32, [1, 16], offset=64 * slot)
            sums.append(got.reshape(-1).tolist())
        return sums

    registrar.register_system_shared_memory(f"in_{tag}", f"/imx_first_{tag}", 128)
    assert results() == [(A + B).reshape(-1).tolist()] * len(clients)

    clients[-1][2].unregister_system_shared_memory(f"in_{tag}")  # through another front end
    for module, slot, client in clients:
        with pytest.raises(InferenceServerException, match="is not registered"):
            _infer(client, module, tag, slot)

    clients[1][2].register_system_shared_memory(f"in_{tag}", f"/imx_second_{tag}", 128)
    assert results() == [(A * 10 + B * 10).reshape(-1).tolist()] * len(clients)
    registrar.unregister_system_shared_memory()
    for _, _, client in clients:
        client.close()
