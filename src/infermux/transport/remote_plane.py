"""The data plane of a front-end process: the executor processes behind it, seen as one.

With one executor (the default) every operation goes straight to it. With several
(``--executors N``, one per GPU or group of GPUs, ``repository/placement.py``), each holds the
instances of its own devices, so a model may be hosted by one executor or by several:

- **inference** goes to an executor that hosts the model, the one with the fewest requests
  in flight from this front end (``hosts.py``); which executors host what is read from their
  repository indexes when first needed and again whenever it may have changed (an attach or
  detach, a load or unload through this front end, a model it has not heard of, an executor
  answering that it no longer hosts the model, which is then retried once elsewhere: that
  executor ran nothing);
- **statistics** and the **repository index** are merged over every executor (counts and
  durations summed per model version, the most-ready state of each version);
- **load / unload**, **traffic policy** changes and **shared-memory registration** go to every
  executor (each one decides what it hosts; each maps the client's regions itself), and so do
  **trace settings** (a model's to its hosts), since spans are made in the executors;
- **readiness** needs every executor attached and ready, each answering within the readiness
  bound (``--executor-ready-timeout-ms``);
- **cancellation** follows the request: the executor it was sent to is told
  (``executor_client.py``);
- a **stream** (a decoupled model's responses) goes to one hosting executor, the least busy,
  and stays there; it is retried elsewhere as a request is, and only while none of its
  responses has been passed on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Iterable, Mapping
from typing import Any, TypeVar

from infermux.errors import ErrorCode, FailureReason, InfermuxError
from infermux.ipc import ChannelSpec
from infermux.model_config import ModelConfig
from infermux.observability.logs import checked_log_changes, log_settings, update_log_settings
from infermux.observability.trace_settings import checked_trace_changes
from infermux.routing.router import TrafficReport
from infermux.settings import DEFAULT_CHANNEL_POLL_US
from infermux.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    ServerMetadata,
    SharedMemoryRegion,
)

from .executor_client import RemoteExecutor
from .hosts import Hosts
from .merging import merge_index, merge_statistics

T = TypeVar("T")

REJECTED, BACKEND = FailureReason.REJECTED, FailureReason.BACKEND
_RETRIED = (ErrorCode.NOT_FOUND, ErrorCode.UNAVAILABLE)


class RemoteDataPlane:
    """Implements :class:`~infermux.dataplane.operations.Operations` over ``executors``
    executor processes."""

    def __init__(
        self,
        metadata: ServerMetadata,
        executors: int = 1,
        *,
        ready_timeout_s: float = 1.0,
        poll_seconds: float = DEFAULT_CHANNEL_POLL_US / 1e6,
    ) -> None:
        self._metadata = metadata
        self._executors = [
            RemoteExecutor(metadata, ready_timeout_s=ready_timeout_s, poll_seconds=poll_seconds)
            for _ in range(executors)
        ]
        self._hosts = Hosts(self._executors)
        self._shutting_down = False

    # -- channels ---------------------------------------------------------------------------------

    @property
    def attached(self) -> bool:
        return all(e.attached for e in self._executors)

    def attach(self, spec: ChannelSpec, executor: int = 0) -> None:
        """Forward to executor ``executor`` over the channel ``spec`` (replacing its previous)."""
        self._executors[executor].attach(spec)
        self._hosts.forget()
        if len(self._executors) > 1:
            # Learn who hosts what now, not at the first request: should an executor die
            # before any request came, its models are still known to be its (503, not 404).
            with contextlib.suppress(RuntimeError):  # no running loop (tests attach outside one)
                asyncio.get_running_loop().call_soon(self._hosts.learn_soon)

    def detach(self, why: str, channel: str = "") -> None:
        """Stop using the executor on ``channel`` (every executor when ""): its requests in
        flight fail UNAVAILABLE with ``why``, other executors serve on."""
        for executor in self._executors:
            if not channel or executor.channel == channel:
                executor.detach(why)
        self._hosts.forget()

    def begin_shutdown(self) -> None:
        self._shutting_down = True
        for executor in self._executors:
            executor.begin_shutdown()

    # -- inference --------------------------------------------------------------------------------

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        if len(self._executors) == 1:
            async with contextlib.aclosing(self._executors[0].infer_stream(request)) as only:
                async for response in only:
                    yield response
            return
        chosen = await self._hosts.least_busy_of(request.model_name)
        sent = False
        try:
            async with contextlib.aclosing(self._streamed(chosen, request)) as responses:
                async for response in responses:
                    sent = True
                    yield response
            return
        except InfermuxError as exc:
            if sent or not _retried(exc):  # once a response left, the stream is the client's
                raise
            retry = exc
        other = await self._hosts.other(request.model_name, chosen, retry)
        async with contextlib.aclosing(self._streamed(other, request)) as responses:
            async for response in responses:
                yield response

    async def _streamed(
        self, executor: RemoteExecutor, request: InferRequest
    ) -> AsyncGenerator[InferResponse]:
        with self._hosts.sending(executor):  # for as long as it streams
            async with contextlib.aclosing(executor.infer_stream(request)) as responses:
                async for response in responses:
                    yield response

    async def infer(self, request: InferRequest) -> InferResponse:
        if len(self._executors) == 1:
            return await self._executors[0].infer(request)
        chosen = await self._hosts.least_busy_of(request.model_name)
        try:
            return await self._send(chosen, request)
        except InfermuxError as exc:
            if not _retried(exc):
                raise
            retry = exc
        return await self._send(await self._hosts.other(request.model_name, chosen, retry), request)

    async def _send(self, executor: RemoteExecutor, request: InferRequest) -> InferResponse:
        with self._hosts.sending(executor):
            return await executor.infer(request)

    # -- merged reads -----------------------------------------------------------------------------

    def live(self) -> bool:
        return True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    async def ready(self) -> bool:
        if self._shutting_down or not self.attached:
            return False
        answers = await asyncio.gather(
            *(e.ready() for e in self._executors), return_exceptions=True
        )
        return all(answer is True for answer in answers)  # one that went away meanwhile: no

    async def model_ready(self, name: str, version: str = "") -> bool:
        if len(self._executors) == 1:
            return await self._executors[0].model_ready(name, version)
        hosts = await self._hosts.of(name)
        return any(await asyncio.gather(*(e.model_ready(name, version) for e in hosts)))

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        return await (await self._hosts.one(name)).model_metadata(name, version)

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        return await (await self._hosts.one(name)).model_config(name, version)

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        if len(self._executors) == 1:
            return await self._executors[0].model_statistics(name, version)
        hosts = await self._hosts.of(name) if name else self._attached()
        executors = hosts or [self._hosts.fallback()]
        results = await asyncio.gather(
            *(e.model_statistics(name, version) for e in executors), return_exceptions=True
        )
        parts = [r for r in results if not isinstance(r, BaseException)]
        if not parts:  # none has it: the first one's error (unknown model or version, ...)
            raise next(r for r in results if isinstance(r, BaseException))
        # A version only some hosts serve (a swap under way) is reported by those that do.
        return merge_statistics(parts)

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        if len(self._executors) == 1:
            return await self._executors[0].repository_index(ready_only=ready_only)
        parts = await _gather(self._attached(), lambda e: e.repository_index(ready_only=ready_only))
        return merge_index(parts)

    async def traffic(self, name: str) -> TrafficReport:
        return await (await self._hosts.one(name)).traffic(name)

    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        return await self._hosts.fallback().shm_status(name)

    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return await self._hosts.fallback().cuda_shm_status(name)

    # -- changes, on every executor ---------------------------------------------------------------

    def _attached(self) -> list[RemoteExecutor]:
        return [e for e in self._executors if e.attached] or [self._executors[0]]

    async def _everywhere(self, call: Callable[[RemoteExecutor], Awaitable[None]]) -> None:
        await _gather(self._attached(), call)

    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        try:
            await self._everywhere(
                lambda e: e.load_model(name, config_override=config_override, files=files)
            )
        finally:
            self._hosts.forget()

    async def unload_model(self, name: str) -> None:
        try:
            await self._everywhere(lambda e: e.unload_model(name))
        finally:
            self._hosts.forget()

    async def _on_hosts(self, name: str, call: Callable[[RemoteExecutor], Awaitable[None]]) -> None:
        await _gather(await self._hosts.of(name) or [self._hosts.fallback()], call)

    async def set_traffic(self, name: str, policy: str | None) -> None:
        await self._on_hosts(name, lambda e: e.set_traffic(name, policy))

    async def promote(self, name: str, version: int) -> None:
        await self._on_hosts(name, lambda e: e.promote(name, version))

    async def rollback(self, name: str) -> None:
        await self._on_hosts(name, lambda e: e.rollback(name))

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        await self._everywhere(lambda e: e.shm_register(name, key, offset, byte_size))

    async def shm_unregister(self, name: str = "") -> None:
        await self._everywhere(lambda e: e.shm_unregister(name))

    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        await self._everywhere(
            lambda e: e.cuda_shm_register(name, raw_handle, device_id, byte_size)
        )

    async def cuda_shm_unregister(self, name: str = "") -> None:
        await self._everywhere(lambda e: e.cuda_shm_unregister(name))

    async def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """Changes are checked here first (a refused one changes nothing anywhere), then made
        in every executor and in this front end; each executor reports them to the supervisor,
        which passes them on to the other front ends (``processes/supervisor.py``)."""
        if changes:
            checked_log_changes(changes)
            await _gather(self._attached(), lambda e: e.log_settings(changes))
            update_log_settings(changes)
        return dict(log_settings())

    async def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """Spans are made in the executors, so the settings are theirs: a change is checked
        here first (a refused one changes nothing anywhere), then made in every executor, a
        model's in those that host it (each samples and counts its own requests); the answer
        is the first one's. A restarted executor gets them back (``processes/desired.py``)."""
        if changes:
            checked_trace_changes(changes)
        hosts = await self._hosts.of(model) if model else self._attached()
        executors = hosts or [self._hosts.fallback()]
        if not changes:
            executors = executors[:1]
        answers = await _gather(executors, lambda e: e.trace_settings(model, changes))
        return answers[0]


def _retried(exc: InfermuxError) -> bool:
    """Whether a request that failed with ``exc`` is sent once more elsewhere: an executor that
    went away, or one that does not serve the model now (unloaded behind this front end's back,
    reloading): nothing ran. Never a refusal (queue full, timed out: that is the answer, and
    retrying would add load where there is too much), nor what the model or the request caused."""
    return exc.code in _RETRIED and exc.reason not in (REJECTED, BACKEND)


async def _gather(
    executors: Iterable[RemoteExecutor], call: Callable[[RemoteExecutor], Awaitable[T]]
) -> list[T]:
    """``call`` on each executor at once; every one finishes before the first error is raised
    (so that a partial change is never still running when the client hears of the failure)."""
    results = await asyncio.gather(*(call(e) for e in executors), return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return results  # type: ignore[return-value]  # no exception left in it


__all__ = ["RemoteDataPlane", "merge_index", "merge_statistics"]
