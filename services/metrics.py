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
  per ``node`` and ``device_class`` (from the decisions);
- ``dralloc.devices.free`` (gauge): devices free for a class, per ``node`` and
  ``device_class``. A device counts for a class when the class's selectors
  accept it; it is free when it is in a usable pool, not held by any claim
  (exclusively or as a share of an allowMultipleAllocations device) and its
  shared counters have room for it (so a GPU with a MIG partition in use is not
  free, nor are the partitions of a GPU in use). Taints are not looked at: a
  tainted free device counts. Devices not local to one node (network-attached)
  are reported with ``node=""``, once;
- ``dralloc.node.fragmentation`` (gauge, 0..1), per ``node`` and
  ``device_class``: ``1 - largest / min(free, biggest)``, where ``largest`` is
  the most free devices of the class inside one NVLink domain of the node
  (``dralloc.dev/nvlinkDomain``; the node's devices without one are one block
  together), ``biggest`` the most devices of the class any one of its domains
  has, ``free`` as above. 0: the free devices are as close together as the
  hardware allows (a request for ``min(free, biggest)`` NVLink-connected
  devices fits); 0.5 on a node of NVLink pairs with one GPU free in each pair.
  0 when nothing is free;
- ``dralloc.class.fragmentation`` (gauge, 0..1), per ``device_class``: the
  share of the class's free node-local devices that sit on nodes partly used
  (some device of the class taken), i.e. free devices a whole-node request
  cannot have. Best fit keeps it low; 0 when nothing is free;
- ``dralloc.devices.reserved`` (gauge): devices held for a large claim or gang
  that waits (services/allocator/reservations.py), or for a Pod while the Pods
  in its way are evicted (services/allocator/evicting.py), per ``node``; other
  claims take them last;
- ``dralloc.consumer.lag`` (gauge): messages of a stream not yet acked by a
  durable consumer (pending + delivered unacked), per ``stream`` and
  ``consumer``; reported by the process consuming (`report_lag`): the
  allocator's ``CLAIMS``/``allocator`` while it leads, the status writer's
  ``ALLOCATIONS``/``statuswriter-<sink>``.

Free devices and fragmentation come from snapshots of the allocator's engine
(`Engine.snapshot`, immutable), never from its live state, and only when a
reader collects: the gauges ask the allocator's event loop for one
(`AllocatorMetrics.watch`: the allocator takes it under the lock it holds for
engine work and hands it over with its reservations per node, `observed`) and
wait up to `ASK_TIMEOUT_S` for it; a snapshot younger than `FRESH_S` serves
every gauge of a collection. A collection made on that loop itself (a test
reading in-process) cannot wait for it: it reports the last snapshot and asks
for the next. A standby keeps reporting its last term's view until it leads
again.
"""

from __future__ import annotations

import asyncio
import logging
import time
import weakref
from collections import Counter
from collections.abc import Callable, Coroutine, Iterable, Mapping
from typing import TYPE_CHECKING, Any

import msgspec
from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from dralloc.schemas import events as ev

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource

    from dralloc.allocator.engine import EngineSnapshot

log = logging.getLogger("dralloc.metrics")

_configured = False


def setup(resource: Resource | None = None, exporter: MetricExporter | None = None) -> None:
    """Install a meter provider exporting with `exporter` (once per process; none: nothing is
    installed). `dralloc.telemetry.setup` calls it with the exporter the OTEL_* variables name.

    `resource`: the process's, as its traces have it (``service.name`` dralloc-<service>); without
    it the points would say ``unknown_service`` and the allocator's lag could not be told from the
    status writer's."""
    global _configured
    if _configured:
        return
    _configured = True
    if exporter is None:
        return
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
    from opentelemetry.sdk.metrics.view import ExplicitBucketHistogramAggregation, View

    # The SDK's default buckets (0, 5, 10, ... 10000) are for milliseconds: a duration in seconds
    # would land all in the first one. (A view, not the histogram's advisory: that needs SDK 1.30.)
    seconds = View(instrument_name="dralloc.allocation.duration", aggregation=ExplicitBucketHistogramAggregation(DURATION_BUCKETS_S))
    metrics.set_meter_provider(MeterProvider(metric_readers=[PeriodicExportingMetricReader(exporter)], resource=resource, views=[seconds]))


DURATION_BUCKETS_S = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
"""Bucket boundaries of ``dralloc.allocation.duration`` (seconds): sub-millisecond decisions up to stalls."""


class AllocatorMetrics:
    """What the allocator reports; it calls `decided` for every decision it writes or rebuilds."""

    def __init__(self) -> None:
        meter = metrics.get_meter("dralloc")
        self.duration = meter.create_histogram("dralloc.allocation.duration", unit="s", description="claim decision time in the allocator")
        self.claims = meter.create_counter("dralloc.claims", description="decisions written, by outcome")
        self._held: dict[str, dict[tuple[str, str], int]] = {}  # claim -> (node, class) -> devices
        self.view = FleetReadings()
        """What the exporter thread reads: replaced whole (one reference) by `observed`, never changed."""
        self._view_at = -FRESH_S
        self._source: tuple[Callable[[], Callable[[], Coroutine[Any, Any, None]] | None], asyncio.AbstractEventLoop] | None = None
        """(the observer, held weakly: see `watch`; its loop)."""
        self._asked: asyncio.Future[None] | None = None
        meter.create_observable_gauge("dralloc.devices.reserved", [self._observe_reserved], description="devices held for a large claim or gang that waits")
        meter.create_observable_gauge("dralloc.devices.allocated", [self._observe_allocated], description="devices held by committed claims")
        meter.create_observable_gauge("dralloc.devices.free", [self._observe_free], description="devices free for a device class")
        meter.create_observable_gauge(
            "dralloc.node.fragmentation", [self._observe_node_fragmentation], description="1 - largest free NVLink block / min(free, biggest block)"
        )
        meter.create_observable_gauge(
            "dralloc.class.fragmentation", [self._observe_class_fragmentation], description="share of free devices on partly used nodes"
        )

    def rebuilding(self) -> None:
        """A new term replays the decisions into a new engine: forget the claims the last one held (its
        fleet view stays until the new term hands one over)."""
        self._held.clear()

    def watch(self, observe: Callable[[], Coroutine[Any, Any, None]], loop: asyncio.AbstractEventLoop) -> None:
        """The leading allocator: `observe()`, run on `loop`, takes a snapshot and calls `observed`.
        A bound method is held weakly: an ended term's allocator, and its engine (a fleet's memory),
        must not live on in the gauges until the next term watches (#17 item 4)."""
        held: Callable[[], Callable[[], Coroutine[Any, Any, None]] | None]
        held = weakref.WeakMethod(observe) if hasattr(observe, "__self__") else (lambda: observe)
        self._source = (held, loop)

    def observed(self, snapshot: EngineSnapshot, reserved: Mapping[str, int]) -> None:
        """The owner of the engine hands over a snapshot of it (taken with ``fleet=True``) and its devices
        reserved per node; from then on the gauges report those."""
        self.view = fleet_readings(snapshot, reserved)
        self._view_at = time.monotonic()

    def _fresh(self) -> FleetReadings:
        """The view for a collection: the last one if young enough, else a new one from the allocator's loop."""
        source = self._source
        if source is None or time.monotonic() - self._view_at < FRESH_S:
            return self.view
        held, loop = source
        observe = held()
        if observe is None or loop.is_closed():  # the term's allocator or loop is gone (a standby, or a test's): its last view stands
            return self.view
        try:
            on_loop = asyncio.get_running_loop() is loop
        except RuntimeError:
            on_loop = False
        if on_loop:  # the loop cannot wait for itself: the next collection gets what this one asks for
            if self._asked is None or self._asked.done():
                self._asked = asyncio.ensure_future(observe())
            return self.view
        asked = asyncio.run_coroutine_threadsafe(observe(), loop)
        try:
            asked.result(timeout=ASK_TIMEOUT_S)
        except TimeoutError:  # engine work holds the lock (a long search): report the last view this time
            asked.cancel()
            log.debug("metrics: no engine snapshot within %.1f s; the last one is reported", ASK_TIMEOUT_S)
        return self.view

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
        for held in list(self._held.values()):
            total.update(held)
        return [Observation(n, {"node": node, "device_class": cls}) for (node, cls), n in sorted(total.items())]

    def _observe_reserved(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"node": node}) for node, n in self._fresh().reserved]

    def _observe_free(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"node": node, "device_class": cls}) for (node, cls), n in self._fresh().free]

    def _observe_node_fragmentation(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(f, {"node": node, "device_class": cls}) for (node, cls), f in self._fresh().node_fragmentation]

    def _observe_class_fragmentation(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(f, {"device_class": cls}) for cls, f in self._fresh().class_fragmentation]


class FleetReadings(msgspec.Struct, frozen=True):
    """The fleet gauges' values at one snapshot (see the module docstring for the definitions)."""

    free: tuple[tuple[tuple[str, str], int], ...] = ()
    """((node, class), free devices); node "" for devices not local to one node."""
    node_fragmentation: tuple[tuple[tuple[str, str], float], ...] = ()
    class_fragmentation: tuple[tuple[str, float], ...] = ()
    reserved: tuple[tuple[str, int], ...] = ()
    """(node, devices reserved for a waiting claim or gang)."""


def fleet_readings(snapshot: EngineSnapshot, reserved: Mapping[str, int]) -> FleetReadings:
    """The gauges' values from an engine snapshot and the reservations per node (pure)."""
    spare: dict[str, int] = {}  # class -> free node-local devices
    stranded: dict[str, int] = {}  # class -> of those, on partly used nodes
    for u in snapshot.usage:
        spare[u.device_class] = spare.get(u.device_class, 0) + u.free
        if u.free < u.total:
            stranded[u.device_class] = stranded.get(u.device_class, 0) + u.free
    return FleetReadings(
        free=tuple(((u.node, u.device_class), u.free) for u in snapshot.usage) + tuple((("", cls), n) for cls, n in snapshot.nonlocal_free),
        node_fragmentation=tuple(((u.node, u.device_class), u.fragmentation) for u in snapshot.usage),
        class_fragmentation=tuple((cls, stranded.get(cls, 0) / n if n else 0.0) for cls, n in sorted(spare.items())),
        reserved=tuple(sorted(reserved.items())),
    )


FRESH_S = 0.5
"""A snapshot this young serves a collection (each gauge has its own callback: one snapshot serves all)."""

ASK_TIMEOUT_S = 2.0
"""How long a collection waits for the allocator's loop to hand a snapshot over."""


class ConsumerLag:
    """The ``dralloc.consumer.lag`` gauge: what `report_lag` last saw per (stream, consumer)."""

    def __init__(self) -> None:
        self.backlog: dict[tuple[str, str], int] = {}
        metrics.get_meter("dralloc").create_observable_gauge(
            "dralloc.consumer.lag", [self._observe], description="messages not yet acked by a durable consumer"
        )

    def _observe(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"stream": s, "consumer": c}) for (s, c), n in sorted(self.backlog.items())]


_lag: ConsumerLag | None = None


def consumer_lag() -> ConsumerLag:
    """The process's one lag gauge (every durable consumer of the process reports into it)."""
    global _lag
    if _lag is None:
        _lag = ConsumerLag()
    return _lag


_allocator: AllocatorMetrics | None = None


def allocator_metrics() -> AllocatorMetrics:
    """The process's one set of allocator instruments (observable gauges register once)."""
    global _allocator
    if _allocator is None:
        _allocator = AllocatorMetrics()
    return _allocator


def _devices(event: ev.AllocationCommitted) -> dict[tuple[str, str], int]:
    """(node, device class) -> devices of one committed claim. A dict, not a Counter: this runs on the
    allocator's event loop for every commit, and a Counter's construction and `+=` cost ~4 us of
    the ~6.7 us it took (timeit, loaded)."""
    classes = {}
    for request in event.claim.spec.devices.requests or [] if event.claim.spec and event.claim.spec.devices else []:
        if request.exactly is not None:
            classes[request.name] = request.exactly.device_class_name
        for sub in request.first_available or []:
            classes[f"{request.name}/{sub.name}"] = sub.device_class_name
    held: dict[tuple[str, str], int] = {}
    allocation = event.allocation
    for result in allocation.devices.results or [] if allocation and allocation.devices else []:
        key = (event.node or "", classes.get(result.request, ""))
        held[key] = held.get(key, 0) + 1
    return held
