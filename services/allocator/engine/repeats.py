"""One instance kept of what a fleet's devices repeat (#17: memory at 250,000 GPUs).

A decoded ResourceSlice has a fresh object for every attribute value of every device, though a
fleet repeats a few: productName, architecture, driver versions, NUMA node, PCIe root, NVLink
yes/no (at 3,000 frontier nodes, 500,988 `DeviceAttribute`s held 40,000 distinct values: 48 MB
of the 180 MB the process held), and every GPU of a model publishes the same capacity map.
`Repeats.share` points each device of an applied slice at the instances of the device of the
same name applied before it (nodes of one hardware profile name their devices alike: `gpu-0`
of one H100 node publishes what `gpu-0` of the previous one did, its uuid and PCIe switch
aside), where they are equal. Equal before and after (and encoded alike); nothing in the engine
mutates a device it was given, nor tells two equal values apart by identity.

Comparing with the previous namesake (one dict lookup a device, one C-level `==` an attribute)
rather than looking every value up in a table of distinct values: the table cost ~1 µs an
attribute, +30% on loading the fleet; this costs about a third of that.
"""

from __future__ import annotations

from typing import Any

from dralloc.schemas.resource import ResourceSlice

NAMES_KEPT = 100_000
"""Device names whose last device `Repeats` remembers before it starts over (a fleet names its
devices alike on every node: a few hundred names; this bounds what a hostile one costs)."""


class Repeats:
    """Device name -> (the name's string, attribute map, capacity map) of the last device applied with that name."""

    __slots__ = ("_last",)

    def __init__(self) -> None:
        self._last: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {}

    def share(self, slice_: ResourceSlice) -> None:
        """Point the slice's devices' names, attribute values and capacity maps at the equal
        instances of the previous device of the same name (the slice is the inventory's once applied)."""
        last = self._last
        if len(last) > NAMES_KEPT:
            last.clear()
        for device in slice_.spec.devices:
            attrs, capacity = device.attributes, device.capacity
            before = last.get(device.name)
            if before is not None:
                name, prev_attrs, prev_capacity = before
                device.name = name
                if attrs is not prev_attrs:
                    for key, attr in attrs.items():
                        same = prev_attrs.get(key)
                        if same is not None and same is not attr and same == attr:
                            attrs[key] = same  # (replacing a value while iterating keeps the keys)
                if capacity is not prev_capacity and capacity and capacity == prev_capacity:
                    device.capacity = capacity = prev_capacity
            last[device.name] = (device.name, attrs, capacity)
