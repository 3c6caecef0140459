"""What of a device a selector can see: its projection, for sharing verdicts between devices.

Thousands of devices of a fleet differ only in fields no selector reads (uuid,
index, pciBusID). A selector that reads only fields it names literally
(`device.driver`, `device.allowMultipleAllocations`,
`device.attributes["d"].name` or `["d"]["name"]`, `device.capacity["d"].name`,
`has(...)` and `"name" in device.attributes["d"]` on those) gives the same
outcome (match, no match, or a runtime error with the same reason) on every
device whose values of those fields are equal: the selector's `fields` (found
on its AST) and a device's `project`ion of them are what the verdict cache
keys such outcomes by.

A selector that reads the device in any way that cannot be listed statically
(a computed index, a whole `device.attributes[...]` map or `device` itself
passed to a function or macro, iterated, compared or bound with `cel.bind`)
has no projection (`fields` returns None) and is evaluated on each device.

Pure: no I/O, no evaluator; `representable` mirrors the checks `cel.device_env`
makes (a device Kubernetes cannot represent fails every selector, whatever it
reads, so such devices never share).
"""

from __future__ import annotations

import functools
from typing import Any

import msgspec

from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import Device, DeviceCapacity

from . import cel_runtime as rt
from .cel import _attribute_value, compile_selector
from .cel_syntax import Binary, Bind, Comp, Has, Ident, Index, Lit, Node, Select, children
from .semver import parse_semver

Field = tuple[str, ...]
"""("driver",), ("allowMultipleAllocations",), ("attributes", domain, name) or ("capacity", domain, name)."""

_SCALARS = ("driver", "allowMultipleAllocations")
_MAPS = ("attributes", "capacity")


class _Dynamic(Exception):
    """The selector reads the device in a way no list of fields describes."""


def fields(ast: Node) -> tuple[Field, ...] | None:
    """The device fields `ast` can read, sorted, or None when that cannot be listed statically.
    `device` shadowed by a comprehension or `cel.bind` variable is not the device."""
    found: set[Field] = set()
    try:
        _walk(ast, frozenset(), found, {})
    except (_Dynamic, RecursionError):
        return None
    return tuple(sorted(found))


@functools.lru_cache(maxsize=4096)
def fields_of(expression: str) -> tuple[Field, ...] | None:
    """`fields` of a selector expression (cached per expression; it must compile)."""
    return fields(compile_selector(expression).ast)


def _is_device(node: Node, bound: frozenset[str]) -> bool:
    return isinstance(node, Ident) and node.name == "device" and "device" not in bound


Aliases = dict[str, tuple[str, str]]
"""A `cel.bind` variable bound to a domain map -> (outer, domain) of that map."""


def _domain_map(node: Node, bound: frozenset[str], aliases: Aliases) -> tuple[str, str] | None:
    """(outer, domain) when `node` is `device.attributes["domain"]` (or `.domain`; capacity alike),
    or a `cel.bind` variable bound to one (`aliases`)."""
    if isinstance(node, Ident):
        return aliases.get(node.name)
    if isinstance(node, Index) and not node.optional and isinstance(node.index, Lit) and node.index.kind == "string":
        outer, domain = node.operand, node.index.value
    elif isinstance(node, Select) and not node.optional:
        outer, domain = node.operand, node.field
    else:
        return None
    if isinstance(outer, Select) and not outer.optional and outer.field in _MAPS and _is_device(outer.operand, bound):
        return outer.field, domain
    return None


def _walk(node: Node, bound: frozenset[str], found: set[Field], aliases: Aliases) -> None:
    if _is_device(node, bound):
        raise _Dynamic  # `device` itself, not one of its fields
    if isinstance(node, Ident) and node.name in aliases:
        raise _Dynamic  # a bound domain map used whole (iterated, compared, passed on)
    if isinstance(node, Select) and _is_device(node.operand, bound):
        if node.optional or node.field not in _SCALARS:
            raise _Dynamic  # a whole attributes/capacity map, or a field no device has
        found.add((node.field,))
        return
    # a literal name inside a domain map: its presence and value are all that is read
    if isinstance(node, (Select, Has)) and (dm := _domain_map(node.operand, bound, aliases)) is not None:
        found.add((*dm, node.field))
        return
    if (
        isinstance(node, Index)
        and isinstance(node.index, Lit)
        and node.index.kind == "string"
        and (dm := _domain_map(node.operand, bound, aliases)) is not None
    ):
        found.add((*dm, node.index.value))
        return
    if (
        isinstance(node, Binary)
        and node.op == "in"
        and isinstance(node.left, Lit)
        and node.left.kind == "string"
        and (dm := _domain_map(node.right, bound, aliases)) is not None
    ):
        found.add((*dm, node.left.value))
        return
    if isinstance(node, Comp):
        _walk(node.range, bound, found, aliases)
        names = {node.var} | ({node.var2} if node.var2 else set())
        inner = bound | names
        scoped = {k: v for k, v in aliases.items() if k not in names}  # shadowed inside
        _walk(node.pred, inner, found, scoped)
        if node.transform is not None:
            _walk(node.transform, inner, found, scoped)
        return
    if isinstance(node, Bind):
        # `cel.bind(a, device.attributes["d"], body)`: `a.name` in the body reads that one field
        dm = _domain_map(node.init, bound, aliases)
        if dm is None:
            _walk(node.init, bound, found, aliases)
            scoped = {k: v for k, v in aliases.items() if k != node.var}
        else:
            scoped = {**aliases, node.var: dm}
        _walk(node.body, bound | {node.var}, found, scoped)
        return
    for child in children(node):
        _walk(child, bound, found, aliases)


_ABSENT = b""
"""A field the device lacks (no JSON encoding is empty): absence changes results and errors."""


def project(fields: tuple[Field, ...], driver: str, device: Device) -> tuple[object, ...]:
    """The device's values of `fields` (with the driver always: unqualified names belong to its
    domain), equal for two devices exactly when the selector sees the same values on both.
    Values are compared by their JSON encoding, so `true` never equals `1`."""
    key: list[object] = [driver]
    for f in fields:
        if f[0] == "driver":
            continue
        if f[0] == "allowMultipleAllocations":
            key.append(bool(device.allow_multiple_allocations))
        else:
            key.append(_lookup(device.attributes if f[0] == "attributes" else device.capacity, driver, f[1], f[2]))
    return tuple(key)


class Projector:
    """`project` of one list of fields, with the reads worked out once: the fields' keys (qualified,
    bare), not `project`'s per device. Each value is encoded as it is met: msgspec encodes a
    DeviceAttribute in about the time a dict lookup by its identity took, and remembering values by
    identity paid off only where equal values were one instance (engine/repeats.py shares a value
    with the previous device of the same name only: gpu-fleet-10k's nodes alternate four models, so
    nearly every lookup missed and was kept, ~1 us a device, most of a node's evaluation)."""

    __slots__ = ("fields", "_reads")

    def __init__(self, fields: tuple[Field, ...]) -> None:
        self.fields = fields
        reads: list[tuple[bool, str | None, str, str | None] | None] = []
        for f in fields:
            if f[0] == "driver":
                continue
            if f[0] == "allowMultipleAllocations":
                reads.append(None)
            else:
                # (attributes?, the qualified key, the domain, the bare key when the domain may be the driver's): as `_lookup` reads them
                reads.append((f[0] == "attributes", None if "/" in f[1] else f"{f[1]}/{f[2]}", f[1], None if "/" in f[2] else f[2]))
        self._reads = tuple(reads)

    def __call__(self, driver: str, device: Device) -> tuple[object, ...]:
        """`project(self.fields, driver, device)`."""
        key: list[object] = [driver]
        for read in self._reads:
            if read is None:
                key.append(bool(device.allow_multiple_allocations))
                continue
            attributes, qualified, domain, bare = read
            entries: dict[str, Any] = device.attributes if attributes else device.capacity
            value = entries.get(qualified) if qualified is not None else None
            if bare is not None and domain == driver and (other := entries.get(bare)) is not None:
                if value is not None:
                    return project(self.fields, driver, device)  # both: their order in the map decides (rare)
                value = other
            key.append(_ABSENT if value is None else _encode(value))
        return tuple(key)


_encode = msgspec.json.encode


def _lookup(entries: dict[str, Any], driver: str, domain: str, name: str) -> object:
    """What `cel.device_env` puts under (domain, name): "domain/name", or the bare name when the
    domain is the driver's (its name splits at the first "/"; the later entry wins)."""
    qualified = bare = None
    if "/" not in domain:
        qualified = entries.get(f"{domain}/{name}")
    if domain == driver and "/" not in name:
        bare = entries.get(name)
    if qualified is None and bare is None:
        return _ABSENT
    if bare is None:
        return msgspec.json.encode(qualified)
    if qualified is None:
        return msgspec.json.encode(bare)
    order = list(entries)
    winner = qualified if order.index(f"{domain}/{name}") > order.index(name) else bare
    return msgspec.json.encode(winner)


def representable(driver: str, device: Device) -> bool:
    """Whether `cel.device_env` builds the device without an error (every attribute has a value
    CEL can hold, every capacity a quantity in range)."""
    try:
        for attr in device.attributes.values():
            # the usual scalars inline (what `_attribute_value` tests first, in its order)
            if attr.int is not None:
                if not _INT64_MIN <= attr.int <= _INT64_MAX:
                    return False
            elif attr.bool is None and attr.string is None:
                if attr.version is not None:
                    if not _version_ok(attr.version):
                        return False
                else:
                    _attribute_value(attr)
    except (ValueError, TypeError, OverflowError):
        return False
    return _capacities_ok(device.capacity)


_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

CAPACITY_MAPS_KEPT = 4096
"""Capacity maps `_capacities_ok` remembers before it starts over."""

_capacity_maps: dict[int, tuple[dict[str, DeviceCapacity], bool]] = {}
"""id of a device's capacity map -> (the map, its answer). engine/repeats.py points the devices of
one name on every node of a profile at one map, so a fleet has a few hundred; a MIG slice has a
dozen quantities, and testing each through `_quantity_ok`'s cache was most of `representable`'s
time on churn-mixed. The map is held, so its id is not reused while it is remembered (no device
is mutated once applied)."""


def _capacities_ok(capacity: dict[str, DeviceCapacity]) -> bool:
    """Whether every quantity of a capacity map is one CEL can hold, once per map instance."""
    hit = _capacity_maps.get(id(capacity))
    if hit is not None and hit[0] is capacity:
        return hit[1]
    ok = all(_quantity_ok(type(cap.value).__name__, cap.value) for cap in capacity.values())
    if len(_capacity_maps) >= CAPACITY_MAPS_KEPT:
        _capacity_maps.clear()
    _capacity_maps[id(capacity)] = (capacity, ok)
    return ok


@functools.lru_cache(maxsize=4096)
def _version_ok(text: str) -> bool:
    """A version attribute CEL can hold (a fleet repeats a few)."""
    try:
        parse_semver(text)
    except (ValueError, TypeError):
        return False
    return True


@functools.lru_cache(maxsize=4096)
def _quantity_ok(kind: str, value: str | int | float) -> bool:
    """A capacity value CEL can hold (a fleet repeats a few; `kind` keeps 1 and 1.0 and True apart)."""
    try:
        rt.quantity_value(parse_quantity(value))
    except (ValueError, TypeError, OverflowError):
        return False
    return True
