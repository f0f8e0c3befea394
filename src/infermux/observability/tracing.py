"""OpenTelemetry traces of inference requests and of the batches that carried them.

Each traced request gets an ``infer`` span (a child of the caller's W3C ``traceparent`` when
the request had one) with a ``queue`` child covering its wait for a batch. Each batch that
carried a traced request gets one ``execute`` span, *linked* to every traced request span it
served: a batch belongs to several traces at once, which a parent-child tree cannot say. It is
the child of the first traced request it carried, so that the parent-based sampler keeps it.

Off by default, and then nothing here runs: callers test ``TRACING.tracer is None`` (one
attribute read per request) and the OpenTelemetry SDK is never imported. On, the decision to
trace comes first and costs a counter (Triton's ``rate``: one request in N) or a look at the
caller's ``traceparent`` flags, so the requests not traced create no span at all (the SDK's
own sampler would cost ~25 µs per request to decide "no"). The scheduler's clock is
``perf_counter_ns``; spans are stamped after the fact with wall-clock times derived from it.

Which requests are traced can change at run time, globally or per model: Triton's trace
extension, whose settings :mod:`.trace_settings` keeps (each process that makes spans, every
executor with ``--frontends N``, holds its own).
"""

from __future__ import annotations

import contextlib
import contextvars
import logging
import re
import threading
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from infermux.errors import StartupError, UnsupportedError
from infermux.settings import TraceSettings

from .trace_settings import LEVEL, Sampler, TraceTable, TraceValue, checked_trace_changes

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.trace import Span, SpanContext, Tracer

logger = logging.getLogger(__name__)

TRACE_HEADERS = ("traceparent", "tracestate")
"""The W3C Trace Context headers (HTTP) and metadata keys (gRPC) a request may carry."""

_TRACEPARENT = re.compile(r"[0-9a-f]{2}-[0-9a-f]{32}-[0-9a-f]{16}-[0-9a-f]{2}")
_REQUEST: contextvars.ContextVar[Span | None] = contextvars.ContextVar("infermux_request_span")


def carrier(headers: Mapping[str, str] | Iterable[tuple[str, str]]) -> dict[str, str]:
    """The trace context headers among ``headers`` (lower-case names, as HTTP/2 and ASGI give
    them); {} when the caller sent none, which is the common case and costs a lookup or two."""
    if isinstance(headers, Mapping):
        return {key: headers[key] for key in TRACE_HEADERS if key in headers}
    return {key: value for key, value in headers if key in TRACE_HEADERS}


class Tracing:
    """The process's tracer: None while no scope of :attr:`table` traces (then nothing of
    OpenTelemetry runs); the provider is made on the first need and kept until
    :meth:`shutdown`."""

    def __init__(self) -> None:
        self.tracer: Tracer | None = None
        self._provider: TracerProvider | None = None
        self._settings = TraceSettings()
        self.table = TraceTable(self._settings.level, self._settings.rate, self._settings.url)
        self._wall_offset_ns = 0
        self._flushing = threading.Lock()

    def start(self, settings: TraceSettings) -> None:
        """Trace as ``settings`` (the command line) say; with their level OFF nothing starts,
        but a client may turn tracing on later (:meth:`trace_settings`)."""
        self._settings = settings
        self.table = TraceTable(settings.level, settings.rate, settings.url)
        if not settings.enabled:
            return
        self._use(self._otlp_provider())
        logger.info("tracing 1 request in %d to %s", settings.rate, settings.url)

    def _otlp_provider(self) -> TracerProvider:
        settings = self._settings
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
            from opentelemetry.sdk.resources import Resource
            from opentelemetry.sdk.trace import TracerProvider
            from opentelemetry.sdk.trace.export import BatchSpanProcessor
        except ImportError:
            raise StartupError(
                "--trace-config mode=opentelemetry needs: pip install 'infermux[trace]'"
            ) from None
        resource = Resource.create({"service.name": "infermux", **dict(settings.resource)})
        # The SDK's default sampler (parent-based, always on): :meth:`sampled` has decided.
        provider = TracerProvider(resource=resource)
        # Spans leave in batches from the SDK's own thread: the request path only queues them.
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=settings.url)))
        return provider

    def use(self, provider: TracerProvider, *, rate: int = 1) -> None:
        """Trace one request in ``rate`` through ``provider`` (tests pass one with an
        in-memory exporter)."""
        self.table = TraceTable("TIMESTAMPS", rate, self._settings.url)
        self._use(provider)

    def _use(self, provider: TracerProvider) -> None:
        self._provider = provider
        self.tracer = provider.get_tracer("infermux")
        self._wall_offset_ns = time.time_ns() - time.perf_counter_ns()

    def trace_settings(
        self, model: str = "", changes: Mapping[str, object] | None = None
    ) -> dict[str, TraceValue]:
        """The trace settings of ``model`` (global ones when ""), after applying ``changes``
        (Triton's trace extension, :mod:`.trace_settings`): all of them or, when one is
        refused, none. Turning a level on makes the exporter if there is none yet."""
        if changes:
            checked = checked_trace_changes(changes)
            if checked.get(LEVEL) == "TIMESTAMPS" and self._provider is None:
                try:
                    provider = self._otlp_provider()
                except StartupError as exc:
                    raise UnsupportedError(f"tracing cannot be turned on: {exc}") from None
                self._use(provider)
            self.table.update(model, checked)
            if self._provider is not None:
                on = self.table.any_on()
                self.tracer = self._provider.get_tracer("infermux") if on else None
        return self.table.settings(model)

    def sampled(self, model: str, carrier: Mapping[str, str]) -> Sampler | None:
        """Whether to trace a request to ``model`` (the sampler that chose it, else None): as
        its caller's ``traceparent`` says when it has a valid one and the model's level is
        on, else one request in the model's ``trace_rate`` (counted, as tritonserver does)."""
        sampler = self.table.sampler(model)
        if not sampler.on:
            return None
        parent = carrier.get("traceparent") if carrier else None
        if parent is not None and _TRACEPARENT.fullmatch(parent) and parent[:2] != "ff":
            return sampler if int(parent[-2:], 16) & 1 == 1 else None
        return sampler if sampler.sample() else None

    def ended(self, sampler: Sampler) -> None:
        """A trace ``sampler`` started has ended: hand the spans to the exporter now when its
        ``log_frequency`` says so (on a thread: an export waits on the network)."""
        provider = self._provider
        if provider is None or not sampler.ended() or not self._flushing.acquire(blocking=False):
            return  # one flush at a time: the one under way takes these spans too

        def flush() -> None:
            try:
                provider.force_flush()
            finally:
                self._flushing.release()

        threading.Thread(target=flush, name="infermux-trace-flush", daemon=True).start()

    def shutdown(self) -> None:
        """Flush the spans not yet exported and turn tracing off."""
        provider, self._provider, self.tracer = self._provider, None, None
        self._settings = TraceSettings()
        self.table = TraceTable(self._settings.level, self._settings.rate, self._settings.url)
        if provider is not None:
            provider.shutdown()

    @contextlib.contextmanager
    def request_span(
        self,
        model: str,
        version: str,
        request_id: str,
        carrier: Mapping[str, str],
        sampler: Sampler | None = None,
    ) -> Iterator[Span]:
        """The ``infer`` span of a request :meth:`sampled` chose, current for the block (so that
        the scheduler can find it); an exception leaving the block marks it failed."""
        from opentelemetry import trace
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        tracer = self.tracer
        assert tracer is not None  # callers check first: the untraced path must not get here
        parent = TraceContextTextMapPropagator().extract(carrier) if carrier else None
        span = tracer.start_span(
            "infer",
            context=parent,
            kind=trace.SpanKind.SERVER,
            attributes={
                "infermux.model.name": model,
                "infermux.model.version": version,
                "infermux.request.id": request_id,
            },
        )
        token = _REQUEST.set(span)
        try:
            with trace.use_span(span, end_on_exit=True):
                yield span
        finally:
            _REQUEST.reset(token)
            if sampler is not None:
                self.ended(sampler)

    def current(self) -> SpanContext | None:
        """The context of the request span being recorded in this task, else None."""
        span = _REQUEST.get(None)
        return span.get_span_context() if span is not None else None

    def annotate_request(self, rows: int) -> None:
        """Add the request's batch size to its span, if it has one (once it is decoded)."""
        span = _REQUEST.get(None)
        if span is not None:
            span.set_attribute("infermux.request.batch_size", rows)

    def record_batch(
        self,
        model: str,
        version: int,
        requests: Sequence[tuple[Any, int]],
        *,
        dequeued_ns: int,
        ended_ns: int,
        rows: int,
    ) -> None:
        """After a batch ran: a ``queue`` span per traced request (enqueued to dequeued) and
        one ``execute`` span linked to them all. ``requests`` holds (span context or None,
        enqueued time) per request; times are ``perf_counter_ns`` readings."""
        from opentelemetry import trace

        tracer = self.tracer
        traced = [(context, enqueued) for context, enqueued in requests if context is not None]
        if tracer is None or not traced:
            return
        attributes = {"infermux.model.name": model, "infermux.model.version": str(version)}
        dequeued = dequeued_ns + self._wall_offset_ns
        for context, enqueued in traced:
            parent = trace.set_span_in_context(trace.NonRecordingSpan(context))
            queue = tracer.start_span(
                "queue",
                context=parent,
                attributes=attributes,
                start_time=enqueued + self._wall_offset_ns,
            )
            queue.end(end_time=dequeued)
        first = trace.set_span_in_context(trace.NonRecordingSpan(traced[0][0]))
        batch = tracer.start_span(
            "execute",
            context=first,
            links=[trace.Link(context) for context, _ in traced],
            attributes={
                **attributes,
                "infermux.batch.size": rows,
                "infermux.batch.requests": len(requests),
            },
            start_time=dequeued,
        )
        batch.end(end_time=ended_ns + self._wall_offset_ns)


TRACING = Tracing()
"""The process's tracing (each process that runs a data plane starts its own)."""
