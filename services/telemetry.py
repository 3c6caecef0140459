"""OpenTelemetry setup and W3C trace-context propagation over NATS headers: one place.

Every claim is one trace across the services: each process's spans carry real
trace and span ids, and the ids travel in every message's headers
(``traceparent``). What a span costs depends on whether anything exports it:

- ``OTEL_TRACES_EXPORTER=console`` prints spans to stderr;
- ``OTEL_TRACES_EXPORTER=otlp`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` set) sends
  them with the OTLP exporter, if ``opentelemetry-exporter-otlp`` is installed;
- unset or ``none``: nothing leaves the process, so nothing is recorded either.
  Spans are then `NonRecordingSpan`s that only carry context: the incoming trace
  id (or a new one for a claim's first span), a fresh span id, the parent's
  trace flags (a new trace is flagged sampled, as the SDK's default sampler
  would flag it, so a service downstream that does export records its part).
  No span object, attributes, clock reads or processor calls: the allocator's
  tracing per claim (three spans, one extract, one inject) went from ~62 us
  with the SDK's spans to ~21 us.

The switch is the provider's `add_span_processor`, as on the SDK's own
provider: the first processor added (by the exporter variables above, or by a
test's in-memory exporter) makes every tracer, including ones handed out
before, start recording SDK spans. ``OTEL_SERVICE_NAME`` and
``OTEL_RESOURCE_ATTRIBUTES`` are read by the SDK as usual.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
from collections.abc import Mapping, Sequence
from contextlib import AbstractContextManager
from contextvars import Token
from typing import Any

from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.context import Context
from opentelemetry.propagators.composite import CompositePropagator
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.id_generator import RandomIdGenerator
from opentelemetry.trace import Link, NonRecordingSpan, Span, SpanContext, SpanKind, TraceFlags
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator
from opentelemetry.util.types import Attributes

log = logging.getLogger("dralloc.telemetry")

_configured = False


def setup(service_name: str) -> None:
    """Install the tracer provider, and the meter provider (`dralloc.metrics.setup`), once per
    process (later calls are no-ops), each with the exporter the OTEL_* variables name (`exporter`)."""
    global _configured
    if _configured:
        return
    _configured = True
    attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or f"dralloc-{service_name}"}
    provider = PropagatingTracerProvider(Resource.create(attributes))
    spans = exporter("traces")
    if spans is not None:
        from opentelemetry.sdk.trace.export import BatchSpanProcessor

        provider.add_span_processor(BatchSpanProcessor(spans))
    trace.set_tracer_provider(provider)
    from dralloc import metrics  # the metrics name the same service as the spans

    metrics.setup(provider.resource, exporter("metrics"))


EXPORTERS: dict[tuple[str, str], tuple[str, str]] = {
    ("traces", "console"): ("opentelemetry.sdk.trace.export", "ConsoleSpanExporter"),
    ("traces", "otlp"): ("opentelemetry.exporter.otlp.proto.http.trace_exporter", "OTLPSpanExporter"),
    ("metrics", "console"): ("opentelemetry.sdk.metrics.export", "ConsoleMetricExporter"),
    ("metrics", "otlp"): ("opentelemetry.exporter.otlp.proto.http.metric_exporter", "OTLPMetricExporter"),
}
"""(signal, exporter name) -> (module, class) of the exporter: the OTLP ones come from the optional
``opentelemetry-exporter-otlp`` package, so they are imported only when named."""


def exporter(signal: str) -> Any | None:
    """A new exporter for `signal` (``traces`` or ``metrics``) as ``OTEL_<SIGNAL>_EXPORTER`` names it:
    ``console``, ``otlp`` (also when only ``OTEL_EXPORTER_OTLP_ENDPOINT`` is set), else None: for
    unset or ``none``, and (logged) for a name not supported or an OTLP exporter not installed."""
    variable = f"OTEL_{signal.upper()}_EXPORTER"
    name = os.environ.get(variable, "").strip().lower()
    if not name and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        name = "otlp"
    if name in ("", "none"):
        return None
    if (signal, name) not in EXPORTERS:
        log.warning("%s=%s is not supported (console, otlp or none); not exporting", variable, name[:100])
        return None
    module, cls = EXPORTERS[(signal, name)]
    try:
        return getattr(importlib.import_module(module), cls)()
    except ImportError:
        log.warning("%s=%s but opentelemetry-exporter-otlp is not installed; not exporting", variable, name)
        return None


class PropagatingTracerProvider(trace.TracerProvider):
    """Context-only spans until a span processor is added; from then on the SDK's recording spans."""

    def __init__(self, resource: Resource) -> None:
        self.resource = resource
        self.sdk: TracerProvider | None = None
        """The recording provider, made when the first span processor is added."""

    def get_tracer(
        self,
        instrumenting_module_name: str,
        instrumenting_library_version: str | None = None,
        schema_url: str | None = None,
        attributes: Attributes = None,
    ) -> trace.Tracer:
        return _Tracer(self, (instrumenting_module_name, instrumenting_library_version, schema_url, attributes))

    def add_span_processor(self, processor: SpanProcessor) -> None:
        if self.sdk is None:
            self.sdk = TracerProvider(resource=self.resource)
        self.sdk.add_span_processor(processor)

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.sdk.force_flush(timeout_millis) if self.sdk is not None else True

    def shutdown(self) -> None:
        if self.sdk is not None:
            self.sdk.shutdown()


_ids = RandomIdGenerator()
_NEW_TRACE_FLAGS = TraceFlags(TraceFlags.SAMPLED)


class _Tracer(trace.Tracer):
    def __init__(self, provider: PropagatingTracerProvider, args: tuple) -> None:
        self._provider = provider
        self._args = args
        self._recording: tuple[TracerProvider, trace.Tracer] | None = None
        """The SDK tracer once recording, and the SDK provider it is from."""

    def start_span(
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
    ) -> Span:
        sdk = self._provider.sdk
        if sdk is not None:
            if self._recording is None or self._recording[0] is not sdk:
                self._recording = (sdk, sdk.get_tracer(*self._args))
            return self._recording[1].start_span(name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception)
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            return NonRecordingSpan(SpanContext(parent.trace_id, _ids.generate_span_id(), False, parent.trace_flags, parent.trace_state))
        return NonRecordingSpan(SpanContext(_ids.generate_trace_id(), _ids.generate_span_id(), False, _NEW_TRACE_FLAGS))

    def start_as_current_span(  # type: ignore[override]  # the API's own decorator (_AgnosticContextManager) is private
        self,
        name: str,
        context: Context | None = None,
        kind: SpanKind = SpanKind.INTERNAL,
        attributes: Attributes = None,
        links: Sequence[Link] | None = None,
        start_time: int | None = None,
        record_exception: bool = True,
        set_status_on_exception: bool = True,
        end_on_exit: bool = True,
    ) -> AbstractContextManager[Span]:
        span = self.start_span(name, context, kind, attributes, links, start_time, record_exception, set_status_on_exception)
        return use_span(span, end_on_exit=end_on_exit, record_exception=record_exception, set_status_on_exception=set_status_on_exception)


def use_span(span: Span, *, end_on_exit: bool = False, record_exception: bool = True, set_status_on_exception: bool = True) -> AbstractContextManager[Span]:
    """`opentelemetry.trace.use_span`; for a span that records nothing, a plain context switch (the
    API's generator-based manager cost ~10 us a span, two spans per message and service)."""
    if span.is_recording():
        return trace.use_span(span, end_on_exit=end_on_exit, record_exception=record_exception, set_status_on_exception=set_status_on_exception)
    return _Current(span)


class _Current:
    """The current span for a block, for a span that records nothing (so has no exception to record
    and nothing to end)."""

    __slots__ = ("span", "token")

    def __init__(self, span: Span) -> None:
        self.span = span
        self.token: Token[Context] | None = None

    def __enter__(self) -> Span:
        self.token = otel_context.attach(trace.set_span_in_context(self.span))
        return self.span

    def __exit__(self, *exc: object) -> None:
        if self.token is not None:
            otel_context.detach(self.token)


def recording() -> bool:
    """Whether spans are recorded now (a span processor was added, or another provider is installed):
    a span's attributes are worth building only then (a consumer skips them per message otherwise)."""
    provider = trace.get_tracer_provider()
    return not isinstance(provider, PropagatingTracerProvider) or provider.sdk is not None


@functools.cache
def tracer() -> trace.Tracer:
    # Once per process: get_tracer costs ~0.1 ms (and a warning filter) per call, three spans per
    # claim. A tracer taken before `setup` is a proxy that follows the provider installed later.
    return trace.get_tracer("dralloc")


def inject(headers: dict[str, str], span: Span | None = None) -> dict[str, str]:
    """Add ``traceparent`` (and ``tracestate``) for `span` (default: the current span) to message
    headers, with the current context's baggage if any."""
    if _w3c_only():
        context = (span or trace.get_current_span()).get_span_context()
        if not baggage.get_all():  # (baggage: the propagators' own path)
            if context.is_valid:
                headers["traceparent"] = f"00-{context.trace_id:032x}-{context.span_id:016x}-{context.trace_flags:02x}"
                if context.trace_state:
                    headers["tracestate"] = context.trace_state.to_header()
            return headers
    propagate.inject(headers, context=trace.set_span_in_context(span) if span is not None else None)
    return headers


def extract(headers: Mapping[str, str] | None):  # -> opentelemetry.context.Context
    """The trace context a message carries (an empty context when it carries none)."""
    if _w3c_only() and headers is not None and "baggage" not in headers:
        return _extract_w3c(headers)
    return propagate.extract(dict(headers or {}))


_TRACEPARENT = TraceContextTextMapPropagator._TRACEPARENT_HEADER_FORMAT_RE


def _extract_w3c(headers: Mapping[str, str]) -> Context:
    """`TraceContextTextMapPropagator.extract`, read straight from the headers (what the default
    propagators do when a message carries no baggage), without copying them or going through the
    composite propagator: every message a consumer reads is extracted."""
    header = headers.get("traceparent")
    if not header or len(header) > TraceContextTextMapPropagator._TRACEPARENT_MAXIMUM_LENGTH:
        return propagate.extract(dict(headers)) if header else Context()  # (too long: the propagator warns)
    match = _TRACEPARENT.search(header)
    if not match:
        return Context()
    version, trace_id, span_id, flags, rest = match.groups()
    if trace_id == "0" * 32 or span_id == "0" * 16 or version == "ff" or (version == "00" and rest):
        return Context()
    state = headers.get("tracestate")
    if state is not None:
        return propagate.extract(dict(headers))  # (its length limit and parsing are the propagator's)
    parent = SpanContext(trace_id=int(trace_id, 16), span_id=int(span_id, 16), is_remote=True, trace_flags=TraceFlags(int(flags, 16)), trace_state=None)
    return trace.set_span_in_context(NonRecordingSpan(parent), Context())


@functools.cache
def _w3c_for(textmap: object) -> bool:
    propagators = getattr(textmap, "_propagators", None)
    return (
        type(textmap) is CompositePropagator
        and propagators is not None
        and [type(p) for p in propagators] in ([TraceContextTextMapPropagator, W3CBaggagePropagator], [TraceContextTextMapPropagator])
    )


def _w3c_only() -> bool:
    """The process propagates W3C trace context (and baggage) only: OpenTelemetry's default, unless
    ``OTEL_PROPAGATORS`` or a program named others. Then `inject` and `extract` read and write the
    headers themselves; otherwise the configured propagators do."""
    return _w3c_for(propagate.get_global_textmap())
