"""The gRPC front end over the real DataPlane: the contract between the two, end to end in-process.

Covers what a double cannot: a real model answering, statistics counting it, and system shared
memory inputs and outputs (the codec's placeholder and empty raw entry) going through the plane.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from tritonclient.grpc import InferInput, InferRequestedOutput
from tritonclient.grpc.aio import InferenceServerClient

from infermux.backends import BackendRegistry
from infermux.dataplane import DataPlane
from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.frontends.grpc import GrpcServer
from infermux.repository import ControlMode, ModelRepository
from tests.support import write_model


@pytest.fixture
async def client(tmp_path: Path) -> AsyncIterator[Any]:
    write_model(tmp_path, "ident")
    repository = ModelRepository(
        [tmp_path], BackendRegistry(), control_mode=ControlMode.EXPLICIT, startup_models=["*"]
    )
    await repository.start()
    plane = DataPlane(repository, version="9.9", shared_memory=SharedMemoryRegistry(enabled=True))
    server = GrpcServer(plane, addresses=["127.0.0.1:0"], graceful_timeout=1)
    await server.start()
    try:
        async with InferenceServerClient(f"127.0.0.1:{server.bound_port}") as triton:
            yield triton
    finally:
        await server.stop()
        plane.close()
        await repository.close()


async def test_infer_and_statistics(client: Any) -> None:
    array = np.arange(6, dtype=np.float32).reshape(2, 3)
    item = InferInput("INPUT0", [2, 3], "FP32").set_data_from_numpy(array)
    result = await client.infer("ident", [item], request_id="x")
    assert result.as_numpy("OUTPUT0").tolist() == array.tolist()
    assert result.get_response().model_version == "1"
    (stats,) = (await client.get_inference_statistics("ident")).model_stats
    assert stats.inference_count == 2  # two rows
    assert stats.inference_stats.success.count == 1
    config = await client.get_model_config("ident")
    assert config.config.max_batch_size == 8


async def test_system_shared_memory_in_and_out(client: Any) -> None:
    array = np.array([[1.5, -2.0, 4.0]], dtype=np.float32)
    size = array.nbytes
    region = shared_memory.SharedMemory(create=True, size=2 * size)
    buf = region.buf
    assert buf is not None  # None only after close()
    try:
        buf[:size] = array.tobytes()
        await client.register_system_shared_memory("io", f"/{region.name}", 2 * size)
        item = InferInput("INPUT0", [1, 3], "FP32").set_shared_memory("io", size)
        wanted = InferRequestedOutput("OUTPUT0")
        wanted.set_shared_memory("io", size, offset=size)
        result = await client.infer("ident", [item], outputs=[wanted])
        output = result.get_output("OUTPUT0")
        assert not output.parameters  # the data went to the region; nothing is echoed
        assert list(output.shape) == [1, 3]
        assert result.get_response().raw_output_contents == [b""]
        written = np.frombuffer(bytes(buf[size : 2 * size]), dtype=np.float32)
        assert written.tolist() == array.reshape(-1).tolist()
        await client.unregister_system_shared_memory("io")
    finally:
        region.close()
        region.unlink()
