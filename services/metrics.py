"""OpenTelemetry metrics: the instruments and their exporter setup, one place.

Exported only when the standard variables ask for it (as traces, see
`dralloc.telemetry`): ``OTEL_METRICS_EXPORTER=console`` or ``otlp`` (or
``OTEL_EXPORTER_OTLP_ENDPOINT`` set); ``OTEL_METRIC_EXPORT_INTERVAL``
(milliseconds) as the SDK reads it. Without them every instrument is a no-op.

Instruments (meter ``dralloc``):

- ``dralloc.allocation.duration`` (histogram, s): a claim's decision in the
  allocator, from its handling to the decision being durable; attribute
  ``outcome``;
- ``dralloc.claims`` (counter): decisions written, by ``outcome``
  (committed, unsatisfiable, error, released);
- ``dralloc.devices.allocated`` (gauge): devices held by committed claims,
  per ``node`` and ``device_class``;
- ``dralloc.consumer.lag`` (gauge): messages of a stream not yet acked by a
  durable consumer, per ``stream`` and ``consumer``.
"""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import Iterable

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from dralloc.schemas import events as ev

log = logging.getLogger("dralloc.metrics")

_configured = False


def setup() -> None:
    """Install a meter provider with the exporter the OTEL_* variables name (once per process)."""
    global _configured
    if _configured:
        return
    _configured = True
    name = os.environ.get("OTEL_METRICS_EXPORTER", "").strip().lower()
    if not name and os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        name = "otlp"
    if name in ("", "none"):
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import ConsoleMetricExporter, PeriodicExportingMetricReader

    if name == "console":
        exporter = ConsoleMetricExporter()
    elif name == "otlp":
        try:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        except ImportError:
            log.warning("OTEL_METRICS_EXPORTER=otlp but opentelemetry-exporter-otlp is not installed; not exporting")
            return
        exporter = OTLPMetricExporter()
    else:
        log.warning("OTEL_METRICS_EXPORTER=%s is not supported (console, otlp or none); not exporting", name)
        return
    metrics.set_meter_provider(MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter)]))


class AllocatorMetrics:
    """What the allocator reports; it calls `decided` for every decision it writes or rebuilds."""

    def __init__(self) -> None:
        meter = metrics.get_meter("dralloc")
        self.duration = meter.create_histogram("dralloc.allocation.duration", unit="s", description="claim decision time in the allocator")
        self.claims = meter.create_counter("dralloc.claims", description="decisions written, by outcome")
        self._held: dict[str, Counter[tuple[str, str]]] = {}  # claim -> (node, class) -> devices
        self.lag: dict[tuple[str, str], int] = {}
        meter.create_observable_gauge("dralloc.devices.allocated", [self._observe_allocated], description="devices held by committed claims")
        meter.create_observable_gauge("dralloc.consumer.lag", [self._observe_lag], description="messages not yet acked by a durable consumer")

    def rebuilding(self) -> None:
        """A new term replays the decisions: forget what the last one knew."""
        self._held.clear()

    def decided(self, event: ev.Event, seconds: float | None = None, *, replayed: bool = False) -> None:
        if isinstance(event, ev.AllocationCommitted):
            outcome = "committed"
            self._held[event.key] = _devices(event)
        elif isinstance(event, ev.AllocationFailed):
            outcome = event.reason
        elif isinstance(event, ev.AllocationReleased):
            outcome = "released"
            self._held.pop(event.key, None)
        else:
            return
        if replayed:
            return  # decided by an earlier term: state, not news
        self.claims.add(1, {"outcome": outcome})
        if seconds is not None:
            self.duration.record(seconds, {"outcome": outcome})

    def _observe_allocated(self, options: CallbackOptions) -> Iterable[Observation]:
        total: Counter[tuple[str, str]] = Counter()
        for held in self._held.values():
            total.update(held)
        return [Observation(n, {"node": node, "device_class": cls}) for (node, cls), n in sorted(total.items())]

    def _observe_lag(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"stream": s, "consumer": c}) for (s, c), n in sorted(self.lag.items())]


_allocator: AllocatorMetrics | None = None


def allocator_metrics() -> AllocatorMetrics:
    """The process's one set of allocator instruments (observable gauges register once)."""
    global _allocator
    if _allocator is None:
        _allocator = AllocatorMetrics()
    return _allocator


def _devices(event: ev.AllocationCommitted) -> Counter[tuple[str, str]]:
    """(node, device class) -> devices of one committed claim."""
    classes = {}
    for request in event.claim.spec.devices.requests or [] if event.claim.spec and event.claim.spec.devices else []:
        if request.exactly is not None:
            classes[request.name] = request.exactly.device_class_name
        for sub in request.first_available or []:
            classes[f"{request.name}/{sub.name}"] = sub.device_class_name
    held: Counter[tuple[str, str]] = Counter()
    allocation = event.allocation
    for result in allocation.devices.results or [] if allocation and allocation.devices else []:
        held[(event.node or "", classes.get(result.request, ""))] += 1
    return held
