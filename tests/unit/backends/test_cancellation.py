"""A request given up while it runs reaches the model: a native generator is closed at its
``yield``, an async one is ``aclose``d, a Triton model's ``is_cancelled()`` turns true (on the
request and on its response sender), and a non-decoupled model's request is marked too. Each
model writes a marker file the test waits for."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from infermux.backends import ModelContext, ModelRequest
from infermux.backends.python import PythonBackend
from infermux.repository import load_model_config
from infermux.scheduling import DynamicBatcher
from tests.support import write_model

DECOUPLED = "model_transaction_policy { decoupled: true }\ndynamic_batching { }"

GENERATOR = """
import time

import numpy as np


class Model:
    def initialize(self, context):
        self.marker = context.model_path / "marker"

    def execute(self, requests):
        return [self.count(r) for r in requests]

    def count(self, request):
        i = 0
        try:
            while True:
                yield {"OUTPUT0": np.full((1, 1), i, np.float32)}
                i += 1
                time.sleep(0.01)
        except GeneratorExit:
            self.marker.write_text(f"closed after {i}")
            raise
"""

ASYNC_GENERATOR = """
import asyncio

import numpy as np


class Model:
    def initialize(self, context):
        self.marker = context.model_path / "marker"

    def execute(self, requests):
        return [self.count(r) for r in requests]

    async def count(self, request):
        i = 0
        try:
            while True:
                yield {"OUTPUT0": np.full((1, 1), i, np.float32)}
                i += 1
                await asyncio.sleep(0.01)
        finally:
            self.marker.write_text(f"closed after {i}")
"""

TRITON_SENDER = """
import threading
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = args["model_repository"] + "/marker"

    def execute(self, requests):
        for request in requests:
            threading.Thread(target=self.send, args=(request,), daemon=True).start()
        return None

    def send(self, request):
        sender = request.get_response_sender()
        i = 0
        while not sender.is_cancelled() and i < 3000:
            out = pb_utils.Tensor("OUTPUT0", np.full((1, 1), i, np.float32))
            sender.send(pb_utils.InferenceResponse([out]))
            i += 1
            time.sleep(0.01)
        seen = (sender.is_cancelled(), request.is_cancelled())
        out = pb_utils.Tensor("OUTPUT0", np.zeros((1, 1), np.float32))
        sender.send(pb_utils.InferenceResponse([out]))  # dropped, and not an error
        sender.send(flags=pb_utils.TRITONSERVER_RESPONSE_COMPLETE_FINAL)  # still accepted
        with open(self.marker, "w") as marker:
            marker.write(f"{seen[0]} {seen[1]}")
"""

TRITON_BLOCKING = """
import time

import numpy as np
import triton_python_backend_utils as pb_utils


class TritonPythonModel:
    def initialize(self, args):
        self.marker = args["model_repository"] + "/marker"

    def execute(self, requests):
        deadline = time.monotonic() + 30
        while not requests[0].is_cancelled() and time.monotonic() < deadline:
            time.sleep(0.01)
        with open(self.marker, "w") as marker:
            marker.write(str(requests[0].is_cancelled()))
        error = pb_utils.TritonError("cancelled", pb_utils.TritonError.CANCELLED)
        return [pb_utils.InferenceResponse(error=error) for _ in requests]
"""

NATIVE_BLOCKING = """
import time


class Model:
    def initialize(self, context):
        self.marker = context.model_path / "marker"

    def execute(self, requests):
        deadline = time.monotonic() + 30
        while not requests[0].cancelled and time.monotonic() < deadline:
            time.sleep(0.01)
        self.marker.write_text(str(requests[0].cancelled))
        return [{"OUTPUT0": r.inputs["INPUT0"]} for r in requests]
"""


def batcher_for(tmp_path: Path, source: str, extra: str) -> DynamicBatcher:
    model_dir = write_model(tmp_path, "m", source=source, extra=extra)
    config = load_model_config(model_dir)
    context = ModelContext(config, 1, model_dir, model_dir / "1", "m_0")
    return DynamicBatcher.for_model(config, "m", [PythonBackend().load(context)])


def request() -> ModelRequest:
    return ModelRequest({"INPUT0": np.zeros((1, 1), np.float32)}, ("OUTPUT0",))


async def marker(tmp_path: Path) -> str:
    path = tmp_path / "m" / "marker"
    for _ in range(200):
        if path.exists() and path.read_text():
            return path.read_text()
        await asyncio.sleep(0.05)
    raise AssertionError("the model never saw the cancellation")


@pytest.mark.parametrize("source", [GENERATOR, ASYNC_GENERATOR, TRITON_SENDER])
async def test_a_decoupled_model_sees_its_stream_given_up(tmp_path: Path, source: str) -> None:
    batcher = batcher_for(tmp_path, source, DECOUPLED)
    stream = batcher.submit_stream(request())
    first = [await anext(stream), await anext(stream)]
    assert [float(p.outputs[0].data[0, 0]) for p in first] == [0.0, 1.0]
    await stream.aclose()  # the reader is gone (a gRPC cancel, an HTTP disconnect)
    seen = await marker(tmp_path)
    if source is TRITON_SENDER:
        assert seen == "True True"  # the sender and the request both say so
    else:
        assert seen.startswith("closed after ")
    await batcher.close()


@pytest.mark.parametrize("source", [TRITON_BLOCKING, NATIVE_BLOCKING])
async def test_a_running_request_given_up_is_marked_cancelled(tmp_path: Path, source: str) -> None:
    batcher = batcher_for(tmp_path, source, "dynamic_batching { }")
    running = asyncio.ensure_future(batcher.submit(request()))
    await asyncio.sleep(0.2)  # taken by the instance, which polls is_cancelled()
    running.cancel()  # the client went away
    with pytest.raises(asyncio.CancelledError):
        await running  # completes once the batch ended: the model stopped early
    assert await marker(tmp_path) == "True"
    await batcher.close()
