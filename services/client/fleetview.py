"""What `dralloc get` and `dralloc top` show: the fleet's state from bus events, as rows.

Pure: `FleetState.apply` takes the latest inventory events (nodes, slices,
classes) and decisions (committed, failed, released) with the time each was
published; the functions below turn that into rows for claims, nodes,
NVLink domains, devices, slices and classes.

Words used in the columns:

- a **GPU** is a whole accelerator (`gpu.nvidia.com` device of type `gpu`,
  or any device of another driver's class); its MIG partitions are devices
  of type `mig` whose `parentUUID` names it;
- a GPU is **used** when a claim holds it, **partitioned** when a claim holds
  one of its partitions (it cannot be allocated whole then), else **free**;
- **fragmentation** of a node or NVLink domain is the share of its GPUs that
  are free but cannot serve a claim for the whole node or domain because
  others there are used or partitioned: 0% when it is wholly free or wholly
  used, `free / total` otherwise.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from dralloc.schemas import events as ev
from dralloc.schemas.resource import Device, DeviceClass, Node, ResourceSlice
from dralloc.schemas.status import ClaimStatus, status_of

GPU_DRIVER = "gpu.nvidia.com"
NVLINK_DOMAIN = "dralloc.dev/nvlinkDomain"
RATE_WINDOW_S = 10.0
"""Decisions per second are counted over this many seconds."""


def age(since: float | None, now: float) -> str:
    """kubectl's AGE: 45s, 12m, 3h, 2d (empty when unknown)."""
    if since is None:
        return ""
    seconds = max(0, int(now - since))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size * (2 if unit != "m" else 1):
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


@dataclass(frozen=True, slots=True)
class DeviceRow:
    node: str
    driver: str
    pool: str
    name: str
    kind: str  # gpu, mig, nic, other
    product: str
    domain: str  # NVLink domain, or ""
    state: str  # free, used, partitioned
    holder: str  # the claim holding it (or one of its partitions)
    parent: str  # a partition's GPU (device name), or ""


@dataclass(slots=True)
class FleetState:
    """The latest inventory and decisions, each with when it was published (seconds since the epoch)."""

    nodes: dict[str, tuple[Node, float]] = field(default_factory=dict)
    slices: dict[tuple[str, str, str], tuple[ResourceSlice, float]] = field(default_factory=dict)
    classes: dict[str, tuple[DeviceClass, float]] = field(default_factory=dict)
    decisions: dict[str, tuple[ClaimStatus, float]] = field(default_factory=dict)
    decided_at: list[float] = field(default_factory=list)
    """When each decision (commit or failure) was published, for decisions per second (recent ones only)."""

    def apply(self, event: object, at: float | None = None) -> None:
        """Fold one bus event in; unknown kinds are ignored."""
        at = time.time() if at is None else at
        match event:
            case ev.NodePublished(node=node):
                self.nodes[node.metadata.name] = (node, at)
            case ev.NodeRemoved(name=name):
                self.nodes.pop(name, None)
            case ev.ResourceSlicePublished(slice=s):
                self.slices[(s.spec.driver, s.spec.pool.name, s.metadata.name)] = (s, at)
            case ev.ResourceSliceRemoved(name=name, driver=driver, pool=pool):
                self.slices.pop((driver, pool, name), None)
            case ev.DeviceClassPublished(device_class=cls):
                self.classes[cls.metadata.name] = (cls, at)
            case ev.DeviceClassRemoved(name=name):
                self.classes.pop(name, None)
            case ev.AllocationCommitted() | ev.AllocationFailed():
                status = status_of(event)
                previous = self.decisions.get(status.claim)
                self.decisions[status.claim] = (status, previous[1] if previous and previous[0].uid == status.uid else at)
                self.decided_at.append(at)
                cutoff = at - RATE_WINDOW_S
                while self.decided_at and self.decided_at[0] < cutoff:
                    self.decided_at.pop(0)
            case ev.AllocationReleased(namespace=namespace, name=name):
                self.decisions.pop(f"{namespace}/{name}", None)

    def rate(self, now: float) -> float:
        """Decisions per second over the last RATE_WINDOW_S seconds."""
        recent = [t for t in self.decided_at if t >= now - RATE_WINDOW_S]
        return len(recent) / RATE_WINDOW_S

    # --- devices --------------------------------------------------------------------

    def devices(self) -> list[DeviceRow]:
        """Every node-local device, with what holds it; sorted by node, driver, pool, device."""
        held: dict[tuple[str, str, str], str] = {}
        for status, _ in self.decisions.values():
            if status.state == "allocated" and status.allocation is not None:
                for r in status.allocation.devices.results:
                    held[(r.driver, r.pool, r.device)] = status.claim
        rows: list[DeviceRow] = []
        by_uuid: dict[tuple[str, str], str] = {}
        raw: list[tuple[ResourceSlice, Device]] = []
        for (driver, _pool, _), (s, _) in sorted(self.slices.items()):
            for device in s.spec.devices:
                raw.append((s, device))
                uuid = _string(device, driver, "uuid")
                if uuid:
                    by_uuid[(driver, uuid)] = device.name
        partitioned: dict[tuple[str, str, str], str] = {}
        for s, device in raw:
            parent_uuid = _string(device, s.spec.driver, "parentUUID")
            key = (s.spec.driver, s.spec.pool.name, device.name)
            if parent_uuid and key in held:
                parent = by_uuid.get((s.spec.driver, parent_uuid))
                if parent:
                    partitioned.setdefault((s.spec.driver, s.spec.pool.name, parent), held[key])
        for s, device in raw:
            node = device.node_name or s.spec.node_name or ""
            if not node:
                continue  # network-attached devices belong to no node's row
            driver, pool = s.spec.driver, s.spec.pool.name
            key = (driver, pool, device.name)
            kind = _kind(device, driver)
            parent_uuid = _string(device, driver, "parentUUID")
            parent = by_uuid.get((driver, parent_uuid), "") if parent_uuid else ""
            if key in held:
                state, holder = "used", held[key]
            elif key in partitioned:
                state, holder = "partitioned", partitioned[key]
            elif parent and (driver, pool, parent) in held:
                state, holder = "used", held[(driver, pool, parent)]  # its GPU is held whole
            else:
                state, holder = "free", ""
            product = _string(device, driver, "productName") or _string(device, driver, "profile") or _string(device, driver, "dralloc.dev/productName")
            domain = _string(device, driver, NVLINK_DOMAIN)
            rows.append(DeviceRow(node, driver, pool, device.name, kind, product, domain, state, holder, parent))
        rows.sort(key=lambda r: (r.node, r.driver, r.pool, _natural(r.name)))
        return rows


def _natural(name: str) -> tuple:
    """gpu-2 before gpu-10."""
    import re

    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def _string(device: Device, driver: str, name: str) -> str:
    """A string or version attribute: `name` qualified, or unqualified in the driver's domain."""
    keys = [name] if "/" in name else [name, f"{driver}/{name}"]
    for key in keys:
        attr = device.attributes.get(key)
        if attr is not None:
            return (attr.string if attr.string is not None else attr.version) or ""
    return ""


def _kind(device: Device, driver: str) -> str:
    if driver == GPU_DRIVER:
        return _string(device, driver, "type") or "gpu"
    if driver == "dra.net":
        return "nic"
    return "other"


# --- rows for people -----------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Usage:
    """GPUs of a node or NVLink domain: total, used, partitioned, free, fragmentation (0..1)."""

    name: str
    nodes: tuple[str, ...]
    total: int
    used: int
    partitioned: int
    free: int

    @property
    def fragmentation(self) -> float:
        if self.total == 0 or self.free in (0, self.total):
            return 0.0
        return self.free / self.total


def _gpus(rows: Iterable[DeviceRow]) -> list[DeviceRow]:
    return [r for r in rows if r.kind == "gpu"]


def _usage(name: str, rows: Sequence[DeviceRow]) -> Usage:
    states = Counter(r.state for r in rows)
    return Usage(name, tuple(sorted({r.node for r in rows})), len(rows), states["used"], states["partitioned"], states["free"])


def node_usage(state: FleetState) -> list[Usage]:
    """Per node (every node with devices or a Node object), GPU usage; sorted by name."""
    gpus = _gpus(state.devices())
    by_node: dict[str, list[DeviceRow]] = {n: [] for n in state.nodes}
    for r in gpus:
        by_node.setdefault(r.node, []).append(r)
    return [_usage(n, by_node[n]) for n in sorted(by_node, key=_natural)]


def domain_usage(state: FleetState) -> list[Usage]:
    """Per NVLink domain, GPU usage (a multi-node domain spans its nodes); sorted by name."""
    by_domain: dict[str, list[DeviceRow]] = {}
    for r in _gpus(state.devices()):
        if r.domain:
            by_domain.setdefault(r.domain, []).append(r)
    return [_usage(d, rows) for d, rows in sorted(by_domain.items(), key=lambda kv: _natural(kv[0]))]


def class_usage(state: FleetState) -> list[tuple[str, int, int, int]]:
    """Per DeviceClass: (name, devices matching, used, free), over node-local devices.

    Which devices a class matches is a function of the published classes and slices alone (no
    allocator state): evaluated here with the engine's selector library (its public face), rather
    than published by the allocator for every reader; "used" is what the decisions on the bus say."""
    from dralloc.allocator.engine import CelError, compile_selector, device_env

    rows = state.devices()
    devices = {(s.spec.driver, s.spec.pool.name, d.name): (s.spec.driver, d) for (s, _) in state.slices.values() for d in s.spec.devices}
    out = []
    for name, (cls, _) in sorted(state.classes.items()):
        try:
            selectors = [compile_selector(s.cel.expression) for s in cls.spec.selectors if s.cel is not None]
        except CelError:
            continue
        matched = used = 0
        for r in rows:
            driver, device = devices[(r.driver, r.pool, r.name)]
            env = device_env(driver, device)
            try:
                ok = all(sel.matches(env) for sel in selectors)
            except CelError:
                ok = False
            if ok:
                matched += 1
                used += r.state != "free"
        out.append((name, matched, used, matched - used))
    return out


def pending(state: FleetState) -> list[ClaimStatus]:
    """Claims whose latest decision is not an allocation, oldest first."""
    rows = [(at, s) for s, at in state.decisions.values() if s.state != "allocated"]
    return [s for _, s in sorted(rows, key=lambda x: (x[0], x[1].claim))]


def percent(value: float) -> str:
    return f"{round(value * 100)}%"
