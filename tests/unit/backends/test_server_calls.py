"""The data plane's ``infer`` as models reach it (BLS): from a thread, from another loop, and
refused where waiting would deadlock or nothing is attached."""

from __future__ import annotations

import asyncio
import threading

import numpy as np
import pytest

from infermux.backends.server_calls import ServerCalls, current, set_current
from infermux.errors import UnavailableError
from infermux.types import InferRequest, InferResponse, Tensor


async def echo(request: InferRequest) -> InferResponse:
    await asyncio.sleep(0)
    return InferResponse(request.model_name, "1", list(request.inputs))


def a_request() -> InferRequest:
    data = np.ones(2, np.float32)
    return InferRequest("m", "", [Tensor("IN", "FP32", (2,), data)])


def test_a_thread_waits_for_the_answer_and_tensors_are_not_copied() -> None:
    async def main() -> None:
        calls = ServerCalls()
        calls.attach(echo)
        calls.serve_on(asyncio.get_running_loop())
        request = a_request()
        answer = await asyncio.to_thread(calls.infer, request)
        assert answer.outputs[0].data is request.inputs[0].data
        # From the loop itself it would wait for itself: refused, saying where to call from.
        with pytest.raises(UnavailableError, match="event loop"):
            calls.infer(request)
        # An async caller on the same loop just awaits.
        assert (await calls.infer_async(request)).model_name == "m"

    asyncio.run(main())


def test_nothing_attached_is_unavailable() -> None:
    with pytest.raises(UnavailableError, match="does not take requests from models"):
        ServerCalls().infer(a_request())


def test_the_current_server_is_per_thread() -> None:
    calls = ServerCalls()
    previous = set_current(calls)
    seen: list[ServerCalls | None] = []
    thread = threading.Thread(target=lambda: seen.append(current()))
    thread.start()
    thread.join()
    assert current() is calls
    assert seen == [None]
    set_current(previous)
