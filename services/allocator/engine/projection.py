"""What of a device a selector can see: its projection, for sharing verdicts between devices.

Thousands of devices of a fleet differ only in fields no selector reads (uuid,
index, pciBusID). A selector that reads only fields it names literally
(`device.driver`, `device.allowMultipleAllocations`,
`device.attributes["d"].name` or `["d"]["name"]`, `device.capacity["d"].name`,
`has(...)` and `"name" in device.attributes["d"]` on those) gives the same
outcome (match, no match, or a runtime error with the same reason) on every
device whose values of those fields are equal: the selector's `fields` (found
on its AST) and a device's projection of them (projector.py, compiled in the
native build) are what the verdict cache keys such outcomes by.

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

from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import Device, DeviceCapacity

from . import cel_runtime as rt
from .cel import _attribute_value, compile_selector
from .cel_syntax import Binary, Bind, Comp, Has, Ident, Index, Lit, Node, Select, children
from .projector import Field
from .semver import parse_semver

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
