"""System shared memory read and written where a request arrives: in the front-end process.

Clients register regions with the executor (registration is the server's, whichever front end
it came through). Read there, every request's input costs the executor's event loop a
``pread`` of its bytes and its own checks, and every output a ``pwrite``: per-request work on
the one loop every request of a GPU passes, which limited gRPC + system shm to ~0.3x the GPU's
ceiling (``benchmarks/results/gpu/issue24``). So each front end keeps its own copy of the
registrations it meets (a :class:`~infermux.dataplane.shared_memory.SharedMemoryRegistry`,
the same checks: nothing mapped, every access sized with ``fstat``), reads a request's inputs
out of their regions into ordinary tensors, and writes its outputs into theirs once the answer
comes back. The executor then sees requests like any other, stacked in micro-batches
(``transport/grouping.py``).

Consistency with the executor's registrations:

- A region the front end does not know yet is asked for (``shm_status``) and, meanwhile, the
  request goes to the executor as it is, which reads the region itself: a miss is slower,
  never wrong. A name the executor does not know (a CUDA region, a typo) is not asked for again
  for :data:`ABSENT_SECONDS`.
- An unregistration is answered only after every front end dropped its copy (a
  :class:`~infermux.ipc.wire.Forget` frame, see ``channel_server.py``), so no front end reads a
  region after its client was told it is gone. An answer to ``shm_status`` that crossed such a
  frame is not kept (:attr:`RegionCopies._epoch`).
- A request whose region access fails here (out of bounds, truncated) goes to the executor as it
  is: it fails there with the same message, counted in the model's statistics.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from infermux.dataplane.shared_memory import SharedMemoryRegistry
from infermux.errors import InfermuxError
from infermux.types import (
    SHM_KEYS,
    SHM_REGION,
    InferRequest,
    InferResponse,
    Parameters,
    RequestedOutput,
    SharedMemoryRegion,
    Tensor,
    uses_shared_memory,
)

logger = logging.getLogger(__name__)

ABSENT_SECONDS = 1.0
"""How long a region name the executor does not have as a system region is not asked for."""

Fetch = Callable[[str], Awaitable[list[SharedMemoryRegion]]]
"""The executor's ``shm_status`` for one region name."""


@dataclass(slots=True)
class Resolved:
    """A request with its shared-memory inputs read, and where its outputs go."""

    request: InferRequest
    placements: dict[str, Parameters]  # output name -> its shared-memory parameters


def in_shared_memory(request: InferRequest) -> bool:
    """Whether any input or output of ``request`` lies in shared memory."""
    return any(uses_shared_memory(t.parameters) for t in request.inputs) or any(
        uses_shared_memory(o.parameters) for o in request.outputs
    )


def _without_shm(parameters: Parameters) -> Parameters:
    return {k: v for k, v in parameters.items() if k not in SHM_KEYS}


class RegionCopies:
    """One front end's copies of the executor's system regions (for one executor)."""

    def __init__(self, fetch: Fetch) -> None:
        self._fetch = fetch
        self._registry = SharedMemoryRegistry(enabled=True, staging_bytes=0)
        self._epoch = 0  # bumped by every forget: a fetch that crossed one is not kept
        self._fetching: set[str] = set()
        self._absent: dict[str, float] = {}  # name -> until when it is not asked for
        self._tasks: set[asyncio.Task[None]] = set()

    def __len__(self) -> int:
        return len(self._registry.status())

    @property
    def epoch(self) -> int:
        """Changes with every forget: what was learnt before one may be stale."""
        return self._epoch

    # -- what the executor says -------------------------------------------------------------------

    def learn(self, name: str, key: str, offset: int, byte_size: int) -> None:
        """Keep a copy of region ``name`` (registered with the executor a moment ago)."""
        if self._registry.has(name):
            return
        try:
            self._registry.register(name, key, offset, byte_size)
        except InfermuxError as exc:  # e.g. this process's descriptor limit: misses, not errors
            logger.debug("not reading shared memory region '%s' here: %s", name, exc.message)
            self._absent[name] = time.monotonic() + ABSENT_SECONDS

    def forget(self, name: str) -> None:
        """Drop region ``name`` ("": every region)."""
        self._epoch += 1
        self._absent.clear()
        if not name:
            self._registry.unregister()
        elif self._registry.has(name):
            self._registry.unregister(name)

    def clear(self) -> None:
        """Drop everything (another executor: its registrations are its own)."""
        self.forget("")
        for task in self._tasks:
            task.cancel()

    def _ask(self, name: str) -> None:
        until = self._absent.get(name)
        if name in self._fetching or (until is not None and time.monotonic() < until):
            return
        self._fetching.add(name)
        task = asyncio.get_running_loop().create_task(self._ask_for(name, self._epoch))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _ask_for(self, name: str, epoch: int) -> None:
        try:
            regions = await self._fetch(name)
        except InfermuxError:  # not a system region (CUDA, or unknown): ask again later
            self._absent[name] = time.monotonic() + ABSENT_SECONDS
            return
        finally:
            self._fetching.discard(name)
        if epoch != self._epoch:  # an unregistration crossed the answer: it may be stale
            return
        for region in regions:
            self.learn(region.name, region.key, region.offset, region.byte_size)

    # -- requests ---------------------------------------------------------------------------------

    def resolve(self, request: InferRequest) -> Resolved | None:
        """``request`` with its inputs read out of their regions and its outputs to be placed
        by :meth:`place`; None when the executor should see it as it is (a region not known
        here yet, or an access that fails)."""
        names = [
            str(p.get(SHM_REGION, ""))
            for p in [t.parameters for t in request.inputs]
            + [o.parameters for o in request.outputs]
            if uses_shared_memory(p)
        ]
        unknown = [n for n in names if not self._registry.has(n)]
        if unknown:
            for name in unknown:
                if name:
                    self._ask(name)
            return None
        inputs = []
        try:
            for tensor in request.inputs:
                if not uses_shared_memory(tensor.parameters):
                    inputs.append(tensor)
                    continue
                data = self._registry.read(tensor)
                parameters = _without_shm(tensor.parameters)
                inputs.append(Tensor(tensor.name, tensor.datatype, tensor.shape, data, parameters))
        except InfermuxError:
            return None
        placements = {
            o.name: o.parameters for o in request.outputs if uses_shared_memory(o.parameters)
        }
        outputs = [RequestedOutput(o.name, _without_shm(o.parameters)) for o in request.outputs]
        resolved = InferRequest(
            request.model_name,
            request.model_version,
            inputs,
            outputs,
            request.id,
            request.parameters,
            request.trace_context,
            request.deadline_ns,
        )
        return Resolved(resolved, placements)

    def place(self, response: InferResponse, placements: dict[str, Parameters]) -> InferResponse:
        """Write the outputs that go to shared memory into their regions (an error is the
        request's: INVALID_ARGUMENT when an output does not fit, as the executor would say)."""
        if placements:
            response.outputs = [
                self._registry.write(t, placements[t.name]) if t.name in placements else t
                for t in response.outputs
            ]
        return response

    def close(self) -> None:
        self.clear()
        self._registry.close()
