"""A device's projection onto a selector's fields (projection.py: what of a device a selector can
see), and whether a device can be projected at all (`representable`), compiled in the native
build: the first evaluation of a shared selector on a device reads it, on every device a walk
meets for the first time (a MIG node's 200 partitions), and every device is checked as it
arrives. Neither walks user input of any depth (projection.py's `fields`, which does, stays
interpreted: setup.py)."""

from __future__ import annotations

import functools
from typing import Any, Final

import msgspec

from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import Device, DeviceCapacity

from . import cel_runtime as rt
from .cel import _attribute_value
from .semver import parse_semver

Field = tuple[str, ...]
"""("driver",), ("allowMultipleAllocations",), ("attributes", domain, name) or ("capacity", domain, name)."""

_ABSENT = b""
"""A field the device lacks (no JSON encoding is empty): absence changes results and errors."""

_encode = msgspec.json.encode
"""A value's part of a projection: its JSON encoding (so `true` never equals `1`)."""


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

    def project(self, driver: str, device: Device) -> tuple[object, ...]:
        """`project(self.fields, driver, device)`. (A method, not `__call__`: compiled callers call
        a method directly, a `__call__` through Python's call protocol, ~12% of a projection.)"""
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
        return _encode(qualified)
    if qualified is None:
        return _encode(bare)
    order = list(entries)
    winner = qualified if order.index(f"{domain}/{name}") > order.index(name) else bare
    return _encode(winner)


def representable(driver: str, device: Device) -> bool:
    """Whether `cel.device_env` builds the device without an error (every attribute has a value
    CEL can hold, every capacity a quantity in range): a device Kubernetes cannot represent fails
    every selector, so a shared verdict needs this of every device it reads (verdicts.py). The
    inventory asks it once a device, as its slice arrives. (Most of its cost is reading the
    attributes' fields, ~160 instructions a read of a msgspec struct, compiled or not.)"""
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


_INT64_MIN: Final = -(2**63)
_INT64_MAX: Final = 2**63 - 1

CAPACITY_MAPS_KEPT: Final = 4096
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
