"""Where a front end over several executors sends a stream: to one hosting executor, the least
busy, for the whole stream; once more elsewhere when that executor failed before any response
was passed on (nothing ran), never after. Stand-in executors replace the channels."""

from __future__ import annotations

from collections.abc import AsyncGenerator
from typing import cast

import pytest

from infermux.errors import InfermuxError, InvalidArgumentError, UnavailableError
from infermux.transport.executor_client import RemoteExecutor
from infermux.transport.hosts import Hosts
from infermux.transport.remote_plane import RemoteDataPlane
from infermux.types import InferRequest, InferResponse, RepositoryIndexEntry, ServerMetadata


class Stub:
    """An attached executor hosting model ``m`` whose streams answer ``script``: a count of
    responses, then the error raised (or None)."""

    attached = True
    why_detached = ""
    channel = "stub"

    def __init__(self, name: str, sends: int = 2, error: InfermuxError | None = None) -> None:
        self.name, self.sends, self.error = name, sends, error
        self.streams = 0
        self.closed = 0

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        return [RepositoryIndexEntry("m", "1", "READY", "")]

    async def infer_stream(self, request: InferRequest) -> AsyncGenerator[InferResponse]:
        self.streams += 1
        try:
            for i in range(self.sends):
                yield InferResponse("m", "1", [], self.name, final=False, parameters={"i": i})
            if self.error is not None:
                raise self.error
            yield InferResponse("m", "1", [], self.name, flag_only=True)
        finally:
            self.closed += 1


def plane(*stubs: Stub) -> RemoteDataPlane:
    remote = RemoteDataPlane(ServerMetadata("infermux", "test", ()), executors=len(stubs))
    remote._executors = cast(list[RemoteExecutor], list(stubs))
    remote._hosts = Hosts(remote._executors)
    return remote


REQUEST = InferRequest("m", "", [])


async def read(remote: RemoteDataPlane, into: list[InferResponse]) -> None:
    async for response in remote.infer_stream(REQUEST):
        into.append(response)


async def test_a_stream_stays_on_the_executor_it_started_on() -> None:
    a, b = Stub("a", sends=3), Stub("b", sends=3)
    remote = plane(a, b)
    responses = [r async for r in remote.infer_stream(REQUEST)]
    assert len({r.id for r in responses}) == 1
    assert [r.final for r in responses] == [False] * 3 + [True]
    assert a.streams + b.streams == 1


async def test_concurrent_streams_go_to_the_least_busy_executor() -> None:
    a, b = Stub("a"), Stub("b")
    remote = plane(a, b)
    first = remote.infer_stream(REQUEST)
    second = remote.infer_stream(REQUEST)
    one, two = await anext(first), await anext(second)
    assert {one.id, two.id} == {"a", "b"}  # the first one's executor was busy
    await first.aclose()  # type: ignore[attr-defined]
    await second.aclose()  # type: ignore[attr-defined]
    assert (a.closed, b.closed) == (1, 1)  # closing the stream closes the executor's
    assert remote._hosts._busy == {a: 0, b: 0}  # type: ignore[comparison-overlap]


async def test_a_stream_that_failed_before_any_response_is_sent_elsewhere() -> None:
    gone = Stub("gone", sends=0, error=UnavailableError("the executor exited"))
    other = Stub("other")
    remote = plane(gone, other)
    for _ in range(2):  # whichever is picked first
        responses = [r async for r in remote.infer_stream(REQUEST)]
        assert {r.id for r in responses} == {"other"}


async def test_a_stream_that_failed_after_a_response_is_not_retried() -> None:
    half = Stub("half", sends=1, error=UnavailableError("the executor exited"))
    remote = plane(half, Stub("other", sends=0, error=UnavailableError("no")))
    remote._hosts._turn = -1  # ties go to the first executor: ``half``
    got: list[InferResponse] = []
    with pytest.raises(InfermuxError, match="the executor exited"):
        await read(remote, got)
    assert [r.id for r in got] == ["half"]


async def test_what_the_request_caused_is_not_retried() -> None:
    bad = Stub("bad", sends=0, error=InvalidArgumentError("input 'IN' is wrong"))
    remote = plane(bad, bad)
    with pytest.raises(InfermuxError, match="input 'IN' is wrong"):
        await read(remote, [])
    assert bad.streams == 1
