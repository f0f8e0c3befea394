"""Limits a client cannot push past, black-box: shared-memory regions registered at once
(``--max-shm-regions``); the refusal names the flag and the server keeps serving."""

from __future__ import annotations

import pytest
import tritonclient.http as httpclient
import tritonclient.utils.shared_memory as shm
from tritonclient.utils import InferenceServerException

from tests.support import start_server


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
