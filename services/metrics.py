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
  that waits (services/allocator/reservations.py), per ``node``; other claims
  take them last;
- ``dralloc.consumer.lag`` (gauge): messages of a stream not yet acked by a
  durable consumer (pending + delivered unacked), per ``stream`` and
  ``consumer``; reported by the process consuming (`report_lag`): the
  allocator's ``CLAIMS``/``allocator`` while it leads, the status writer's
  ``ALLOCATIONS``/``statuswriter-<sink>``.

Free devices and fragmentation are worked out from the allocator's engine (the
allocator hands each term's engine over: `AllocatorMetrics.rebuilding`) when a
reader collects, never per claim: bitset arithmetic over the ledger's
devices in use, per node and class, and per shared counter in use (~30 ms on
59,088 devices over 1,236 nodes, 26k of them MIG partitions with no room). The
first collection of a term also evaluates each class's selectors once per
device (~2.5 s for that fleet and 3 classes; new devices only, later). The SDK collects in
its exporter thread while the allocator changes the engine on its event loop:
the views read are ints and dicts copied whole (atomic under the GIL), class
selectors are evaluated by a `Verdicts` of the metrics' own (the engine's cache
is never touched from that thread), and a collection that races a pool being
rebuilt keeps the previous numbers. A standby keeps reporting its last term's
view until it leads again.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from opentelemetry import metrics
from opentelemetry.metrics import CallbackOptions, Observation

from dralloc.schemas import events as ev

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter
    from opentelemetry.sdk.resources import Resource

    from dralloc.allocator.engine import Engine
    from dralloc.allocator.reservations import Reservations

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
        self._held: dict[str, Counter[tuple[str, str]]] = {}  # claim -> (node, class) -> devices
        self.fleet: FleetView | None = None
        self.reservations: Reservations | None = None
        """The leading term's reservations (set by the allocator at rebuild)."""
        meter.create_observable_gauge(
            "dralloc.devices.reserved", [self._observe_reserved], description="devices held for a large claim or gang that waits"
        )
        meter.create_observable_gauge("dralloc.devices.allocated", [self._observe_allocated], description="devices held by committed claims")
        meter.create_observable_gauge("dralloc.devices.free", [self._observe_free], description="devices free for a device class")
        meter.create_observable_gauge(
            "dralloc.node.fragmentation", [self._observe_node_fragmentation], description="1 - largest free NVLink block / min(free, biggest block)"
        )
        meter.create_observable_gauge(
            "dralloc.class.fragmentation", [self._observe_class_fragmentation], description="share of free devices on partly used nodes"
        )

    def rebuilding(self, engine: Engine) -> None:
        """A new term replays the decisions into a new engine: forget what the last one knew, watch this one."""
        self._held.clear()
        self.fleet = FleetView(engine)

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
        held = self.reservations.per_node() if self.reservations is not None else {}
        return [Observation(n, {"node": node}) for node, n in sorted(held.items())]

    def _snapshot(self) -> Snapshot:
        return self.fleet.snapshot() if self.fleet is not None else Snapshot()

    def _observe_free(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(n, {"node": node, "device_class": cls}) for (node, cls), n in self._snapshot().free.items()]

    def _observe_node_fragmentation(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(f, {"node": node, "device_class": cls}) for (node, cls), f in self._snapshot().node_fragmentation.items()]

    def _observe_class_fragmentation(self, options: CallbackOptions) -> Iterable[Observation]:
        return [Observation(f, {"device_class": cls}) for cls, f in self._snapshot().class_fragmentation.items()]


@dataclass
class Snapshot:
    """Free devices and fragmentation at one moment (see the module docstring for the definitions)."""

    free: dict[tuple[str, str], int] = field(default_factory=dict)  # (node, class) -> free devices
    node_fragmentation: dict[tuple[str, str], float] = field(default_factory=dict)
    class_fragmentation: dict[str, float] = field(default_factory=dict)


@dataclass(slots=True)
class _NodeClass:
    """One class's devices on one node, as bitsets shifted by the node's lowest device id."""

    devices: int
    total: int
    blocks: list[int]  # per NVLink domain (devices without one: one block)
    biggest: int


FRESH_S = 0.5
"""A snapshot serves every gauge of one collection (each has its own callback); older ones are worked out again."""


class FleetView:
    """Free devices and fragmentation of one engine's state, worked out when a reader collects."""

    def __init__(self, engine: Engine) -> None:
        from dralloc.allocator.engine.verdicts import (
            Verdicts,  # only the allocator watches an engine
        )

        self.engine = engine
        self.verdicts = Verdicts(engine.inventory)  # its own: the engine's cache belongs to the event loop
        self._last = Snapshot()
        self._taken_at = -FRESH_S
        self._nodes: dict[str, tuple[int, tuple, int, dict[str, _NodeClass]]] = {}
        """Node -> (its device bits, class versions, lowest id, class -> _NodeClass): rebuilt when either changes."""
        self._counters: tuple = (-1, {}, {}, 0)
        """(inventory version, `_counter_users` for it)."""
        self._blocked: dict[tuple, tuple[int, list[int]]] = {}
        """Counter in use -> (amount used, the devices it leaves no room for), while the amount stays."""

    def snapshot(self) -> Snapshot:
        now = time.monotonic()
        if now - self._taken_at >= FRESH_S:
            try:
                self._last = self.compute()
            except (AttributeError, KeyError, RuntimeError) as exc:  # a pool rebuilt under our feet: next time
                log.debug("metrics: free devices not worked out this time: %s", exc)
            self._taken_at = now
        return self._last

    def compute(self) -> Snapshot:
        inv = self.engine.inventory
        classes = self._class_devices()
        free = self._free()
        versions = tuple(sorted((name, inv.class_versions.get(name, 0)) for name in classes))
        out = Snapshot()
        spare: dict[str, int] = {}  # class -> free node-local devices
        stranded: dict[str, int] = {}  # class -> of those, on partly used nodes
        nodes = {}
        for node, bits in list(inv.local.items()):
            if not bits:
                continue
            cached = self._nodes.get(node)
            if cached is None or cached[0] != bits or cached[1] != versions:
                cached = (bits, versions, *self._node_classes(bits, classes))
            nodes[node] = cached
            _, _, lo, per_class = cached
            here = (free >> lo) & (bits >> lo)
            for cls, nc in per_class.items():
                mine = here & nc.devices
                n = mine.bit_count()
                out.free[(node, cls)] = n
                largest = max((mine & block).bit_count() for block in nc.blocks)
                out.node_fragmentation[(node, cls)] = 1 - largest / min(n, nc.biggest) if n else 0.0
                spare[cls] = spare.get(cls, 0) + n
                if n < nc.total:
                    stranded[cls] = stranded.get(cls, 0) + n
        self._nodes = nodes  # nodes gone are forgotten
        for cls, matched in classes.items():
            if inv.nonlocal_bits & matched:
                out.free[("", cls)] = (free & inv.nonlocal_bits & matched).bit_count()
            if cls in spare:
                out.class_fragmentation[cls] = stranded.get(cls, 0) / spare[cls] if spare[cls] else 0.0
        return out

    def _class_devices(self) -> dict[str, int]:
        """Class name -> bits of the devices its selectors accept (evaluated once per device and class version)."""
        from dralloc.allocator.engine import cel
        from dralloc.allocator.engine.plan import Alt

        inv = self.engine.inventory
        out, alts = {}, {}
        for name, cls in sorted(inv.classes.items()):
            try:
                for selector in cls.spec.selectors:
                    cel.compile_selector(selector.cel.expression if selector.cel else "")
            except cel.CelCompileError:  # a class no claim can use: it has no devices
                out[name] = 0
                continue
            version = inv.class_versions.get(name, 0)
            key = (name, version, ())
            alts[name] = alt = Alt(
                result_name=name, base=name, sub=None, cls=cls, class_version=version, selectors=(), all_mode=False,
                count=1, admin=False, tolerations=[], capacity=None, verdict_key=key, class_key=key,
            )  # fmt: skip
            self.verdicts.get(alt, 0)  # every class known before any is evaluated: one CEL environment per device serves all
        for name, alt in alts.items():
            out[name] = self.verdicts.get(alt, inv.live).matched & inv.live
        return out

    def _free(self) -> int:
        """Bits of the devices free to take (see the module docstring)."""
        from dralloc.allocator.engine.inventory import bits_of

        inv, ledger = self.engine.inventory, self.engine.ledger
        shared = [rec.id for key, shares in list(ledger.shares.items()) if shares and (rec := inv.by_key.get(key)) is not None]
        consumers, capacity, oversized = self._counter_users()
        # A device whose counter is used so far that its own amount no longer fits is not free (the
        # ledger's counter_room, worked out per counter in use rather than per device).
        blocked: set[int] = set()  # (a device consumes several counters: each once)
        cache: dict[tuple, tuple[int, list[int]]] = {}
        for key, used in list(ledger.counter_used.items()):
            hit = self._blocked.get(key)
            if hit is None or hit[0] != used:
                room = capacity.get(key, 0) - used
                hit = (used, [i for amount, i in consumers.get(key, ()) if amount > room])
            cache[key] = hit
            blocked.update(hit[1])
        self._blocked = cache
        return inv.live & ~ledger.used_bits & ~bits_of(shared) & ~bits_of(list(blocked)) & ~oversized

    def _counter_users(self) -> tuple[dict[tuple, list[tuple[int, int]]], dict[tuple, int], int]:
        """For the current inventory version: counter -> (amount, device id) of the devices consuming it,
        counter -> what it holds, and the bits of devices that need more than a counter holds at all."""
        from dralloc.allocator.engine.inventory import bits_of

        inv = self.engine.inventory
        version, *known = self._counters
        if version != inv.version:
            consumers: dict[tuple, list[tuple[int, int]]] = {}
            capacity: dict[tuple, int] = {}
            too_big = []
            for rec in list(inv.devices):
                if rec is None or not rec.consumes:
                    continue
                counters = inv.pool_of(rec).counters
                for key, amount in rec.consumes:
                    consumers.setdefault(key, []).append((amount, rec.id))
                    capacity[key] = counters.get(key, 0)
                    if amount > capacity[key]:
                        too_big.append(rec.id)
            known = [consumers, capacity, bits_of(too_big)]
            self._counters = (inv.version, *known)
            self._blocked = {}
        return known[0], known[1], known[2]

    def _node_classes(self, bits: int, classes: dict[str, int]) -> tuple[int, dict[str, _NodeClass]]:
        """A node's devices per class and NVLink domain, shifted by its lowest device id."""
        from dralloc.allocator.engine.inventory import iter_bits
        from dralloc.allocator.engine.topology import NVLINK_DOMAIN

        devices = self.engine.inventory.devices
        lo = (bits & -bits).bit_length() - 1
        per_class = {}
        for cls, matched in classes.items():
            mine = bits & matched
            if not mine:
                continue
            domains: dict[object, int] = {}
            for i in iter_bits(mine):
                domain = devices[i].attribute(NVLINK_DOMAIN)  # type: ignore[union-attr]
                domains[domain] = domains.get(domain, 0) | 1 << (i - lo)
            blocks = list(domains.values())
            per_class[cls] = _NodeClass(mine >> lo, mine.bit_count(), blocks, max(b.bit_count() for b in blocks))
        return lo, per_class


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
