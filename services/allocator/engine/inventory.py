"""The inventory: nodes, device classes and ResourceSlices grouped into pools.

Slices are grouped by (driver, pool name). Only the newest generation of a
pool counts; a pool is usable when all `resourceSliceCount` slices of that
generation are present (complete) and it is consistent (valid: unique device
names, unique counter sets, every consumed counter exists). Devices of usable
pools become `DeviceRec`s with an integer id, so that sets of devices are
Python ints used as bitsets (`&`, `|`, `bit_count()`).

Ids are handed out when a pool is (re)built and never reused: every cache
keyed by id (selector verdicts, node masks) is therefore automatically
invalidated for the devices of a changed slice, and only for those.
"""

from __future__ import annotations

import functools
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dralloc.allocator.engine import projector
from dralloc.allocator.engine.repeats import Repeats
from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import (
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceClass,
    DeviceTaint,
    DeviceTaintRule,
    Node,
    NodeSelector,
    ResourceSlice,
)

AttrValue = tuple[str, Any]
"""A typed attribute value: ("string", "x"), ("int", 3), ("bool", True), ("version", "1.2.3"),
or a list attribute (KEP-5491) as ("strings", ("a", "b")), ("ints", (1, 2)), ("bools", ...), ("versions", ...)."""

_KINDS = ("string", "int", "bool", "version", "strings", "ints", "bools", "versions")

# The engine's composite keys are typed as tuples of any length, not `tuple[str, str, str]`: the
# native build (mypyc) keeps a fixed-length tuple unboxed, its items in separate fields, and boxes
# a new tuple each time one is used as a dict key (allocated, hashed, compared item by item with
# the key it finds); a tuple of any length stays the one object it was made as. On churn-mixed that
# re-boxing was ~10% of a claim's instructions (the counters and device keys of every MIG slice
# and shared GPU a claim passes).
DevKey = tuple[str, ...]
"""(driver, pool, device name): the identity of a device the ledger records."""
CounterKey = str
"""(driver, pool, counter set, counter) as one string (`counter_key`): counters belong to one
driver's pool. A string, not a tuple: a string keeps its hash, a tuple is hashed again item by item
at every lookup, and the ledger looks a MIG slice's dozen counters up whenever its room is asked."""
CounterSetKey = str
"""(driver, pool, counter set) as one string (`counter_key`); a pool maps each counter's key to
its set's (`Pool.counter_sets`)."""
DeviceKind = str
"""A driver and NVIDIA-style `type` (`device_kind`): what best fit counts free devices of
(placement.py). One string, as counter keys are: its hash is kept, where a tuple's is made again
at each of the half dozen lookups a charge makes per device."""


def device_kind(driver: str, type_: str) -> DeviceKind:
    """The kind of a driver's devices of a `type`: ``<length of driver>:<driver>/<type>``, the
    length first so that no two pairs make one kind whatever a driver's name holds. Each made
    once (`_DEVICE_KINDS`): the records of a fleet share a few."""
    by_type = _DEVICE_KINDS.get(driver)
    if by_type is None:
        if len(_DEVICE_KINDS) >= DEVICE_KINDS_KEPT:  # (hostile slices may name any number: made again when needed)
            _DEVICE_KINDS.clear()
        by_type = _DEVICE_KINDS[driver] = {}
    kind = by_type.get(type_)
    if kind is None:
        if len(by_type) >= DEVICE_KINDS_KEPT:
            by_type.clear()
        kind = by_type[type_] = f"{len(driver)}:{driver}/{type_}"
    return kind


_DEVICE_KINDS: dict[str, dict[str, DeviceKind]] = {}
"""Driver -> type -> its kind (`device_kind`)."""

DEVICE_KINDS_KEPT = 10_000
"""Drivers, and types of one driver, whose kinds `_DEVICE_KINDS` keeps before it starts over."""


def counter_key(*parts: str) -> str:
    """A CounterKey or CounterSetKey of its parts: a JSON array, so that no two sets of names make
    one key, whatever the names hold (`counter_parts` reads it back)."""
    return msgspec.json.encode(parts).decode()


def counter_prefix(driver: str, pool: str) -> str:
    """How every `counter_key` of the pool's counters and sets starts (the array's first two items
    and its comma): a key's pool, told without decoding the key."""
    return counter_key(driver, pool)[:-1] + ","


def counter_parts(key: str) -> list[str]:
    """The names a `counter_key` was made of (for messages and a pool's removal, not per claim)."""
    return msgspec.json.decode(key, type=list[str])


_MISSING = object()

NOT_YET: Any = object()
"""A DeviceRec field computed on first use that has not been yet (`default_use`)."""


@dataclass(slots=True)
class Capacity:
    """One device capacity, its value and request policy, all in nano-units."""

    name: str  # as the device publishes it (the name written into consumedCapacity)
    value: int
    default: int | None = None
    valid_values: tuple[int, ...] = ()
    range_min: int | None = None
    range_max: int | None = None
    range_step: int | None = None
    has_policy: bool = False


class CounterClock:
    """A counter set's count of changes to what the ledger uses of it (`Ledger._counters` advances
    it), one per set of a pool as built (a rebuilt pool has new ones): the devices drawing on that
    set alone keep `Ledger.counter_room`'s answer with the count it was worked out at."""

    def __init__(self) -> None:
        self.changes = 0


class DeviceRec:
    """A device of a usable pool, with everything allocation needs precomputed.

    A plain class with its own `__init__`, not a dataclass: compiled, a dataclass's generated
    `__init__` runs interpreted, ~10,000 instructions a device of a fleet's load."""

    __slots__ = (
        "id",
        "driver",
        "pool",
        "slice",
        "name",
        "spec",
        "binding",
        "local_node",
        "node_selector",
        "all_nodes",
        "taints",
        "consumes",
        "counter_set",
        "clock",
        "capacity",
        "multi",
        "binds_to_node",
        "representable",
        "memo",
        "key",
        "consume_totals",
        "room_at",
        "room_ok",
        "default_use",
        "kind",
    )

    def __init__(
        self,
        *,
        id: int,
        driver: str,
        pool: str,
        slice: str,
        name: str,
        spec: Device,
        binding: bool,
        local_node: str | None,
        node_selector: NodeSelector | None,
        all_nodes: bool,
        taints: tuple[DeviceTaint, ...],
        consumes: tuple[tuple[CounterKey, int], ...],
        counter_set: CounterSetKey | None,
        clock: CounterClock | None,
        capacity: dict[str, Capacity],
        multi: bool,
        binds_to_node: bool,
        representable: bool,
        memo: AttributeMemo | None = None,
    ) -> None:
        self.id = id
        self.driver = driver
        self.pool = pool
        self.slice = slice
        self.name = name
        self.spec = spec
        self.binding = binding
        """A device of a pool with binding conditions (its candidates come last: `order`)."""
        self.local_node = local_node
        """Set for node-local devices (slice or per-device nodeName)."""
        self.node_selector = node_selector
        self.all_nodes = all_nodes
        self.taints = taints
        """Only the effects that need a toleration: the slice's, then DeviceTaintRules' (by rule name)."""
        self.consumes = consumes
        self.counter_set = counter_set
        """The one counter set `consumes` draws on (None: none, or several)."""
        self.clock = clock
        """That set's clock (`Ledger.counter_room` keeps its answer against it)."""
        self.capacity = capacity
        """Fully-qualified name -> capacity."""
        self.multi = multi
        """allowMultipleAllocations."""
        self.binds_to_node = binds_to_node
        self.representable = representable
        """Whether Kubernetes can represent it (`projector.representable`: a CEL environment of it
        builds), which a shared verdict needs of every device it reads (verdicts.py)."""
        self.memo = memo
        """The inventory's memo of attribute lookups (None: look up every time)."""
        self.key: DevKey = (driver, pool, name)
        """(driver, pool, name): the identity the ledger records (set once, read per candidate)."""
        totals: dict[CounterKey, int] = {}
        for counter, amount in consumes:
            totals[counter] = totals.get(counter, 0) + amount
        # each counter named once (the usual case): the totals are `consumes` itself, not a copy
        self.consume_totals: tuple[tuple[CounterKey, int], ...] = consumes if len(totals) == len(consumes) else tuple(totals.items())
        """`consumes` summed per counter (a counter named twice counts twice): what the counter bound reads."""
        self.room_at = -1
        """The `clock`'s count when `room_ok` was worked out (-1: never): `Ledger.counter_room`'s
        answer, kept on the device (a dict of answers per set cost a tuple hash a lookup, per MIG
        slice a claim's filters pass). One ledger reads and writes it (the engine's)."""
        self.room_ok = False
        self.default_use: Any = NOT_YET
        """What a request without capacity requests consumes of it (plan.consumed_capacity; computed
        once, on first use; read-only: shared by every such request)."""
        type_ = spec.attributes.get("type")
        self.kind: DeviceKind = device_kind(driver, type_.string if type_ is not None and type_.string else "")
        """Its driver and NVIDIA-style `type` (gpu, mig, nic, ...): what best fit counts (placement.py
        `KindIndex`), read at every charge of it (looked up from its attributes there, ~0.3 us)."""

    def __repr__(self) -> str:
        return f"DeviceRec({self.id}, {self.label})"

    @property
    def order(self) -> tuple[bool, str, str, str, str]:
        """The deterministic candidate order: binding-condition pools last, then driver, pool,
        slice and device name. Made on each read (only sorts read it): kept on every device,
        this tuple was ~80 bytes a device, 43 MB at 250,000 GPUs."""
        return (self.binding, self.driver, self.pool, self.slice, self.name)

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.pool}/{self.name}"

    def attribute(self, qualified: str) -> AttrValue | None:
        """Look an attribute up the way Kubernetes constraints do: the fully-qualified
        name first, then the bare name when the domain is the device's driver."""
        memo = self.memo
        if memo is None:
            return lookup_attribute(self, qualified)
        column = memo.column(qualified, self.id)
        hit = column[self.id]
        if hit is _MISSING:
            hit = column[self.id] = memo.share(lookup_attribute(self, qualified))
        found: AttrValue | None = hit  # (what `lookup_attribute` gave for this name)
        return found

    def values(self, qualified: str) -> tuple[AttrValue, ...] | None:
        """The attribute as the set matchAttribute and distinctAttribute compare (KEP-5491):
        a scalar is a one-element set, a list its distinct entries in list order, each typed
        (("int", 1) never equals ("string", "1")); None when the device lacks the attribute.
        A tuple, not a set: candidate order tries values in a deterministic order."""
        memo = self.memo
        column = memo.column((qualified,), self.id) if memo is not None else None  # beside `attribute`'s, under a key no name can be
        hit: Any = column[self.id] if column is not None else _MISSING
        if hit is _MISSING:
            hit = value_set(self.attribute(qualified))
            if column is not None and memo is not None:
                hit = column[self.id] = memo.share(hit)
        found: tuple[AttrValue, ...] | None = hit  # (the value set of that attribute)
        return found


class AttributeMemo:
    """What `DeviceRec.attribute` and `values` found, per attribute name a list indexed by device
    id, and each distinct answer kept once: a fleet's devices repeat a few values (productName,
    NVLink domains of 8), so the memo costs a list slot per device and name looked up, not a dict
    per device. Ids are never reused (inventory.py), so a removed device's slot is never read."""

    __slots__ = ("_columns", "_shared")

    def __init__(self) -> None:
        self._columns: dict[str | tuple[str], list[Any]] = {}
        self._shared: dict[Any, Any] = {}

    def column(self, key: str | tuple[str], device: int) -> list[Any]:
        """The name's list, long enough to hold `device` (new slots: not looked up yet)."""
        column = self._columns.get(key)
        if column is None:
            column = self._columns[key] = []
        if len(column) <= device:
            column.extend([_MISSING] * (device + 1 - len(column) + (len(column) >> 3)))
        return column

    def share(self, value: Any) -> Any:
        """The one instance kept of an equal answer (answers are tuples of typed values; an
        unhashable one is kept as it is). Forgotten past MEMO_SHARED distinct answers."""
        if value is None:
            return None
        try:
            same = self._shared.setdefault(value, value)
        except TypeError:
            return value
        if len(self._shared) > MEMO_SHARED:
            self._shared.clear()
        return same


MEMO_SHARED = 1_000_000
"""Distinct attribute answers `AttributeMemo` keeps one instance of before it starts over."""


def _attribute(rec: DeviceRec, qualified: str) -> DeviceAttribute | None:
    """The device's attribute named `qualified` (``domain/name``; the bare name for its own
    driver's domain), or None."""
    attrs = rec.spec.attributes
    attr = attrs.get(qualified)
    if attr is None:
        domain, sep, ident = qualified.partition("/")
        if sep and domain == rec.driver:
            attr = attrs.get(ident)
    return attr


def lookup_attribute(rec: DeviceRec, qualified: str) -> AttrValue | None:
    """`DeviceRec.attribute` without its memo: for a caller that looks a name up once per device
    (the memo would only keep it alive)."""
    attr = _attribute(rec, qualified)
    if attr is None:
        return None
    for kind in _KINDS:
        value = getattr(attr, kind)
        if value is not None:
            return (kind, tuple(value)) if isinstance(value, list) else (kind, value)
    return None


def value_set(attr: AttrValue | None) -> tuple[AttrValue, ...] | None:
    """An attribute (`lookup_attribute`'s answer) as the set of values matchAttribute and
    distinctAttribute compare: `DeviceRec.values`, for an answer in hand."""
    if attr is None:
        return None
    if attr[0].endswith("s"):
        kind = attr[0][:-1]
        return tuple(dict.fromkeys((kind, v) for v in attr[1]))
    return (attr,)


def attribute_value(rec: DeviceRec, qualified: str) -> Any:
    """`lookup_attribute(rec, qualified)`'s value, None when the device lacks the attribute: read
    straight from a string or int attribute (what topology attributes are: a dict get and two
    field reads, not a walk over every kind; topology.py asks ~5 per device of every node built)."""
    attr = _attribute(rec, qualified)
    if attr is None:
        return None
    value: str | int | None = attr.string
    if value is None:
        value = attr.int
    if value is None:  # another kind (bool, version, a list)
        found = lookup_attribute(rec, qualified)
        return found[1] if found is not None else None
    return value


@dataclass(slots=True)
class Pool:
    driver: str
    name: str
    generation: int = 0
    slices: list[ResourceSlice] = field(default_factory=list)
    expected: int = 0  # resourceSliceCount
    invalid: str | None = None
    devices: list[DeviceRec] = field(default_factory=list)
    counters: dict[CounterKey, int] = field(default_factory=dict)
    counter_sets: dict[CounterKey, CounterSetKey] = field(default_factory=dict)
    """Each counter's set, by the counter's key."""
    clocks: dict[CounterSetKey, CounterClock] = field(default_factory=dict)
    """Each counter set's clock (`CounterClock`), by its key."""
    _nodes: frozenset[str | None] | None = None

    def nodes(self) -> frozenset[str | None]:
        """The nodes the pool's devices are local to (None: a device local to no node); cached
        (a pool's devices are fixed once built: a change builds a new Pool)."""
        if self._nodes is None:
            self._nodes = frozenset(rec.local_node for rec in self.devices)
        return self._nodes

    @property
    def label(self) -> str:
        return f"{self.driver}/{self.name}"

    @property
    def complete(self) -> bool:
        return len(self.slices) == self.expected

    @property
    def usable(self) -> bool:
        return self.complete and self.invalid is None


def node_selector_matches(selector: NodeSelector | None, node: str, labels: dict[str, str]) -> bool:
    """core/v1 NodeSelector semantics: terms are ORed, requirements in a term ANDed;
    an empty term matches nothing."""
    if selector is None:
        return False
    for term in selector.node_selector_terms:
        if not term.match_expressions and not term.match_fields:
            continue
        if all(_requirement(r.key, r.operator, r.values, labels) for r in term.match_expressions) and all(
            _requirement(r.key, r.operator, r.values, {"metadata.name": node}) for r in term.match_fields
        ):
            return True
    return False


def _requirement(key: str, op: str, values: list[str], labels: dict[str, str]) -> bool:
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op == "Exists":
        return present
    if op == "DoesNotExist":
        return not present
    if op in ("Gt", "Lt") and present and len(values) == 1:
        try:
            have, want = int(labels[key]), int(values[0])
        except ValueError:
            return False
        return have > want if op == "Gt" else have < want
    return False


def _capacities(driver: str, device: Device) -> dict[str, Capacity]:
    """Capacities by fully-qualified name; an entry qualified with the driver's own
    domain wins over a bare one of the same name (as Kubernetes resolves them).

    The result is shared by every device publishing the same capacities (a fleet's GPUs
    and MIG partitions repeat a few maps over hundreds of thousands of devices) and must
    not be changed by its users."""
    if not device.capacity:
        return {}
    return _parsed_capacities(driver, msgspec.json.encode(device.capacity))


class CapacityMaps:
    """`_capacities` per capacity map instance: `Repeats.share` points every namesake of a fleet's
    devices at one equal map, so a map seen before costs a dict lookup, not its encoding and the
    parse cache's hashing of it (~2 us a device, asked twice: validation and build). The map is
    kept with its answer, so its id is not reused while remembered; applied slices are the
    inventory's (`Inventory.apply_slice`), never changed after, so an instance's answer holds."""

    __slots__ = ("_seen",)

    def __init__(self) -> None:
        self._seen: dict[int, tuple[dict[str, DeviceCapacity], str, dict[str, Capacity]]] = {}

    def of(self, driver: str, device: Device) -> dict[str, Capacity]:
        """`_capacities(driver, device)` (ValueError for a malformed quantity, not remembered)."""
        capacity = device.capacity
        if not capacity:
            return {}
        hit = self._seen.get(id(capacity))
        if hit is not None and hit[0] is capacity and hit[1] == driver:
            return hit[2]
        parsed = _capacities(driver, device)
        if len(self._seen) >= CAPACITY_MAPS_KEPT:
            self._seen.clear()
        self._seen[id(capacity)] = (capacity, driver, parsed)
        return parsed


CAPACITY_MAPS_KEPT = 4096
"""Capacity map instances `CapacityMaps` remembers before it starts over (a fleet's namesakes share
a few hundred; this bounds what a hostile one costs)."""


@functools.lru_cache(maxsize=4096)
def _parsed_capacities(driver: str, encoded: bytes) -> dict[str, Capacity]:
    """`_capacities` of one encoded capacity map (errors are raised, not cached)."""
    capacity = msgspec.json.decode(encoded, type=dict[str, DeviceCapacity])
    out: dict[str, Capacity] = {}
    prefix = driver + "/"
    items = sorted(capacity.items(), key=lambda kv: not kv[0].startswith(prefix))
    for name, cap in items:
        fq = name if "/" in name else prefix + name
        if fq in out:
            continue
        rec = Capacity(name=name, value=parse_quantity(cap.value))
        policy = cap.request_policy
        if policy is not None:
            rec.has_policy = True
            if policy.default is not None:
                rec.default = parse_quantity(policy.default)
            rec.valid_values = tuple(parse_quantity(v) for v in policy.valid_values)
            if policy.valid_range is not None:
                rec.range_min = parse_quantity(policy.valid_range.min)
                if policy.valid_range.max is not None:
                    rec.range_max = parse_quantity(policy.valid_range.max)
                if policy.valid_range.step is not None:
                    rec.range_step = parse_quantity(policy.valid_range.step)
        out[fq] = rec
    return out


_TOLERATION_NEEDED = ("NoSchedule", "NoExecute")

NODE_MASKS_KEPT = 1024
"""Fleet-wide bitsets of node masks kept (`Inventory.node_mask`); the rest are rebuilt on use."""

POOL_NAMES_IN_TUPLE = 8
"""Slice names of a pool kept in a tuple before a set (`Inventory._pool_slices`)."""


class LocalMasks:
    """Node -> its node-local devices, each node's ids stored as a bitset shifted by the node's
    lowest id: a node's devices have neighbouring ids (a pool's are handed out together), so its
    mask stays a few words long instead of as long as the fleet (nodes x devices bits in all)."""

    __slots__ = ("_spans",)

    def __init__(self) -> None:
        self._spans: dict[str, tuple[int, int]] = {}  # node -> (lowest id, bits shifted by it)

    def get(self, node: str, default: int = 0) -> int:
        """The node's devices as a fleet-wide bitset (built on each call: keep it only briefly)."""
        span = self._spans.get(node)
        return span[1] << span[0] if span is not None else default

    def span(self, node: str) -> tuple[int, int]:
        """(lo, bits): the node's devices are the ids `lo + i` for the set bits `i` of `bits`."""
        return self._spans.get(node, (0, 0))

    def ids(self, node: str) -> Iterator[int]:
        """The node's device ids, lowest first."""
        lo, bits = self._spans.get(node, (0, 0))
        return (lo + i for i in iter_bits(bits))

    def nodes(self) -> list[str]:
        """Nodes with node-local devices."""
        return [node for node, (_, bits) in self._spans.items() if bits]

    def add(self, node: str, devices: list[int]) -> None:
        """Add the node's new devices (a pool's: one update of the node's mask for them all)."""
        low = min(devices)
        lo, bits = self._spans.get(node, (low, 0))
        if not bits:
            lo = low
        elif low < lo:  # (ids only grow, but a caller may index out of order)
            bits, lo = bits << (lo - low), low
        for device in devices:
            bits |= 1 << (device - lo)
        self._spans[node] = (lo, bits)

    def discard(self, node: str, device: int) -> None:
        span = self._spans.get(node)
        if span is not None and device >= span[0]:
            self._spans[node] = (span[0], span[1] & ~(1 << (device - span[0])))


class Inventory:
    """Everything known about devices. Mutated only through apply/remove."""

    def __init__(self) -> None:
        self.classes: dict[str, DeviceClass] = {}
        self.class_versions: dict[str, int] = {}
        self.slices: dict[str, ResourceSlice] = {}
        self.pools: dict[tuple[str, str], Pool] = {}
        self._pool_slices: dict[tuple[str, str], tuple[str, ...] | set[str]] = {}
        """Pool -> its slices' names: a tuple while a few (a node's pool has one or two slices: a set
        is 216 bytes, a tuple 48-56; ~18 MB at 250,000 GPUs), a set past POOL_NAMES_IN_TUPLE."""
        self.devices: list[DeviceRec | None] = []
        self.by_key: dict[DevKey, DeviceRec] = {}
        self.live = 0  # ids of devices in usable pools
        self.multi_bits = 0
        # nodes: rank order is the order nodes are first seen (the CLI registers them sorted)
        self.node_labels: dict[str, dict[str, str]] = {}
        self.node_rank: dict[str, int] = {}
        self.node_names: list[str] = []
        self.node_known: set[str] = set()  # from Node objects or a slice/device nodeName
        self.local = LocalMasks()  # node -> its node-local devices
        self.nonlocal_bits = 0
        self.version = 0  # bumped on every change
        self.nonlocal_version = 0
        self._local_version: dict[str, int] = {}
        self._node_ids: dict[str, tuple[tuple[int, int], list[int]]] = {}
        """Node -> (stamp, ids of the devices usable from it in candidate order): kept for every node."""
        self._node_bits: OrderedDict[str, tuple[tuple[int, int], int]] = OrderedDict()
        """Node -> (stamp, the same as a fleet-wide bitset): the most recently used NODE_MASKS_KEPT only
        (a node's bitset is as long as the fleet's highest id: one per node would grow with nodes x devices)."""
        self._next_id = 0
        self.attribute_memo = AttributeMemo()
        self.repeats = Repeats()  # one instance of each repeated attribute value and capacity map
        self.capacity_maps = CapacityMaps()  # the parsed capacities of each shared capacity map
        self._slice_checks: dict[str, SliceCheck] = {}
        """Slice name -> what validating its pool needs of it (`SliceCheck`), kept while its pool is
        incomplete: a pool arriving as several slices is validated at each, each slice read once."""
        self._known_list: list[str] | None = None
        self.unusable: dict[tuple[str, str], Pool] = {}  # pools seen but not used (incomplete or invalid)
        self.taint_rules: dict[str, DeviceTaintRule] = {}
        self.on_pool_rebuilt: list[Any] = []  # callbacks(pool, old_devices)
        self.on_node_changed: list[Callable[[str], None]] = []  # callbacks(node): its Node object came, changed or went

    # --- nodes ---------------------------------------------------------------------

    def rank_of(self, name: str) -> int:
        """The node's rank (its bit in the engine's node bitsets), given now if it has none yet: a
        node is ranked when first named, by a Node object, a slice or a record of the ledger."""
        rank = self.node_rank.get(name)
        if rank is None:
            rank = self.node_rank[name] = len(self.node_names)
            self.node_names.append(name)
        return rank

    def register_nodes(self, names: list[str]) -> None:
        """Fix the order of nodes about to be loaded (the engine tries nodes in the order
        first seen): a caller loading a whole inventory passes every name, sorted."""
        for name in names:
            self.rank_of(name)

    def apply_node(self, node: Node) -> None:
        name = node.metadata.name
        self.rank_of(name)
        self.node_known.add(name)
        if self.node_labels.get(name) != node.metadata.labels:
            self.node_labels[name] = dict(node.metadata.labels)
            self._touch_node(name)

    def remove_node(self, name: str) -> None:
        self.node_labels.pop(name, None)
        self.node_known.discard(name)
        self._known_list = None
        self._touch_node(name)

    def _touch_node(self, name: str) -> None:
        self.version += 1
        self._local_version[name] = self._local_version.get(name, 0) + 1
        for callback in self.on_node_changed:
            callback(name)

    def nodes(self) -> list[str]:
        """Known nodes in rank order (cached until a node is added or removed)."""
        if self._known_list is None or len(self._known_list) != len(self.node_known):
            self._known_list = [n for n in self.node_names if n in self.node_known]
        return self._known_list

    def node_mask(self, node: str) -> tuple[int, list[int]]:
        """Devices usable from `node`: (bitset, ids in candidate order). Cached: the ids for every
        node, the bitset for the nodes used most recently (`node_bits`)."""
        stamp = (self.nonlocal_version, self._local_version.get(node, 0))
        bits = self.node_bits(node)
        known = self._node_ids.get(node)
        if known is not None and known[0] == stamp:
            return bits, known[1]
        ids = sorted(iter_bits(bits), key=lambda i: self.devices[i].order)  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)
        self._node_ids[node] = (stamp, ids)
        return bits, ids

    def node_bits(self, node: str) -> int:
        """`node_mask(node)[0]`, for a caller that needs only the bitset (placement's walk): kept
        for the NODE_MASKS_KEPT nodes used most recently, else rebuilt from the node's compact
        mask (and kept), without sorting the node's ids: a walk that evaluates thousands of nodes
        once (the first claim of a selector) sorted the ids of every node it passed."""
        stamp = (self.nonlocal_version, self._local_version.get(node, 0))
        cached = self._node_bits
        hit = cached.get(node)
        if hit is not None and hit[0] == stamp:
            cached.move_to_end(node)
            return hit[1]
        bits = self.local.get(node, 0)
        if self.nonlocal_bits:
            labels = self.node_labels.get(node, {})
            x = self.nonlocal_bits
            while x:
                low = x & -x
                rec = self.devices[low.bit_length() - 1]
                x ^= low
                if rec is not None and (rec.all_nodes or node_selector_matches(rec.node_selector, node, labels)):
                    bits |= low
        self._keep_bits(node, stamp, bits)
        return bits

    def _keep_bits(self, node: str, stamp: tuple[int, int], bits: int) -> None:
        cached = self._node_bits
        cached[node] = (stamp, bits)
        cached.move_to_end(node)
        if len(cached) > NODE_MASKS_KEPT:
            cached.popitem(last=False)

    # --- classes ---------------------------------------------------------------------

    def apply_class(self, cls: DeviceClass) -> None:
        self.classes[cls.metadata.name] = cls
        self.class_versions[cls.metadata.name] = self.class_versions.get(cls.metadata.name, 0) + 1

    def remove_class(self, name: str) -> None:
        self.classes.pop(name, None)
        self.class_versions[name] = self.class_versions.get(name, 0) + 1

    # --- DeviceTaintRules ---------------------------------------------------------------

    def apply_taint_rule(self, rule: DeviceTaintRule) -> None:
        """Add or replace a DeviceTaintRule: the devices it selects (before or now) are
        tainted as if the taint were in their slice."""
        old = self.taint_rules.get(rule.metadata.name)
        self.taint_rules[rule.metadata.name] = rule
        self._retaint(old, rule)

    def remove_taint_rule(self, name: str) -> None:
        old = self.taint_rules.pop(name, None)
        if old is not None:
            self._retaint(old)

    def taint_sources(self, rec: DeviceRec) -> list[str]:
        """Where each of the device's taints comes from ("slice" or "DeviceTaintRule/<name>"), in `rec.taints` order."""
        own = ["slice" for t in rec.spec.taints if t.effect in _TOLERATION_NEEDED]
        return own + [
            f"DeviceTaintRule/{name}"
            for name, rule in sorted(self.taint_rules.items())
            if rule.spec.taint.effect in _TOLERATION_NEEDED and rule_selects(rule, rec.driver, rec.pool, rec.name)
        ]

    def _retaint(self, *rules: DeviceTaintRule | None) -> None:
        self.version += 1
        for rec in self.by_key.values():
            if any(r is not None and rule_selects(r, rec.driver, rec.pool, rec.name) for r in rules):
                rec.taints = self._taints(rec.driver, rec.pool, rec.spec)

    def _taints(self, driver: str, pool: str, device: Device) -> tuple[DeviceTaint, ...]:
        own = [t for t in device.taints if t.effect in _TOLERATION_NEEDED]
        if self.taint_rules:
            own += [
                rule.spec.taint
                for _, rule in sorted(self.taint_rules.items())
                if rule.spec.taint.effect in _TOLERATION_NEEDED and rule_selects(rule, driver, pool, device.name)
            ]
        return tuple(own)

    # --- slices and pools ------------------------------------------------------------

    def apply_slice(self, slice_: ResourceSlice) -> list[str]:
        """Add or replace a slice and rebuild its pool (and the pool it left); the problems found.
        The slice is the inventory's from then on (`share_empty_lists` and `Repeats.share` rewrite
        its devices' fields with equal, shared instances)."""
        name = slice_.metadata.name
        old = self.slices.get(name)
        self.slices[name] = slice_
        share_empty_lists(slice_)
        self.repeats.share(slice_)
        keys = {(slice_.spec.driver, slice_.spec.pool.name)}
        if old is not None:
            keys.add((old.spec.driver, old.spec.pool.name))
            self._pool_discard((old.spec.driver, old.spec.pool.name), name)
        self._pool_add((slice_.spec.driver, slice_.spec.pool.name), name)
        if slice_.spec.node_name:
            self.rank_of(slice_.spec.node_name)
            self.node_known.add(slice_.spec.node_name)
        for device in slice_.spec.devices:
            if device.node_name:
                self.rank_of(device.node_name)
                self.node_known.add(device.node_name)
        problems: list[str] = []
        for key in sorted(keys):
            problems += self._rebuild_pool(key)
        return problems

    def remove_slice(self, name: str) -> list[str]:
        old = self.slices.pop(name, None)
        self._slice_checks.pop(name, None)
        if old is None:
            return []
        key = (old.spec.driver, old.spec.pool.name)
        self._pool_discard(key, name)
        return self._rebuild_pool(key)

    def _pool_add(self, key: tuple[str, str], name: str) -> None:
        names = self._pool_slices.get(key)
        if names is None:
            self._pool_slices[key] = (name,)
        elif isinstance(names, set):
            names.add(name)
        elif name not in names:  # (a tuple only while short: adding stays cheap for a pool of many slices)
            self._pool_slices[key] = (*names, name) if len(names) < POOL_NAMES_IN_TUPLE else {*names, name}

    def _pool_discard(self, key: tuple[str, str], name: str) -> None:
        names = self._pool_slices.get(key)
        if names is None or name not in names:
            return
        if isinstance(names, set):
            names.discard(name)
        else:
            names = self._pool_slices[key] = tuple(n for n in names if n != name)
        if not names:
            del self._pool_slices[key]  # (a pool gone leaves no entry)

    def _rebuild_pool(self, key: tuple[str, str]) -> list[str]:
        self.version += 1
        old = self.pools.pop(key, None)
        old_devices = old.devices if old is not None else []
        for rec in old_devices:
            self._unindex(rec)
        names = self._pool_slices.get(key, ())
        pool = Pool(driver=key[0], name=key[1])
        if names:
            slices = [self.slices[n] for n in names]
            pool.generation = max(s.spec.pool.generation for s in slices)
            pool.slices = sorted((s for s in slices if s.spec.pool.generation == pool.generation), key=lambda s: s.metadata.name)
            pool.expected = max(s.spec.pool.resource_slice_count for s in pool.slices)
            pool.invalid = self._validate(pool)
            self.pools[key] = pool
            if pool.usable:
                self._build_devices(pool, {id(rec.spec): rec.representable for rec in old_devices})
        if key in self.pools and not pool.usable:
            self.unusable[key] = pool
        else:
            self.unusable.pop(key, None)
        for callback in self.on_pool_rebuilt:
            callback(pool, old_devices)
        if pool.invalid:
            return [f"pool {pool.label} is invalid and is not used: {pool.invalid}"]
        return []

    def _validate(self, pool: Pool) -> str | None:
        """`_validate_pool(pool)`, each slice read once while its pool is incomplete (`SliceCheck`):
        the whole walk again only for a pool found invalid, for its first problem's message. A pool
        complete with none of its slices checked before (one slice, most of a fleet's) is walked once."""
        checks = self._slice_checks
        if pool.complete and not any(s.metadata.name in checks for s in pool.slices):
            return _validate_pool(pool, self.capacity_maps)
        found: list[SliceCheck] = []
        for slice_ in pool.slices:
            name = slice_.metadata.name
            check = checks.get(name)
            if check is None or check.slice is not slice_:
                check = checks[name] = SliceCheck.of(slice_, self.capacity_maps)
            found.append(check)
        if pool.complete:
            for slice_ in pool.slices:  # (a pool complete changes again rarely: its slices are read again then)
                del checks[slice_.metadata.name]
        if _consistent(found):
            return None
        return _validate_pool(pool, self.capacity_maps)

    def _build_devices(self, pool: Pool, representable: dict[int, bool]) -> None:
        """Make the pool's DeviceRecs; `representable`: the answers of the devices it had before, by
        the id of their `Device` (the same objects again when another slice of the pool changed).
        A device's answer is worked out as it arrives, not on the first claim's walk past it (13%
        of churn-mixed's fill, native)."""
        # one instance per distinct value across the pool's devices: MIG partitions of a profile
        # consume the same counters of their GPU, in the same amounts; the keys made once here
        shared: dict[Any, Any] = {}
        for set_ in (cs for s in pool.slices for cs in s.spec.shared_counters):
            set_key = shared[(None, set_.name)] = counter_key(pool.driver, pool.name, set_.name)
            for cname, counter in set_.counters.items():
                key = shared[(set_.name, cname)] = counter_key(pool.driver, pool.name, set_.name, cname)
                pool.counters[key] = _quantity(counter.value)
                pool.counter_sets[key] = set_key
        binding = any(d.binding_conditions for s in pool.slices for d in s.spec.devices)
        capacities, tainted = self.capacity_maps.of, bool(self.taint_rules)
        for slice_ in pool.slices:
            spec = slice_.spec
            per_device = bool(spec.per_device_node_selection)
            for device in spec.devices:
                consumes = (
                    tuple(
                        shared.get((c.counter_set, name, v.value))
                        or shared.setdefault(
                            (c.counter_set, name, v.value),
                            (shared.get((c.counter_set, name)) or counter_key(pool.driver, pool.name, c.counter_set, name), _quantity(v.value)),
                        )
                        for c in device.consumes_counters
                        for name, v in c.counters.items()
                    )
                    if device.consumes_counters
                    else ()
                )
                sets = {c.counter_set for c in device.consumes_counters} if device.consumes_counters else ()
                # (keyed (None, set): the keys above start with a set's name, never None)
                counter_set = (shared.get((None, *sets)) or counter_key(pool.driver, pool.name, *sets)) if len(sets) == 1 else None
                clock = None
                if counter_set is not None:
                    clock = pool.clocks.get(counter_set)
                    if clock is None:
                        clock = pool.clocks[counter_set] = CounterClock()
                if per_device:
                    local, selector, all_nodes = device.node_name, device.node_selector, bool(device.all_nodes)
                else:
                    local, selector, all_nodes = spec.node_name, spec.node_selector, bool(spec.all_nodes)
                rec = DeviceRec(
                    id=self._next_id,
                    driver=pool.driver,
                    pool=pool.name,
                    slice=slice_.metadata.name,
                    name=device.name,
                    spec=device,
                    binding=binding,
                    local_node=local or None,
                    node_selector=selector,
                    all_nodes=all_nodes,
                    taints=self._taints(pool.driver, pool.name, device) if device.taints or tainted else (),
                    consumes=shared.setdefault(consumes, consumes),
                    counter_set=counter_set,
                    clock=clock,
                    capacity=capacities(pool.driver, device),
                    multi=bool(device.allow_multiple_allocations),
                    binds_to_node=bool(device.binds_to_node),
                    representable=known if (known := representable.get(id(device))) is not None else projector.representable(pool.driver, device),
                    memo=self.attribute_memo,
                )
                self._next_id += 1
                self.devices.append(rec)
                pool.devices.append(rec)
        if pool.devices:
            self._index(pool.devices)

    def _index(self, recs: list[DeviceRec]) -> None:
        """Index a pool's new devices, whose ids are consecutive: each fleet-wide bitset changes
        once (an OR as wide as the fleet), each node's mask and version once, not once a device."""
        first = recs[0].id
        by_key = self.by_key
        multi = nonlocal_ = 0
        local: dict[str, list[int]] = {}
        for rec in recs:
            by_key[rec.key] = rec
            if rec.multi:
                multi |= 1 << (rec.id - first)
            node = rec.local_node
            if node is not None:
                ids = local.get(node)
                if ids is None:
                    local[node] = [rec.id]
                else:
                    ids.append(rec.id)
            elif rec.all_nodes or rec.node_selector is not None:
                nonlocal_ |= 1 << (rec.id - first)
        self.live |= ((1 << (recs[-1].id + 1 - first)) - 1) << first
        if multi:
            self.multi_bits |= multi << first
        for node, ids in local.items():
            self.local.add(node, ids)
            self._local_version[node] = self._local_version.get(node, 0) + 1
        if nonlocal_:
            self.nonlocal_bits |= nonlocal_ << first
            self.nonlocal_version += 1

    def _unindex(self, rec: DeviceRec) -> None:
        bit = 1 << rec.id
        if self.by_key.get(rec.key) is rec:
            del self.by_key[rec.key]
        self.devices[rec.id] = None
        self.live &= ~bit
        self.multi_bits &= ~bit
        if rec.local_node is not None:
            self.local.discard(rec.local_node, rec.id)
            self._local_version[rec.local_node] = self._local_version.get(rec.local_node, 0) + 1
        elif self.nonlocal_bits & bit:
            self.nonlocal_bits &= ~bit
            self.nonlocal_version += 1

    def unusable_near(self, node: str | None) -> list[Pool]:
        """Unusable pools (incomplete or invalid) with a slice reachable from `node`:
        a request for All devices cannot know what "all" is while one exists."""
        labels = self.node_labels.get(node or "", {})
        out = []
        for pool in self.unusable.values():
            for slice_ in pool.slices:
                spec = slice_.spec
                if spec.per_device_node_selection:
                    scopes = [(d.node_name, d.node_selector, d.all_nodes) for d in spec.devices]
                else:
                    scopes = [(spec.node_name, spec.node_selector, spec.all_nodes)]
                if any(all_nodes or (node is not None and (name == node or node_selector_matches(sel, node, labels))) for name, sel, all_nodes in scopes):
                    out.append(pool)
                    break
        return out

    def pool_of(self, rec: DeviceRec) -> Pool:
        return self.pools[(rec.driver, rec.pool)]


_EMPTY: list[Any] = []
"""The one empty list the inventory's devices share (`share_empty_lists`). Never mutated."""


def share_empty_lists(slice_: ResourceSlice) -> None:
    """Point each device's empty list fields (taints, counters consumed, binding conditions), and
    the slice's empty `skipNodeOperations`, at one shared empty list. A decoded slice has a new
    empty list for each (72 bytes, tracked by the cyclic collector): ~4 a device, ~2 million lists
    and ~150 MB at 250,000 GPUs, for nothing. Equal and encoded as before; nothing in the engine
    mutates a slice it was given (the allocation results share the empty list too)."""
    empty = _EMPTY
    for device in slice_.spec.devices:
        if not device.taints:
            device.taints = empty
        if not device.consumes_counters:
            device.consumes_counters = empty
        if not device.binding_conditions:
            device.binding_conditions = empty
        if not device.binding_failure_conditions:
            device.binding_failure_conditions = empty
    if not slice_.spec.skip_node_operations:
        slice_.spec.skip_node_operations = empty


def rule_selects(rule: DeviceTaintRule, driver: str, pool: str, device: str) -> bool:
    """Kubernetes' DeviceTaintSelector: every field set must match; an empty selector selects
    every device, a rule without one selects none."""
    selector = rule.spec.device_selector
    if selector is None:
        return False
    return (
        (selector.driver is None or selector.driver == driver)
        and (selector.pool is None or selector.pool == pool)
        and (selector.device is None or selector.device == device)
    )


_GROUPS_UNSUPPORTED = (
    "compatibilityGroups (Kubernetes 1.37's alpha DRADeviceCompatibilityGroups) are not supported: "
    "no device of the pool is allocated, as the scheduler skips such a pool with the feature off"
)


def _validate_pool(pool: Pool, capacity_maps: CapacityMaps) -> str | None:
    """Why a pool cannot be used safely, or None. Checked over every slice of the
    current generation, both layouts: counters beside the devices (1.34) or in
    separate counter slices (1.35+). Capacities are parsed through `capacity_maps`
    (the build reads them from there again)."""
    names: set[str] = set()
    sets: dict[str, set[str]] = {}
    for slice_ in pool.slices:
        for counter_set in slice_.spec.shared_counters:
            if counter_set.name in sets:
                return f"duplicate counter set name {counter_set.name!r}"
            sets[counter_set.name] = set(counter_set.counters)
    for slice_ in pool.slices:
        for device in slice_.spec.devices:
            if device.name in names:
                return f"duplicate device name {device.name!r}"
            names.add(device.name)
            for consumption in device.consumes_counters:
                if consumption.compatibility_groups:
                    return f"device {device.name!r}: {_GROUPS_UNSUPPORTED} (counter set {consumption.counter_set!r})"
                known = sets.get(consumption.counter_set)
                if known is None:
                    return f"device {device.name!r} consumes from unknown counter set {consumption.counter_set!r}"
                for counter in consumption.counters:
                    if counter not in known:
                        return f"device {device.name!r} consumes unknown counter {counter!r} of counter set {consumption.counter_set!r}"
    try:
        for slice_ in pool.slices:
            for counter_set in slice_.spec.shared_counters:
                for shared in counter_set.counters.values():
                    _quantity(shared.value)
            for device in slice_.spec.devices:
                capacity_maps.of(pool.driver, device)
                for consumption in device.consumes_counters:
                    for consumed in consumption.counters.values():
                        _quantity(consumed.value)
    except ValueError as exc:
        return str(exc)
    return None


@dataclass(frozen=True, slots=True)
class SliceCheck:
    """What `_validate_pool` reads of one slice, found once a slice applied (`Inventory._validate`)."""

    slice: ResourceSlice
    set_names: tuple[str, ...]  # its counter sets', in order
    defined: frozenset[tuple[str, str]]  # (counter set, counter) of its counter sets
    names: frozenset[str]  # its devices'
    devices: int
    consumed_sets: frozenset[str]  # counter sets its devices consume from
    consumed: frozenset[tuple[str, str]]  # (counter set, counter) its devices consume
    quantities_ok: bool  # every counter value and capacity parses
    grouped: bool  # some device's consumption names compatibilityGroups (`_GROUPS_UNSUPPORTED`)

    @staticmethod
    def of(slice_: ResourceSlice, capacity_maps: CapacityMaps) -> SliceCheck:
        spec = slice_.spec
        sets, devices = spec.shared_counters, spec.devices
        consumed_sets: set[str] = set()
        consumed: set[tuple[str, str]] = set()
        quantities_ok = True
        grouped = any(c.compatibility_groups for d in devices for c in d.consumes_counters)
        try:
            for counter_set in sets:
                for shared in counter_set.counters.values():
                    _quantity(shared.value)
            for device in devices:
                capacity_maps.of(spec.driver, device)
                for consumption in device.consumes_counters:
                    consumed_sets.add(consumption.counter_set)
                    for counter, value in consumption.counters.items():
                        consumed.add((consumption.counter_set, counter))
                        _quantity(value.value)
        except ValueError:
            quantities_ok = False  # (the pairs consumed are not all read: the pool is walked again for its message)
        return SliceCheck(
            slice=slice_,
            set_names=tuple(cs.name for cs in sets),
            defined=frozenset((cs.name, c) for cs in sets for c in cs.counters),
            names=frozenset(d.name for d in devices),
            devices=len(devices),
            consumed_sets=frozenset(consumed_sets),
            consumed=frozenset(consumed),
            quantities_ok=quantities_ok,
            grouped=grouped,
        )


def _consistent(checks: list[SliceCheck]) -> bool:
    """Whether `_validate_pool` finds nothing wrong with the pool of these slices' checks: counter set
    names and device names unique across the slices, every counter consumed defined by one, every
    quantity parsed, no compatibilityGroups named."""
    set_names = [n for c in checks for n in c.set_names]
    if len(set(set_names)) != len(set_names) or not all(c.quantities_ok and not c.grouped for c in checks):
        return False
    if len(checks) == 1:
        c = checks[0]
        return len(c.names) == c.devices and c.consumed_sets <= set(c.set_names) and c.consumed <= c.defined
    names: set[str] = set()
    defined: set[tuple[str, str]] = set()
    for c in checks:
        names |= c.names
        defined |= c.defined
    known = set(set_names)
    return len(names) == sum(c.devices for c in checks) and all(c.consumed_sets <= known and c.consumed <= defined for c in checks)


_quantity = functools.lru_cache(maxsize=4096)(parse_quantity)
"""`parse_quantity` of the counter values a pool names (a fleet repeats a few: "1", "10Gi"; a MIG
GPU's partitions name a dozen each); a malformed one raises, uncached."""


def iter_bits(x: int) -> Iterator[int]:
    """Set bit positions of `x`, lowest first, lazily: a caller that stops after the
    first few pays for those only. Works a window at a time (growing): a window that
    fits a machine word, or holds a few bits far apart, bit by bit; any other through
    its bytes (compiled, each byte and bit is then a machine integer: bit by bit on a
    wider window, each step made and freed an int as wide as it, ~1,000 instructions a
    bit of a MIG node's span)."""
    base = 0
    width = 256
    while x:
        chunk = x if x.bit_length() <= width else x & ((1 << width) - 1)  # (a fleet of a few hundred nodes: no mask made)
        if not chunk:
            skip = (x & -x).bit_length() - 1  # jump over the zeros
            x >>= skip
            base += skip
            continue
        size = chunk.bit_length()
        if size <= 62 or (size > 2048 and chunk.bit_count() <= 16):  # (a few bits far apart: not a scan of every byte)
            while chunk:
                low = chunk & -chunk
                yield base + low.bit_length() - 1
                chunk ^= low
        else:
            data = chunk.to_bytes((size + 7) >> 3, "little")
            for j in range(len(data)):
                byte = data[j]
                if byte:
                    at = base + (j << 3)
                    while byte:
                        low = byte & -byte
                        yield at + low.bit_length() - 1
                        byte ^= low
        x >>= width
        base += width
        width = min(width * 2, 1 << 16)


def bits_of(ids: list[int]) -> int:
    """The bitset of `ids`, built in one pass (OR-ing bits one by one is quadratic)."""
    if not ids:
        return 0
    if len(ids) == 1:
        return 1 << ids[0]
    # built from the lowest id up, then shifted: a node's few ids near the top of a fleet's
    # range made a fleet-sized buffer to convert (~1.4 ms at 2,000,000 ids; the shift ~10 us)
    low = min(ids)
    buf = bytearray(((max(ids) - low) >> 3) + 1)
    for i in ids:
        i -= low
        buf[i >> 3] |= 1 << (i & 7)
    return int.from_bytes(buf, "little") << low
