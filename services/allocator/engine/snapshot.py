"""A read-only picture of the engine for observers (metrics, `dralloc explain`).

Observers never read the engine's live state: its owner (the allocator's event
loop, under the lock it holds for engine work; the CLI's own thread) calls
`Engine.snapshot()` and hands the result over. An `EngineSnapshot` is frozen
(msgspec Structs of tuples and scalars): later allocations, releases and
inventory changes cannot change it, and another thread may read it freely.

What it holds:

- `holders`: per node (None: devices usable from every node), the claims
  holding devices there, sorted;
- `usage` (when asked for, `fleet=True`): per node and device class, the
  class's devices, how many are free, the largest number free inside one
  NVLink domain of the node (``dralloc.dev/nvlinkDomain``; the node's devices
  without one are one block together) and the most devices of the class any
  one of those domains has; `nonlocal_free`: free devices of each class not
  local to one node (network-attached).

A device counts for a class when the class's selectors accept it; it is free
when it is in a usable pool, not held by any claim (exclusively or as a share
of an allowMultipleAllocations device) and its shared counters have room for it
(so a GPU with a MIG partition in use is not free, nor are the partitions of a
GPU in use). Taints are not looked at.

`Observer` works the fleet part out incrementally (per node, while its devices
and the class versions stay; per counter in use, while its amount stays) with a
`Verdicts` of its own, so taking a snapshot never changes what the engine
caches for allocation (~30 ms on 59,088 devices over 1,236 nodes; the first
snapshot of an engine evaluates each class's selectors once per device).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import msgspec

from dralloc.allocator.engine import cel
from dralloc.allocator.engine.inventory import bits_of, iter_bits
from dralloc.allocator.engine.plan import Alt, verdict_key
from dralloc.allocator.engine.topology import NVLINK_DOMAIN
from dralloc.allocator.engine.verdicts import Verdicts

if TYPE_CHECKING:
    from dralloc.allocator.engine.inventory import CounterKey, Inventory
    from dralloc.allocator.engine.ledger import Ledger


class NodeClassUsage(msgspec.Struct, frozen=True):
    """One device class on one node at the snapshot's moment."""

    node: str
    device_class: str
    total: int
    """Devices of the node the class's selectors accept (live pools only)."""
    free: int
    largest_free_block: int
    """The most free devices of the class inside one NVLink domain of the node."""
    biggest_block: int
    """The most devices of the class any one NVLink domain of the node has."""

    @property
    def fragmentation(self) -> float:
        """``1 - largest_free_block / min(free, biggest_block)``; 0 when nothing is free (0..1)."""
        return 1 - self.largest_free_block / min(self.free, self.biggest_block) if self.free else 0.0


class EngineSnapshot(msgspec.Struct, frozen=True):
    """The engine at one moment (module docstring); immutable, safe to read from any thread."""

    holders: tuple[tuple[str | None, tuple[str, ...]], ...] = ()
    """(node, claims holding devices there), nodes in name order (None last)."""
    usage: tuple[NodeClassUsage, ...] = ()
    """Per (node, device class) with devices, in node then class order; empty unless taken with ``fleet=True``."""
    nonlocal_free: tuple[tuple[str, int], ...] = ()
    """(device class, free devices not local to one node), for classes that have such devices."""
    claims: int = 0
    """Claims holding an allocation."""
    fleet: bool = False
    """Whether `usage` and `nonlocal_free` were worked out."""

    def holders_by_node(self) -> dict[str | None, list[str]]:
        """node -> the claims holding devices there (a fresh dict: the caller may keep or change it)."""
        return {node: list(keys) for node, keys in self.holders}


@dataclass(slots=True)
class _NodeClass:
    """One class's devices on one node, as bitsets shifted by the node's lowest device id."""

    devices: int
    total: int
    blocks: list[int]  # per NVLink domain (devices without one: one block)
    biggest: int


class Observer:
    """Takes `EngineSnapshot`s of one engine's inventory and ledger; used on the engine's owning thread only."""

    def __init__(self, inventory: Inventory, ledger: Ledger) -> None:
        self.inventory = inventory
        self.ledger = ledger
        self.verdicts = Verdicts(inventory)  # its own: the engine's cache and its order stay the allocator's
        self._nodes: dict[str, tuple[tuple[int, int], tuple[tuple[str, int], ...], dict[str, _NodeClass]]] = {}
        """Node -> (its devices as (lo, bits shifted by lo), class versions, class -> _NodeClass): rebuilt when either changes."""
        self._counters: tuple[int, dict[CounterKey, list[tuple[int, int]]], dict[CounterKey, int], int] = (-1, {}, {}, 0)
        """(inventory version, consumers, capacity, oversized) for that version: see `_counter_users`."""
        self._blocked: dict[CounterKey, tuple[int, list[int]]] = {}
        """Counter in use -> (amount used, the devices it leaves no room for), while the amount stays."""

    def take(self, *, fleet: bool) -> EngineSnapshot:
        """The snapshot now; `fleet`: also per node and class usage (costlier; what metrics read)."""
        by_node: dict[str | None, list[str]] = {}
        for key, record in self.ledger.claims.items():
            by_node.setdefault(record.node, []).append(key)
        holders = tuple((node, tuple(sorted(keys))) for node, keys in sorted(by_node.items(), key=lambda item: (item[0] is None, item[0] or "")))
        if not fleet:
            return EngineSnapshot(holders=holders, claims=len(self.ledger.claims))
        usage, nonlocal_free = self._usage()
        return EngineSnapshot(holders=holders, usage=usage, nonlocal_free=nonlocal_free, claims=len(self.ledger.claims), fleet=True)

    def _usage(self) -> tuple[tuple[NodeClassUsage, ...], tuple[tuple[str, int], ...]]:
        inv = self.inventory
        classes = self._class_devices()
        free = self._free()
        versions = tuple(sorted((name, inv.class_versions.get(name, 0)) for name in classes))
        usage: list[NodeClassUsage] = []
        nodes = {}
        for node in sorted(inv.local.nodes()):
            span = inv.local.span(node)  # (lo, the node's devices shifted by lo): a few words, not the fleet's width
            cached = self._nodes.get(node)
            if cached is None or cached[0] != span or cached[1] != versions:
                cached = (span, versions, self._node_classes(span, classes))
            nodes[node] = cached
            (lo, bits), _, per_class = cached
            here = (free >> lo) & bits
            for cls, nc in sorted(per_class.items()):
                mine = here & nc.devices
                largest = max((mine & block).bit_count() for block in nc.blocks)
                usage.append(NodeClassUsage(node, cls, nc.total, mine.bit_count(), largest, nc.biggest))
        self._nodes = nodes  # nodes gone are forgotten
        nonlocal_free = tuple(
            (cls, (free & inv.nonlocal_bits & matched).bit_count()) for cls, matched in sorted(classes.items()) if inv.nonlocal_bits & matched
        )
        return tuple(usage), nonlocal_free

    def _class_devices(self) -> dict[str, int]:
        """Class name -> bits of the devices its selectors accept (evaluated once per device and class version)."""
        inv = self.inventory
        out, alts = {}, {}
        for name, cls in sorted(inv.classes.items()):
            try:
                for selector in cls.spec.selectors:
                    cel.compile_selector(selector.cel.expression if selector.cel else "")
            except cel.CelCompileError:  # a class no claim can use: it has no devices
                out[name] = 0
                continue
            version = inv.class_versions.get(name, 0)
            key = verdict_key(name, version, ())
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
        inv, ledger = self.inventory, self.ledger
        shared = [rec.id for key, shares in ledger.shares.items() if shares and (rec := inv.by_key.get(key)) is not None]
        consumers, capacity, oversized = self._counter_users()
        # A device whose counter is used so far that its own amount no longer fits is not free (the
        # ledger's counter_room, worked out per counter in use rather than per device).
        blocked: set[int] = set()  # (a device consumes several counters: each once)
        cache: dict[CounterKey, tuple[int, list[int]]] = {}
        for key, used in ledger.counter_used.items():
            hit = self._blocked.get(key)
            if hit is None or hit[0] != used:
                room = capacity.get(key, 0) - used
                hit = (used, [i for amount, i in consumers.get(key, ()) if amount > room])
            cache[key] = hit
            blocked.update(hit[1])
        self._blocked = cache
        return inv.live & ~ledger.used_bits & ~bits_of(shared) & ~bits_of(list(blocked)) & ~oversized

    def _counter_users(self) -> tuple[dict[CounterKey, list[tuple[int, int]]], dict[CounterKey, int], int]:
        """For the current inventory version: counter -> (amount, device id) of the devices consuming it,
        counter -> what it holds, and the bits of devices that need more than a counter holds at all."""
        inv = self.inventory
        if self._counters[0] != inv.version:
            consumers: dict[CounterKey, list[tuple[int, int]]] = {}
            capacity: dict[CounterKey, int] = {}
            too_big = []
            for rec in inv.devices:
                if rec is None or not rec.consumes:
                    continue
                counters = inv.pool_of(rec).counters
                for key, amount in rec.consumes:
                    consumers.setdefault(key, []).append((amount, rec.id))
                    capacity[key] = counters.get(key, 0)
                    if amount > capacity[key]:
                        too_big.append(rec.id)
            self._counters = (inv.version, consumers, capacity, bits_of(too_big))
            self._blocked = {}
        _, consumers, capacity, oversized = self._counters
        return consumers, capacity, oversized

    def _node_classes(self, span: tuple[int, int], classes: dict[str, int]) -> dict[str, _NodeClass]:
        """A node's devices (`LocalMasks.span`: lo, bits shifted by lo) per class and NVLink domain, shifted by lo."""
        devices = self.inventory.devices
        lo, bits = span
        per_class = {}
        for cls, matched in classes.items():
            mine = bits & (matched >> lo)
            if not mine:
                continue
            domains: dict[object, int] = {}
            for i in iter_bits(mine):
                rec = devices[lo + i]
                domain = rec.attribute(NVLINK_DOMAIN) if rec is not None else None
                domains[domain] = domains.get(domain, 0) | 1 << i
            blocks = list(domains.values())
            per_class[cls] = _NodeClass(mine, mine.bit_count(), blocks, max(b.bit_count() for b in blocks))
        return per_class
