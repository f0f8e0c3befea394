"""The V2 operations, independent of any transport.

Front ends decode the wire format into :mod:`infermux.types`, call one method here and encode the
answer; everything they need is here, so HTTP, gRPC and any later front end behave identically.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any

from infermux.backends.base import DeviceInput, DeviceParts, ModelRequest
from infermux.errors import (
    DecoupledModelError,
    FailureReason,
    InfermuxError,
    InvalidArgumentError,
)
from infermux.ipc.arena import Block
from infermux.model_config import ModelConfig
from infermux.observability.logs import log_settings, update_log_settings
from infermux.observability.tracing import TRACING
from infermux.repository import ModelRepository
from infermux.routing.policy import parse_policy
from infermux.routing.router import Route, Router, TrafficReport
from infermux.routing.shadow import ShadowRuns, copied
from infermux.scheduling.base import Completion
from infermux.types import (
    CudaSharedMemoryRegion,
    InferRequest,
    InferResponse,
    ModelMetadata,
    ModelStats,
    RepositoryIndexEntry,
    RequestedOutput,
    ServerMetadata,
    SharedMemoryRegion,
    TensorMetadata,
)

from . import streams
from .classification import classified, wanted_classes
from .cuda_shared_memory import CudaSharedMemoryRegistry
from .inputs import InputLimits, to_model_request
from .micro_batches import (
    Ungroupable,
    check_output_regions,
    device_destinations,
    per_request,
    place_apart,
    stacked_request,
    ungroupable,
)
from .outcomes import failed, succeeded
from .regions import Regions
from .shared_memory import SharedMemoryRegistry

logger = logging.getLogger(__name__)

SERVER_NAME = "infermux"


class DataPlane:
    """Every V2 operation over one :class:`ModelRepository`."""

    def __init__(
        self,
        repository: ModelRepository,
        *,
        version: str,
        name: str = SERVER_NAME,
        extensions: Sequence[str] = (),
        strict_readiness: bool = True,
        log_requests: bool = False,
        shared_memory: SharedMemoryRegistry | None = None,
        cuda_shared_memory: CudaSharedMemoryRegistry | None = None,
        router: Router | None = None,
        limits: InputLimits | None = None,
    ) -> None:
        self._repository = repository
        self._limits = limits or InputLimits()
        self.router = router or Router(repository)
        self._shadows = ShadowRuns()
        self._shm = shared_memory or SharedMemoryRegistry(enabled=False)
        self._cuda = cuda_shared_memory or CudaSharedMemoryRegistry(enabled=False)
        self._regions = Regions(self._shm, self._cuda)
        self._metadata = ServerMetadata(name, version, tuple(extensions))
        self._strict = strict_readiness
        self._log_requests = log_requests  # --log-verbose 2: a log line per request
        self._shutting_down = False
        self._on_shm_forgotten: list[Callable[[str], Awaitable[None]]] = []

    # -- health and metadata ----------------------------------------------------------------------

    def live(self) -> bool:
        """The server process is up and able to answer."""
        return True

    async def ready(self) -> bool:
        """Ready for inference: not shutting down and, with strict readiness, every model ready."""
        if self._shutting_down:
            return False
        return self._repository.all_ready() if self._strict else True

    def begin_shutdown(self) -> None:
        """Report not-ready from now on so that load balancers stop sending traffic."""
        self._shutting_down = True

    def server_metadata(self) -> ServerMetadata:
        return self._metadata

    async def model_ready(self, name: str, version: str = "") -> bool:
        return self._repository.is_ready(name, version)

    async def model_config(self, name: str, version: str = "") -> ModelConfig:
        return self._repository.get(name, version).config

    async def model_metadata(self, name: str, version: str = "") -> ModelMetadata:
        config = self._repository.get(name, version).config
        versions = self._repository.ready_versions(name)
        if version:
            versions = [int(version)]
        return ModelMetadata(
            name=config.name,
            versions=tuple(str(v) for v in versions),
            platform=config.platform or config.backend,
            inputs=tuple(
                TensorMetadata(t.name, t.datatype, config.full_shape(t)) for t in config.inputs
            ),
            outputs=tuple(
                TensorMetadata(t.name, t.datatype, config.full_shape(t)) for t in config.outputs
            ),
        )

    # -- inference --------------------------------------------------------------------------------

    async def infer(self, request: InferRequest) -> InferResponse:
        """Validate, schedule and run one request; raises an :class:`InfermuxError` on failure."""
        started = time.perf_counter_ns()
        route = self.router.route(request)
        if route.model.config.decoupled:
            name = route.model.name
            raise DecoupledModelError(streams.decoupled_refusal(name), name)
        return await self._traced(route, request, started)

    async def infer_stream(self, request: InferRequest) -> AsyncIterator[InferResponse]:
        """The responses to one request, in order, the last one ``final``: one for most
        models, zero or more then a final flag for a decoupled model (``dataplane/streams.py``).
        Raises an :class:`InfermuxError` when the request fails before it runs; afterwards a
        failure is a response with ``error`` set (the stream may go on after it)."""
        started = time.perf_counter_ns()
        route = self.router.route(request, mirror=False)  # a decoupled model is not mirrored
        if not route.model.config.decoupled:
            yield await self._traced(route, request, started)
            return
        model = route.model
        staged: list[Block] = []
        try:
            try:
                classes = wanted_classes(model.config, request.outputs) if request.outputs else {}
                device = self._regions.read_inputs(
                    request, staged, on_device=model.accepts_device_inputs
                )
                model_request = to_model_request(model.config, request, device, self._limits)
            except InfermuxError as exc:
                failed(model, request, started, exc.reason, exc)
                raise
            log = self._log_requests
            answers = streams.answers(model, request, model_request, started, log)
            async with contextlib.aclosing(answers):  # a reader gone gives the request up now
                async for response in answers:
                    if classes and response.outputs:
                        batched = model.config.batching
                        response.outputs = classified(
                            response.outputs, classes, batched=batched, labels=model.labels
                        )
                    response.outputs = self._regions.place_outputs(request, response.outputs)
                    if staged:
                        response.outputs = self._shm.unstaged(response.outputs)
                    yield response
        finally:
            if staged:
                self._shm.release(staged)

    async def _traced(self, route: Route, request: InferRequest, started: int) -> InferResponse:
        if TRACING.tracer is None:
            return await self._infer(route, request, started)
        model = route.model
        sampler = TRACING.sampled(model.name, request.trace_context)
        if sampler is None:
            return await self._infer(route, request, started)
        with TRACING.request_span(
            model.name, str(model.version), request.id, request.trace_context, sampler
        ):
            return await self._infer(route, request, started)

    async def infer_many(
        self,
        request: InferRequest,
        rows: Sequence[int],
        *,
        inputs_apart: bool = False,
        outputs_apart: bool = False,
    ) -> InferResponse:
        """A micro-batch: ``len(rows)`` requests of ``rows[i]`` rows each, sent together with
        their inputs stacked along the first dimension, run as one request (one entry in the
        model's queue) and answered with the outputs stacked the same way. Statistics count
        each request. Raises :class:`Ungroupable` before anything runs when the requests must
        be run one by one to keep their semantics; any other error is every request's.

        ``inputs_apart``: ``request.inputs`` lists each request's inputs in turn, references
        to shared memory: system regions are read here into consecutive rows of one staging
        block; CUDA regions stay on the device, one part per request, for a model that reads
        them there (else they are copied to the host).
        ``outputs_apart``: ``request.outputs`` lists each request's outputs in turn, placed in
        its own regions; the response lists the placed outputs request by request."""
        started = time.perf_counter_ns()
        if TRACING.tracer is not None:
            raise Ungroupable("tracing is on: every request gets its own span")
        # No shadow is sampled: a policy with one makes the requests ungroupable.
        route = self.router.route(request, mirror=False)
        model = route.model
        why = ungroupable(model, route.policy, sum(rows))
        if why:
            raise Ungroupable(why)
        if not (inputs_apart or outputs_apart):
            return await self._infer(route, request, started, rows)
        staged: list[Block] = []
        try:
            regions = self._regions
            on_device = model.accepts_device_inputs
            stacked, device = stacked_request(
                request, len(rows), inputs_apart, regions, staged, on_device=on_device
            )
            wanted: list[list[RequestedOutput]] = []
            to_device: dict[str, DeviceParts] = {}
            if outputs_apart:
                wanted = per_request(request.outputs, len(rows))
                check_output_regions(model.config, wanted, rows, regions)
                stacked.outputs = [RequestedOutput(o.name) for o in wanted[0]]
                if on_device:
                    to_device = device_destinations(model.config, wanted, rows, regions)
            written: set[str] = set()
            response = await self._infer(
                route, stacked, started, rows, device, to_device=to_device, written=written
            )
            if outputs_apart:
                response.outputs = place_apart(response.outputs, rows, wanted, regions, written)
            elif staged:
                response.outputs = self._shm.unstaged(response.outputs)
            return response
        finally:
            if staged:
                self._shm.release(staged)

    async def _infer(
        self,
        route: Route,
        request: InferRequest,
        started: int,
        members: Sequence[int] = (),
        device: Mapping[str, DeviceParts] | None = None,
        *,
        to_device: Mapping[str, DeviceParts] | None = None,
        written: set[str] | None = None,
    ) -> InferResponse:
        """``device``: inputs of a micro-batch (``members``) already read, left in GPU memory;
        ``to_device``: its outputs' places in GPU memory, which the backend may write there
        itself (the names it wrote are added to ``written``)."""
        model = route.model
        staged: list[Block] = []  # shared-memory inputs read into the staging arena
        try:
            classes = wanted_classes(model.config, request.outputs) if request.outputs else {}
            on_gpu: dict[str, DeviceInput] = {
                **self._regions.read_inputs(request, staged, on_device=model.accepts_device_inputs),
                **(device or {}),
            }
            model_request = to_model_request(model.config, request, on_gpu, self._limits)
            if to_device:
                model_request.device_outputs = dict(to_device)
                if written is not None:
                    model_request.outputs_on_device = written  # the backend adds to it
            if TRACING.tracer is not None:
                TRACING.annotate_request(model_request.batch_size)
            done = await self._schedule(route, model_request)
            outputs = done.outputs
            if classes:
                batched = model.config.batching
                outputs = classified(outputs, classes, batched=batched, labels=model.labels)
            outputs = self._regions.place_outputs(request, outputs)
            if staged:
                outputs = self._shm.unstaged(outputs)
        except InfermuxError as exc:
            for _ in members or (0,):
                failed(model, request, started, exc.reason, exc)
            raise
        except asyncio.CancelledError:  # the client went away (or the server is stopping)
            for _ in members or (0,):
                failed(model, request, started, FailureReason.CANCELED, None)
            raise
        finally:
            # The request's batch is over (a cancelled one waited for it in the scheduler).
            if staged:
                self._shm.release(staged)
        rows = members or (model_request.batch_size if model.config.batching else 1,)
        succeeded(model, request, started, done, rows, log=self._log_requests)
        return InferResponse(
            model_name=model.name,
            model_version=str(model.version),
            outputs=outputs,
            id=request.id,
        )

    async def _schedule(self, route: Route, model_request: ModelRequest) -> Completion:
        """The model's scheduler runs the request; a shadow of it, when the route has one,
        runs after it and is compared with its answer."""
        scheduler = route.model.scheduler
        if route.shadow is None:
            return await scheduler.submit(model_request)
        copy = copied(model_request)  # now: shared-memory inputs are gone after the answer
        submitted = time.perf_counter_ns()
        done = await scheduler.submit(model_request)
        self._shadows.start(route.shadow, copy, done.outputs, time.perf_counter_ns() - submitted)
        return done

    # -- statistics -------------------------------------------------------------------------------

    async def model_statistics(self, name: str = "", version: str = "") -> list[ModelStats]:
        """Statistics of every served version of ``name`` (of every model when ``name`` is "")."""
        if not name:
            if version:
                raise InvalidArgumentError("a model version needs a model name")
            models = self._repository.served()
        elif version:
            models = [self._repository.get(name, version)]
        else:
            self._repository.get(name)  # raises the precise not-found/unavailable error
            models = [m for m in self._repository.served() if m.name == name]
        return [m.stats.snapshot() for m in models]

    # -- system shared memory ---------------------------------------------------------------------

    async def shm_register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        self._regions.check_free(name, cuda=False)
        self._shm.register(name, key, offset, byte_size)

    async def shm_unregister(self, name: str = "") -> None:
        self._shm.unregister(name)
        for hook in self._on_shm_forgotten:
            await hook(name)

    def on_shm_forgotten(self, hook: Callable[[str], Awaitable[None]]) -> None:
        """Await ``hook(name)`` after every system-region unregistration ("": all), before it
        is answered: front ends that read regions themselves drop theirs in it."""
        self._on_shm_forgotten.append(hook)

    async def shm_status(self, name: str = "") -> list[SharedMemoryRegion]:
        return self._shm.status(name)

    # -- CUDA shared memory -----------------------------------------------------------------------

    async def cuda_shm_register(
        self, name: str, raw_handle: bytes, device_id: int, byte_size: int
    ) -> None:
        self._regions.check_free(name, cuda=True)
        self._cuda.register(name, raw_handle, device_id, byte_size)

    async def cuda_shm_unregister(self, name: str = "") -> None:
        self._cuda.unregister(name)

    async def cuda_shm_status(self, name: str = "") -> list[CudaSharedMemoryRegion]:
        return self._cuda.status(name)

    # -- logging extension ------------------------------------------------------------------------

    async def log_settings(self, changes: dict[str, Any] | None = None) -> dict[str, Any]:
        """This process's log settings (Triton's logging extension), after applying
        ``changes`` when given: all of them or, when one is refused, none."""
        if changes:
            self.apply_log_changes(changes)
        return dict(log_settings())

    def apply_log_changes(self, changes: dict[str, Any]) -> None:
        """Apply log setting ``changes`` to this process (from a client, or from the
        supervisor when a client changed them through another process)."""
        verbose = update_log_settings(changes)["log_verbose_level"]
        self._log_requests = int(verbose) > 1  # as --log-verbose 2: a line per request

    # -- trace extension --------------------------------------------------------------------------

    async def trace_settings(
        self, model: str = "", changes: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        """The trace settings of ``model`` (global when ""), after applying ``changes`` when
        given (Triton's trace extension, ``observability/trace_settings.py``)."""
        if model and not self._repository.is_ready(model, ""):
            raise InvalidArgumentError(f"Request for unknown model : {model}")
        return dict(TRACING.trace_settings(model, changes))

    def close(self) -> None:
        """Release what the data plane holds itself (shared-memory mappings, shadow runs)."""
        self._shadows.cancel()
        self._shm.close()
        self._cuda.close()

    # -- traffic policies (admin) -----------------------------------------------------------------

    async def traffic(self, name: str) -> TrafficReport:
        """The traffic policy in force for ``name``, its served versions and shadow figures."""
        return self.router.report(name)

    async def set_traffic(self, name: str, policy: str | None) -> None:
        """Put a policy (JSON) in force for ``name``; None returns to the config's."""
        self.router.set_policy(name, parse_policy(policy) if policy is not None else None)

    async def promote(self, name: str, version: int) -> None:
        """Send all of ``name``'s traffic to ``version`` from the next request on."""
        self.router.promote(name, version)

    async def rollback(self, name: str) -> None:
        """Undo the last traffic policy change of ``name``."""
        self.router.rollback(name)

    # -- repository -------------------------------------------------------------------------------

    async def repository_index(self, *, ready_only: bool = False) -> list[RepositoryIndexEntry]:
        return self._repository.index(ready_only=ready_only)

    async def load_model(
        self,
        name: str,
        *,
        config_override: str | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> None:
        """Load or reload ``name`` (explicit control mode only), from ``files`` when given
        (see :meth:`ModelRepository.load <infermux.repository.ModelRepository.load>`)."""
        self._repository.check_explicit("load")
        if config_override is not None and not config_override.strip():
            raise InvalidArgumentError(
                f"failed to load '{name}': parameter 'config' must be a non-empty ModelConfig JSON"
            )
        await self._repository.load(name, config_override, files)

    async def unload_model(self, name: str) -> None:
        """Unload ``name`` after its admitted requests finish (explicit control mode only)."""
        self._repository.check_explicit("unload")
        await self._repository.unload(name)
