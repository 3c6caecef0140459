"""Publishing only on change: one node's slices, their generation, and what to withdraw.

Pure state, no I/O: `service.py` feeds it scans and publishes what it returns.

- `update(inventory)` builds the slices; when they differ from the last
  published ones in anything (a device, an attribute, a taint, the number of
  slices), the pool generation is bumped and every slice of the node is
  returned to publish, plus the names of slices that no longer exist (so a
  consumer never sees a stale slice next to the new generation). No change:
  None, and nothing is sent.
- `withdraw()` names every slice published, for shutdown.

The generation starts above any generation this node published before (the
service reads those back from the bus), because consumers ignore a pool's
slices whose generation is lower than one they have seen.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import msgspec

from dralloc.discovery.inventory import NodeInventory, node_object
from dralloc.discovery.slices import Layout, build_slices, slice_key, stamp_generation
from dralloc.schemas.resource import Node, ResourceSlice

SliceKey = tuple[str, str, str]
"""(driver, pool, slice name)."""


@dataclass(slots=True)
class Update:
    generation: int
    publish: list[ResourceSlice]
    remove: list[SliceKey]
    node: Node | None = None
    """The Node object, when its labels changed."""


@dataclass(slots=True)
class Publisher:
    layout: Layout = "1.35"
    generation: int = 0
    """The last generation published (or seen on the bus from an earlier run)."""
    published: set[SliceKey] = field(default_factory=set)
    """Slices on the bus now, including leftovers of an earlier run."""
    _fingerprint: bytes | None = None
    _node: bytes | None = None

    def update(self, inventory: NodeInventory) -> Update | None:
        # Compare at a fixed generation: only content counts as change.
        slices = build_slices(inventory, layout=self.layout, generation=0)
        fingerprint = msgspec.json.encode(slices)
        node = node_object(inventory)
        node_fingerprint = msgspec.json.encode(node)
        node_changed = node_fingerprint != self._node
        self._node = node_fingerprint
        if fingerprint == self._fingerprint:
            return Update(self.generation, [], [], node) if node_changed else None
        self._fingerprint = fingerprint
        self.generation += 1
        stamp_generation(slices, self.generation)
        keys = {slice_key(s) for s in slices}
        removed = sorted(self.published - keys)
        self.published = keys
        return Update(self.generation, slices, removed, node if node_changed else None)

    def withdraw(self) -> list[SliceKey]:
        """Every slice to remove on shutdown; afterwards nothing is published."""
        keys = sorted(self.published)
        self.published = set()
        self._fingerprint = self._node = None
        return keys

    def adopt(self, generation: int, keys: Iterable[SliceKey]) -> None:
        """What an earlier run of this node left on the bus: continue above its generation, clean its slices."""
        self.generation = max(self.generation, generation)
        self.published |= set(keys)
