"""Micro-batches: a front end sends alike requests to one model as one frame; the executor runs
them as one request and each caller gets its own rows, errors and statistics, as if sent alone.

Both ends of a real channel run on this test's event loop (as in test_channel_server.py), over
a TorchScript model on the CPU (a backend that stacks its batches) and a Python model (which is
given each request, so its micro-batches are refused and sent one by one).
"""

from __future__ import annotations

import asyncio
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from multiprocessing import shared_memory
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from infermux.dataplane import DataPlane
from infermux.errors import ErrorCode, InfermuxError
from infermux.transport.executor_client import RemoteExecutor
from infermux.transport.grouping import group_key
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import (
    SHM_BYTE_SIZE,
    SHM_OFFSET,
    SHM_REGION,
    InferRequest,
    RequestedOutput,
    ServerMetadata,
    Tensor,
)
from tests.support import IDENTITY_MODEL, write_model
from tests.unit.transport.ends import connected

METADATA = ServerMetadata("infermux", "test", ())


def write_plus_one(repo: Path) -> None:
    class PlusOne(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return x + 1.0

    model_dir = repo / "plus_one"
    (model_dir / "1").mkdir(parents=True)
    (model_dir / "config.pbtxt").write_text(
        'name: "plus_one"\nplatform: "pytorch_libtorch"\nmax_batch_size: 64\n'
        'input [ { name: "INPUT__0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        'output [ { name: "OUTPUT__0", data_type: TYPE_FP32, dims: [ 4 ] } ]\n'
        "dynamic_batching { }\n"
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        scripted: torch.jit.ScriptModule = torch.jit.script(PlusOne())
        scripted.save(str(model_dir / "1" / "model.pt"))


class Ends:
    def __init__(self, plane: DataPlane, remote: RemoteDataPlane) -> None:
        self.plane, self.remote = plane, remote
        self.groups: list[list[int]] = []  # the rows of every micro-batch the executor ran
        self.apart: list[dict[str, bool]] = []
        run = plane.infer_many

        async def counted(request: InferRequest, rows: Any, **kwargs: bool) -> Any:
            self.groups.append(list(rows))
            self.apart.append(kwargs)
            return await run(request, rows, **kwargs)

        plane.infer_many = counted  # type: ignore[method-assign]

    @property
    def executor(self) -> RemoteExecutor:
        return self.remote._executors[0]

    async def stats(self, model: str) -> Any:
        (stats,) = await self.plane.model_statistics(model)
        return stats


@pytest.fixture
def segment() -> Iterator[shared_memory.SharedMemory]:
    """4 KiB of client shared memory: input regions in the first half, outputs in the second."""
    block = shared_memory.SharedMemory(name=f"imx_{uuid.uuid4().hex[:8]}", create=True, size=4096)
    yield block
    block.close()
    block.unlink()


SLOW_MODEL = "import time\n" + IDENTITY_MODEL.replace(
    "        return [", "        time.sleep(0.3)\n        return ["
)


@pytest.fixture
async def ends(tmp_path: Path) -> AsyncIterator[Ends]:
    write_plus_one(tmp_path / "repo")
    write_model(tmp_path / "repo", "identity", dims="[ 4 ]")
    write_model(tmp_path / "repo", "slow", dims="[ 4 ]", source=SLOW_MODEL, extra="")
    async with connected(tmp_path / "repo", tmp_path) as (plane, remote):
        yield Ends(plane, remote)


def request(model: str, value: float, rows: int = 1, **kwargs: Any) -> InferRequest:
    name = "INPUT__0" if model == "plus_one" else "INPUT0"
    data = np.full((rows, 4), value, dtype=np.float32)
    return InferRequest(model, "", [Tensor(name, "FP32", data.shape, data)], **kwargs)


def values(response: Any) -> list[list[float]]:
    return np.asarray(response.outputs[0].data).tolist()  # type: ignore[no-any-return]


async def test_alike_requests_travel_as_one_micro_batch_and_each_gets_its_rows(
    ends: Ends,
) -> None:
    wanted = [(float(i), 1 + i % 3) for i in range(60)]
    answers = await asyncio.gather(
        *(ends.remote.infer(request("plus_one", v, rows)) for v, rows in wanted)
    )
    for (value, rows), answer in zip(wanted, answers, strict=True):
        assert values(answer) == [[value + 1] * 4] * rows
        assert answer.outputs[0].shape == (rows, 4)
    assert ends.groups, "no micro-batch reached the executor"
    assert sum(len(g) for g in ends.groups) == 60  # every request travelled in one
    assert max(len(g) for g in ends.groups) > 1
    stats = await ends.stats("plus_one")
    assert stats.inference_stats["success"].count == 60  # each request counted
    assert stats.inference_count == sum(rows for _, rows in wanted)


async def test_while_the_executor_is_busy_a_micro_batch_waits_for_an_answer_and_grows(
    ends: Ends, monkeypatch: pytest.MonkeyPatch
) -> None:
    # gRPC hands each call to the loop in an iteration of its own: requests arriving one per
    # iteration met no one after one iteration, so under load they travelled in micro-batches
    # of 1 or 2. With two requests of this front end at the executor, the batch now waits for an
    # answer (the bound is made long here, so only an answer can release it).
    monkeypatch.setattr("infermux.transport.micro_batcher.HOLD_SECONDS", 30.0)
    alone: dict[str, Any] = {"parameters": {"tag": 1}}  # its own parameter: each goes alone
    busy = [asyncio.ensure_future(ends.remote.infer(request("slow", v, **alone))) for v in (1, 2)]
    await asyncio.sleep(0.05)  # both with the executor (the slow model runs for 0.3 s)
    assert ends.executor.in_flight() >= 2
    started = asyncio.get_running_loop().time()
    tasks = []
    for i in range(20):
        tasks.append(asyncio.ensure_future(ends.remote.infer(request("plus_one", float(i)))))
        await asyncio.sleep(0)  # one request per loop iteration
    answers = await asyncio.gather(*tasks)
    assert [values(a)[0][0] for a in answers] == [i + 1.0 for i in range(20)]
    assert ends.groups == [[1] * 20]  # one frame, not twenty
    assert asyncio.get_running_loop().time() - started < 10  # released by the answer
    assert [values(a)[0][0] for a in await asyncio.gather(*busy)] == [1.0, 2.0]


async def test_a_lone_request_is_sent_as_it_always_was(ends: Ends) -> None:
    answer = await ends.remote.infer(request("plus_one", 2.0))
    assert values(answer) == [[3.0] * 4]
    assert ends.groups == []


async def test_a_model_given_each_request_refuses_micro_batches_and_its_requests_go_alone(
    ends: Ends,
) -> None:
    answers = await asyncio.gather(*(ends.remote.infer(request("identity", i)) for i in range(8)))
    assert [values(a)[0][0] for a in answers] == list(range(8))
    assert len(ends.groups) == 1  # refused once ...
    assert ends.executor._batches._alone(("identity", ("bytes", "bytes")))  # ... then one by one
    await asyncio.gather(*(ends.remote.infer(request("identity", i)) for i in range(8)))
    assert len(ends.groups) == 1
    stats = await ends.stats("identity")
    assert stats.inference_stats["success"].count == 16  # the refused batch never ran


async def test_an_error_of_the_micro_batch_is_every_members_and_counted_for_each(
    ends: Ends,
) -> None:
    def bad(value: float) -> InferRequest:
        data = np.zeros((1, 3), np.float32)  # the model wants 4 values per row
        return InferRequest("plus_one", "", [Tensor("INPUT__0", "FP32", data.shape, data)])

    results = await asyncio.gather(
        *(ends.remote.infer(bad(i)) for i in range(5)), return_exceptions=True
    )
    assert all(isinstance(r, InfermuxError) for r in results)
    assert {r.code for r in results if isinstance(r, InfermuxError)} == {ErrorCode.INVALID_ARG}
    stats = await ends.stats("plus_one")
    assert stats.inference_stats["fail"].count == 5


async def test_callers_that_give_up_before_the_batch_leaves_are_left_out(ends: Ends) -> None:
    tasks = [asyncio.ensure_future(ends.remote.infer(request("plus_one", i))) for i in range(6)]
    await asyncio.sleep(0)  # every request joined the open micro-batch
    for task in tasks[:3]:
        task.cancel()
    done = await asyncio.gather(*tasks, return_exceptions=True)
    assert all(isinstance(d, asyncio.CancelledError) for d in done[:3])
    assert [values(d)[0][0] for d in done[3:]] == [4.0, 5.0, 6.0]
    assert ends.groups == [[1, 1, 1]]


def test_only_requests_with_nothing_of_their_own_to_say_are_grouped() -> None:
    plain = request("plus_one", 1.0)
    assert group_key(plain) == group_key(request("plus_one", 5.0))
    assert group_key(plain) != group_key(request("identity", 1.0))
    assert group_key(request("plus_one", 1.0, parameters={"priority": 1})) is None
    # Triton's gRPC clients (perf_analyzer too) send this with every request: it changes nothing.
    inert = request("plus_one", 1.0, parameters={"triton_enable_empty_final_response": True})
    assert group_key(inert) is not None
    assert group_key(inert) == group_key(
        request("plus_one", 2.0, parameters={"triton_enable_empty_final_response": True})
    )
    assert group_key(inert) != group_key(plain)
    assert group_key(request("plus_one", 1.0, deadline_ns=5)) is None
    assert group_key(request("plus_one", 1.0, trace_context={"traceparent": "x"})) is None
    shm = request("plus_one", 1.0)
    shm.inputs[0].parameters = {SHM_REGION: "r", SHM_BYTE_SIZE: 16}
    other = request("plus_one", 1.0)
    other.inputs[0].parameters = {SHM_REGION: "s", SHM_BYTE_SIZE: 16}
    shm_key = group_key(shm)
    assert shm_key is not None
    assert shm_key == group_key(other)  # regions are per request: listed, not compared
    assert shm_key != group_key(plain)
    mixed = InferRequest(
        "m",
        "",
        [shm.inputs[0], Tensor("B", "FP32", (1, 4), np.zeros((1, 4), np.float32))],
    )
    assert group_key(mixed) is None  # some inputs in shared memory, some not
    wants = request("plus_one", 1.0, outputs=[RequestedOutput("OUTPUT__0")])
    assert group_key(wants) != group_key(plain)
    text = InferRequest("t", "", [Tensor("X", "BYTES", (1,), np.array([b"a"], dtype=np.object_))])
    assert group_key(text) is None


def floats(segment: shared_memory.SharedMemory) -> np.ndarray:
    buf = segment.buf
    assert buf is not None
    return np.frombuffer(buf, np.float32)


def in_shm(region: str, index: int) -> dict[str, Any]:
    return {SHM_REGION: region, SHM_BYTE_SIZE: 16, SHM_OFFSET: index * 16}


@pytest.mark.parametrize("reader", ["front end", "executor"])
async def test_shared_memory_requests_travel_together_each_read_and_written_in_its_region(
    ends: Ends, segment: shared_memory.SharedMemory, reader: str
) -> None:
    # Registered through the front end, it reads the regions itself (transport/regions.py) and
    # the executor sees stacked rows; registered elsewhere, the front end does not know them yet
    # and the executor reads each request's regions.
    registrar = ends.remote if reader == "front end" else ends.plane
    await registrar.shm_register("in", segment.name, 0, 1024)
    await registrar.shm_register("out", segment.name, 1024, 1024)
    data = floats(segment)
    for i in range(12):
        data[i * 4 : i * 4 + 4] = i
    requests = []
    for i in range(12):
        r = request("plus_one", 0.0, outputs=[RequestedOutput("OUTPUT__0", in_shm("out", i))])
        r.inputs[0].parameters = in_shm("in", i)
        requests.append(r)
    answers = await asyncio.gather(*(ends.remote.infer(r) for r in requests))
    for i, answer in enumerate(answers):
        (out,) = answer.outputs
        assert out.parameters[SHM_REGION] == "out"
        assert out.parameters[SHM_OFFSET] == i * 16
        assert data[256 + i * 4 : 256 + i * 4 + 4].tolist() == [i + 1.0] * 4
    assert max(len(g) for g in ends.groups) > 1
    apart = reader == "executor"
    assert {tuple(sorted(k.items())) for k in ends.apart} == {
        (("inputs_apart", apart), ("outputs_apart", apart))
    }
    stats = await ends.stats("plus_one")
    assert stats.inference_stats["success"].count == 12


async def test_one_bad_shared_memory_request_fails_alone(
    ends: Ends, segment: shared_memory.SharedMemory
) -> None:
    await ends.remote.shm_register("in", segment.name, 0, 1024)
    requests = []
    for i in range(6):
        r = request("plus_one", 0.0)
        r.inputs[0].parameters = in_shm("in", i)
        requests.append(r)
    requests[2].inputs[0].parameters[SHM_BYTE_SIZE] = 12  # the model's rows need 16 bytes
    results = await asyncio.gather(
        *(ends.remote.infer(r) for r in requests), return_exceptions=True
    )
    assert isinstance(results[2], InfermuxError)
    assert results[2].code is ErrorCode.INVALID_ARG
    assert "byte size is 12" in results[2].message
    assert all(not isinstance(r, BaseException) for i, r in enumerate(results) if i != 2)
    stats = await ends.stats("plus_one")
    assert stats.inference_stats["success"].count == 5
    assert stats.inference_stats["fail"].count == 1
