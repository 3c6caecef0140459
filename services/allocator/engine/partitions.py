"""Best fit for partitions (MIG slices): take the placement that blocks the fewest partitions in use.

A partitionable GPU publishes every placement of every profile as a device, each consuming its
share of the GPU's counters (discovery/slices.py): on an H200, `1g.18gb` at memory slices 0-6,
`2g.35gb` at 0, 2 and 4, `3g.71gb` at 0 and 4, and more. Taking one placement makes the ones it
overlaps unavailable. Which free placement a one-slice claim takes decides what is left: a 1g
slice in a half already broken leaves the other half free for a 3g; one in an intact half does
not. Kubernetes takes the first in name order; the node's topology order takes the fullest GPU.

`Partitions.reorder` orders a single partition's candidates on the chosen node by their *cost*:
the free devices each would make unavailable (devices sharing one of its counters beyond the
counter's capacity: a memory slice both use), each weighted by how many devices of its kind
(driver and MIG profile, else `type`) are in use fleet-wide now: the partitions the fleet is
running are the ones likely to be asked for again, and a kind nobody uses costs nothing. Ties
keep the topology order. Measured on `dralloc bench placement` (README "Placement"): H200 MIG
refusals over seeds 1-5 1,562 -> 1,511, seeds 6-10 1,402 -> 1,387.

The weights are derived from the ledger (`on_charge`, pool rebuilds), so a try that is given
back, or a new leader's rebuild, leaves them as the allocations are.
"""

from __future__ import annotations

import operator

from dralloc.allocator.engine.inventory import CounterKey, DeviceRec, Inventory, Pool
from dralloc.allocator.engine.ledger import Ledger

Kind = tuple[str, ...]
"""(driver, MIG profile, else the device's `type`): the partitions one claim's selector asks for
(of any length for mypyc: inventory.py's note on composite keys)."""


def partition_kind(rec: DeviceRec) -> Kind:
    """A partition's kind for the weights: its driver and profile (else its type, else '')."""
    attrs = rec.spec.attributes
    attr = attrs.get("profile") or attrs.get("type")
    return (rec.driver, attr.string if attr is not None and attr.string else "")


_AMOUNT = operator.itemgetter(1)


class Partitions:
    """Devices in use per partition kind, and each partition's overlaps (worked out on first use)."""

    def __init__(self, inventory: Inventory, ledger: Ledger) -> None:
        self.inv = inventory
        self.ledger = ledger
        self.in_use: dict[Kind, int] = {}
        """Kind -> devices of that kind (consuming counters) held exclusively now."""
        self._overlaps: dict[int, tuple[tuple[DeviceRec, Kind], ...]] = {}
        """Device id -> the devices of its pool it cannot be held with (a counter both use, past its capacity)."""
        self._consumers: dict[tuple[str, str], tuple[Pool, dict[CounterKey, list[tuple[DeviceRec, int, Kind]]]]] = {}
        """Pool -> (the pool, counter -> the devices consuming it, how much, their kinds): `overlaps`' index."""
        self._whole: dict[int, bool] = {}
        """Device id -> whether it consumes every counter of its sets (a whole GPU: not a partition)."""
        ledger.on_charge.append(self._charge)
        inventory.on_pool_rebuilt.append(self._rebuilt)

    def reorder(self, cands: list[DeviceRec]) -> bool:
        """Sort one slot's candidates (a single device asked for) by cost, stably; False (and the
        list unchanged) when its first candidate is no partition or the order stays the same."""
        if not self.partition(cands[0]):
            return False
        costs = [self.cost(rec) for rec in cands]
        order = sorted(range(len(cands)), key=costs.__getitem__)
        if all(i == j for i, j in enumerate(order)):
            return False
        cands[:] = [cands[i] for i in order]
        return True

    def partition(self, rec: DeviceRec) -> bool:
        """Whether the device is a partition: it consumes some, not all, of its counter sets."""
        return bool(rec.consumes) and not self._is_whole(rec)

    def cost(self, rec: DeviceRec) -> int:
        """The free devices taking `rec` would make unavailable, each weighted by its kind's use."""
        in_use, ledger = self.in_use, self.ledger
        total = 0
        for other, kind in self.overlaps(rec):
            weight = in_use.get(kind, 0)
            if weight and ledger.free(other):  # (a method call, not a bound method held: native to native)
                total += weight
        return total

    def overlaps(self, rec: DeviceRec) -> tuple[tuple[DeviceRec, Kind], ...]:
        """The devices of `rec`'s pool that share a counter with it beyond the counter's capacity,
        each with its kind (read once here, not per cost)."""
        hit = self._overlaps.get(rec.id)
        if hit is None:
            pool = self.inv.pools[(rec.driver, rec.pool)]
            consumers = self._consumers_of(pool)
            found: dict[int, tuple[DeviceRec, Kind]] = {}
            for key, amount in rec.consume_totals:
                room = pool.counters.get(key, 0) - amount
                for other, used, kind in consumers[key]:
                    if used <= room:
                        break  # (most first: none after it overlaps on this counter)
                    if other is not rec:
                        found[other.id] = (other, kind)
            hit = self._overlaps[rec.id] = tuple(found.values())
        return hit

    def _consumers_of(self, pool: Pool) -> dict[CounterKey, list[tuple[DeviceRec, int, Kind]]]:
        """Counter -> (device, amount, its kind) of the pool's devices consuming it, the most first
        (kept while the pool is): a partition's overlaps on an engine counter (multiprocessors, copy
        engines) are the few profiles that take most of it, and `overlaps` stops at the first that
        fits beside it."""
        hit = self._consumers.get((pool.driver, pool.name))
        if hit is None or hit[0] is not pool:
            index: dict[CounterKey, list[tuple[DeviceRec, int, Kind]]] = {}
            for rec in pool.devices:
                if rec.consume_totals:
                    kind = partition_kind(rec)
                    for key, amount in rec.consume_totals:
                        index.setdefault(key, []).append((rec, amount, kind))
            for users in index.values():
                users.sort(key=_AMOUNT, reverse=True)
            hit = self._consumers[(pool.driver, pool.name)] = (pool, index)
        return hit[1]

    def _is_whole(self, rec: DeviceRec) -> bool:
        hit = self._whole.get(rec.id)
        if hit is None:
            set_of = self.inv.pools[(rec.driver, rec.pool)].counter_sets
            sets = {set_of.get(key) for key, _ in rec.consumes}
            own = {key for key, _ in rec.consumes}
            hit = self._whole[rec.id] = all(key in own for key, set_key in set_of.items() if set_key in sets)
        return hit

    def _charge(self, recs: list[DeviceRec], sign: int) -> None:
        """The ledger took (+1) or freed (-1) one record's exclusive devices."""
        for rec in recs:
            if rec.consumes:
                kind = partition_kind(rec)
                self.in_use[kind] = self.in_use.get(kind, 0) + sign

    def _rebuilt(self, pool: Pool, old_devices: list[DeviceRec]) -> None:
        """A pool's devices were replaced: its in-use devices counted by their new kinds (the ledger
        holds devices by name, so the same names stay in use), its overlaps worked out again."""
        held = self.ledger.exclusive
        for recs, sign in ((old_devices, -1), (pool.devices, 1)):
            self._charge([rec for rec in recs if rec.key in held], sign)
        self._consumers.pop((pool.driver, pool.name), None)
        for rec in old_devices:
            self._overlaps.pop(rec.id, None)
            self._whole.pop(rec.id, None)
