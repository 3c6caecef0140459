"""OpenTelemetry setup and W3C trace-context propagation over NATS headers: one place.

A tracer provider is always installed (so trace context is real and travels
with every message: one trace per claim across the four services), but spans
are exported only when the standard variables ask for it:

- ``OTEL_TRACES_EXPORTER=console`` prints spans to stderr;
- ``OTEL_TRACES_EXPORTER=otlp`` (or ``OTEL_EXPORTER_OTLP_ENDPOINT`` set) sends
  them with the OTLP exporter, if ``opentelemetry-exporter-otlp`` is installed;
- unset or ``none``: nothing leaves the process.

``OTEL_SERVICE_NAME`` and ``OTEL_RESOURCE_ATTRIBUTES`` are read by the SDK as usual.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Mapping

from opentelemetry import propagate, trace

log = logging.getLogger("dralloc.telemetry")

_configured = False


def setup(service_name: str) -> None:
    """Install the tracer provider once per process (later calls are no-ops)."""
    global _configured
    if _configured:
        return
    _configured = True
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter

    attributes = {"service.name": os.environ.get("OTEL_SERVICE_NAME") or f"dralloc-{service_name}"}
    provider = TracerProvider(resource=Resource.create(attributes))
    exporter_name = os.environ.get("OTEL_TRACES_EXPORTER", "").strip().lower()
    if not exporter_name and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        exporter_name = "otlp"
    if exporter_name == "console":
        provider.add_span_processor(BatchSpanProcessor(ConsoleSpanExporter()))
    elif exporter_name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError:
            log.warning("OTEL_TRACES_EXPORTER=otlp but opentelemetry-exporter-otlp is not installed; not exporting")
        else:
            provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    from dralloc import metrics  # the same OTEL_* rules for metrics (dralloc.metrics)

    metrics.setup()


@functools.cache
def tracer() -> trace.Tracer:
    # Once per process: get_tracer costs ~0.1 ms (and a warning filter) per call, three spans per
    # claim. A tracer taken before `setup` is a proxy that follows the provider installed later.
    return trace.get_tracer("dralloc")


def inject(headers: dict[str, str]) -> dict[str, str]:
    """Add ``traceparent`` (and ``tracestate``) for the current span to message headers."""
    propagate.inject(headers)
    return headers


def extract(headers: Mapping[str, str] | None):  # -> opentelemetry.context.Context
    """The trace context a message carries (an empty context when it carries none)."""
    return propagate.extract(dict(headers or {}))
