"""Running requests, whatever the transport: route, read their shared memory, validate, queue
with the model's scheduler (and its shadow), account and answer -- one request, a front end's
micro-batch (``micro_batches.py``) or a decoupled model's stream (``streams.py``).

:class:`~infermux.dataplane.plane.DataPlane` hands its inference operations here; the rest of the
V2 operations (metadata, statistics, regions, logging, traffic, repository) stay there.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Mapping, Sequence

from infermux.backends.base import DeviceInput, DeviceParts, ModelRequest
from infermux.errors import DecoupledModelError, FailureReason, InfermuxError
from infermux.ipc.arena import Block
from infermux.observability.tracing import TRACING
from infermux.routing.router import Route, Router
from infermux.routing.shadow import ShadowRuns, copied
from infermux.scheduling.base import Completion
from infermux.types import InferRequest, InferResponse, RequestedOutput

from . import streams
from .classification import classified, wanted_classes
from .cuda_shared_memory import AllocationSizes
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


class Inference:
    """Inference over a router's models, with the server's shared-memory regions."""

    def __init__(
        self,
        router: Router,
        regions: Regions,
        shared_memory: SharedMemoryRegistry,
        limits: InputLimits,
        *,
        log_requests: bool = False,
    ) -> None:
        self.router = router
        self._regions = regions
        self._shm = shared_memory
        self._limits = limits
        self._shadows = ShadowRuns()
        self.log_requests = log_requests
        """--log-verbose 2: a log line per request (changed at run time by the logging API)."""

    def close(self) -> None:
        """Cancel the shadow runs still going."""
        self._shadows.cancel()

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
            log = self.log_requests
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
            sizes: AllocationSizes = {}  # one driver call per CUDA region for the micro-batch
            stacked, device = stacked_request(
                request, len(rows), inputs_apart, regions, staged, on_device=on_device, sizes=sizes
            )
            wanted: list[list[RequestedOutput]] = []
            to_device: dict[str, DeviceParts] = {}
            if outputs_apart:
                wanted = per_request(request.outputs, len(rows))
                check_output_regions(model.config, wanted, rows, regions)
                stacked.outputs = [RequestedOutput(o.name) for o in wanted[0]]
                if on_device:
                    to_device = device_destinations(model.config, wanted, rows, regions, sizes)
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
        succeeded(model, request, started, done, rows, log=self.log_requests)
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
