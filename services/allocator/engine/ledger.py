"""The ledger: which device, capacity and counter belongs to which claim.

Allocations are recorded by device identity (driver, pool, device name), so an
allocation restored before its slices arrive, or kept across a slice update,
still counts. Everything the search reads (devices in use, capacity used per
shared device, counters used, free devices per node) is derived from those
records against the current inventory and updated incrementally; a rebuilt
pool recomputes its part from the records. Releasing a claim removes exactly
its records, so the derived state returns to what it was.

Kubernetes rules kept here: an admin-access result does not make a device
busy; a device with allowMultipleAllocations is never busy, only its capacity
is consumed; a device consumes its counters while it is in use, and a shared
device consumes them once while it has at least one share (dralloc's rule:
the counters describe the hardware partition, which exists once).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from dralloc.allocator.engine.inventory import CounterKey, DeviceRec, DevKey, Inventory, Pool, bits_of, counter_prefix
from dralloc.schemas.resource import AllocationResult

TOUCHED_KEPT = 65_536
"""Entries of `Ledger.touched` kept before the log starts over (a reader further behind starts over too)."""


@dataclass(slots=True)
class Entry:
    device: DevKey
    kind: str  # "exclusive" | "share" | "admin"
    share: str  # share id for kind == "share"
    consumed: dict[str, int]  # fully-qualified capacity -> nano

    def __init__(self, device: DevKey, kind: str, share: str = "", consumed: dict[str, int] | None = None) -> None:
        # written out (one per device allocated): mypyc compiles it, not the interpreted one `@dataclass` generates
        self.device = device
        self.kind = kind
        self.share = share
        self.consumed = {} if consumed is None else consumed


@dataclass(slots=True)
class Record:
    claim: str
    allocation: AllocationResult
    node: str | None
    entries: list[Entry]

    def __init__(self, claim: str, allocation: AllocationResult, node: str | None, entries: list[Entry]) -> None:
        # written out (one per claim): mypyc compiles it, not the interpreted one `@dataclass` generates
        self.claim = claim
        self.allocation = allocation
        self.node = node
        self.entries = entries


class Ledger:
    def __init__(self, inventory: Inventory) -> None:
        self.inv = inventory
        self.claims: dict[str, Record] = {}
        self.exclusive: dict[DevKey, str] = {}
        self.shares: dict[DevKey, dict[str, tuple[str, dict[str, int]]]] = {}
        # derived, by current device id
        self.used_bits = 0  # exclusively allocated devices
        self.used_ids: set[int] = set()  # the same, as ids: a membership test without shifting a fleet-sized int
        self.cap_used: dict[int, dict[str, int]] = {}
        self.counter_used: dict[CounterKey, int] = {}
        self.free_local: dict[str, int] = {}  # node -> free exclusive node-local devices
        self.free_ge: list[int] = [0]  # k -> bitset of node ranks with at least k free
        self.on_charge: list[Callable[[list[DeviceRec], int], None]] = []  # (a record's devices, +1 taken / -1 freed): placement's indexes
        self.node_changes: dict[str, int] = {}
        """node -> count of ledger changes that can alter what fits there: a device of a pool with a
        device local to the node taken, shared or freed (misfits.py keys what failed on a node by it)."""
        self.remote_changes = 0
        """The same for devices local to no node (network-attached): they can be reached from many nodes."""
        self.touched: list[int] = []
        """The ranks of the nodes of `node_changes`, in the order of their changes since `touched_base`
        (misfits.py reads what changed since it last looked, once per claim shape: ranks, not names,
        so no reader looks a name up; trimmed at TOUCHED_KEPT)."""
        self.touched_base = 0
        """Changes before `touched[0]` (the log's absolute position of its first entry)."""
        inventory.on_pool_rebuilt.append(self._pool_rebuilt)

    # --- queries -----------------------------------------------------------------------

    def active(self, rec: DeviceRec) -> bool:
        """Whether the device is in use at all (and so consumes its counters)."""
        return rec.id in self.used_ids or bool(self.shares.get(rec.key))

    def counters_fit(self, rec: DeviceRec) -> bool:
        """Whether taking the device needs no counter room it lacks: it consumes none, already
        consumes its own (in use), or its counters fit beside what the ledger uses."""
        return not rec.consumes or self.active(rec) or self.counter_room(rec)

    def free(self, rec: DeviceRec) -> bool:
        """The "free device" test: not held exclusively, and its counters fit (`counters_fit`).
        Capacity of shared devices and taints are the caller's (they depend on the request)."""
        return rec.id not in self.used_ids and self.counters_fit(rec)

    def counter_room(self, rec: DeviceRec) -> bool:
        """Whether the device's counters fit beside what the ledger already uses. For a device
        drawing on one set, the answer kept on it while its set's clock has not moved
        (`DeviceRec.room_ok`): a claim's filters ask it of every MIG slice its selector matches
        on a node, and a change moves one GPU's clock of the node's several."""
        clock = rec.clock
        if clock is None:
            return self._counter_room(rec)
        if rec.room_at != clock.changes:
            rec.room_ok = self._counter_room(rec)
            rec.room_at = clock.changes
        return rec.room_ok

    def _counter_room(self, rec: DeviceRec) -> bool:
        """`counter_room` worked out from the counters."""
        # a plain loop, not all(<genexpr>): it runs for every MIG slice a claim could take
        counters = self.inv.pools[(rec.driver, rec.pool)].counters
        used = self.counter_used
        for key, amount in rec.consumes:  # noqa: SIM110 - the loop is the point (see above)
            if used.get(key, 0) + amount > counters.get(key, 0):
                return False
        return True

    # --- records -------------------------------------------------------------------------

    def add(self, record: Record) -> None:
        self.claims[record.claim] = record
        taken: list[DeviceRec] = []  # charged together once every holder is named (`_charge`)
        known: list[DeviceRec] = []  # the record's devices in the inventory (`_touch`)
        for entry in record.entries:
            rec = self.inv.by_key.get(entry.device)
            if rec is not None:
                known.append(rec)
            if entry.kind == "exclusive":
                self.exclusive[entry.device] = record.claim
                if rec is not None:
                    taken.append(rec)
            elif entry.kind == "share":
                shares = self.shares.setdefault(entry.device, {})
                first = not shares
                shares[entry.share] = (record.claim, entry.consumed)
                if rec is not None:
                    used = self.cap_used.setdefault(rec.id, {})
                    for name, amount in entry.consumed.items():
                        used[name] = used.get(name, 0) + amount
                    if first:
                        self._counters(rec, +1)
        if known:
            self._touch(known)
        if taken:
            self._charge(taken, +1)

    def remove(self, claim: str) -> Record | None:
        record = self.claims.pop(claim, None)
        if record is None:
            return None
        freed: list[DeviceRec] = []  # freed together (`_charge`)
        known: list[DeviceRec] = []  # the record's devices in the inventory (`_touch`)
        for entry in record.entries:
            rec = self.inv.by_key.get(entry.device)
            if rec is not None:
                known.append(rec)
            if entry.kind == "exclusive":
                if self.exclusive.get(entry.device) == claim:
                    del self.exclusive[entry.device]
                    if rec is not None:
                        freed.append(rec)
            elif entry.kind == "share":
                shares = self.shares.get(entry.device, {})
                if shares.pop(entry.share, None) is None:
                    continue
                if rec is not None:
                    used = self.cap_used.get(rec.id, {})
                    for name, amount in entry.consumed.items():
                        left = used.get(name, 0) - amount
                        if left:
                            used[name] = left
                        else:
                            used.pop(name, None)
                    if not used:
                        self.cap_used.pop(rec.id, None)
                    if not shares:
                        self._counters(rec, -1)
                if not shares:
                    self.shares.pop(entry.device, None)
        if known:
            self._touch(known)
        if freed:
            self._charge(freed, -1)
        return record

    # --- derived state -------------------------------------------------------------------

    def _touch(self, recs: list[DeviceRec]) -> None:
        """Count a change for every node the devices' pools reach (a pool's counters are shared by
        the whole pool, which may span nodes): once a record, however many of its devices a node
        has, so that `touched` logs each change of a node once (Misfits reads it per claim shape)."""
        pools = self.inv.pools
        if len(recs) == 1:  # (most records: without the dict and set below)
            rec = recs[0]
            pool = pools.get((rec.driver, rec.pool))
            self._changed(pool.nodes() if pool is not None else (rec.local_node,))
            return
        nodes: dict[str | None, None] = {}  # (ordered, each once)
        seen: set[tuple[str, str]] = set()
        for rec in recs:
            key = (rec.driver, rec.pool)
            if key in seen:
                continue
            pool = pools.get(key)
            if pool is None:
                nodes[rec.local_node] = None
                continue
            seen.add(key)
            for node in pool.nodes():
                nodes[node] = None
        self._changed(nodes)

    def _changed(self, nodes: Iterable[str | None]) -> None:
        """A change counted for each of `nodes` (None: a device local to no node), in order."""
        changes = self.node_changes
        touched = self.touched
        if len(touched) >= TOUCHED_KEPT:
            self.touched_base += len(touched)
            touched.clear()
        for node in nodes:
            if node is None:
                self.remote_changes += 1
            else:
                changes[node] = changes.get(node, 0) + 1
                touched.append(self.inv.rank_of(node))

    def _charge(self, recs: list[DeviceRec], sign: int) -> None:
        """Take (+1) or free (-1) the exclusive devices of one record, together: `used_bits` (as
        wide as the fleet: each change makes a new int) and each node's free count change once,
        not once a device, and placement's indexes are told of them all in one call (`on_charge`)."""
        used = self.used_ids
        ids: list[int] = []  # (one bitset built of them all: `1 << id` per device was two ints as wide as the fleet)
        free: dict[str, int] = {}  # node -> change of its free count
        for rec in recs:
            rid = rec.id
            if sign > 0:
                ids.append(rid)
                used.add(rid)
            elif rid in used:
                ids.append(rid)
                used.discard(rid)
            if not rec.multi and rec.local_node is not None:
                free[rec.local_node] = free.get(rec.local_node, 0) - sign
            if rec.consumes:
                self._counters(rec, sign)
        if ids:
            # taken: `|` (a device may be held already); freed: each bit is set, and `^` needs no fleet-sized `~bits`
            bits = bits_of(ids)
            self.used_bits = self.used_bits | bits if sign > 0 else self.used_bits ^ bits
        for node, change in free.items():
            self._set_free(node, self.free_local.get(node, 0) + change)
        for callback in self.on_charge:
            callback(recs, sign)

    def _counters(self, rec: DeviceRec, sign: int) -> None:
        """Add (+1) or take back (-1) what the device consumes of its counters; the changed sets'
        clocks move (the answers `counter_room` kept against them are stale)."""
        if rec.clock is not None:
            rec.clock.changes += 1
        else:
            pool = self.inv.pools.get((rec.driver, rec.pool))
            for key, _ in rec.consumes:
                clock = pool.clocks.get(pool.counter_sets.get(key, "")) if pool is not None else None
                if clock is not None:
                    clock.changes += 1
        used = self.counter_used
        for key, amount in rec.consumes:
            left = used.get(key, 0) + sign * amount
            if left:
                used[key] = left
            else:
                used.pop(key, None)

    def _set_free(self, node: str, new: int) -> None:
        old = self.free_local.get(node, 0)
        if new == old:
            return
        self.free_local[node] = new
        bit = 1 << self.inv.rank_of(node)
        free_ge = self.free_ge
        while len(free_ge) <= max(new, old):
            free_ge.append(0)
        if new > old:
            for k in range(old + 1, new + 1):
                free_ge[k] |= bit
        else:
            for k in range(new + 1, old + 1):
                free_ge[k] ^= free_ge[k] & bit

    def _pool_rebuilt(self, pool: Pool, old_devices: list[DeviceRec]) -> None:
        """A pool's devices were replaced: what is derived from the records, again for its devices.
        Each node's free count changes once by the pool's net change (`free_ge` ends as steps of
        one would leave it: k set for k up to the count), and `used_bits` once per pool."""
        change: dict[str, int] = {}  # node -> change of its free exclusive node-local devices
        gone: list[int] = []
        for rec in old_devices:
            busy = rec.id in self.used_ids
            if busy:
                gone.append(rec.id)
                self.used_ids.discard(rec.id)
            elif not rec.multi and rec.local_node is not None:
                change[rec.local_node] = change.get(rec.local_node, 0) - 1
            self.cap_used.pop(rec.id, None)
        if gone:
            self.used_bits ^= bits_of(gone)  # (each bit is set: no fleet-sized `~`)
        prefix = counter_prefix(pool.driver, pool.name)
        for key in [k for k in self.counter_used if k.startswith(prefix)]:
            del self.counter_used[key]
        exclusive, all_shares = self.exclusive, self.shares
        taken: list[int] = []
        for rec in pool.devices:
            busy = rec.key in exclusive
            if busy:
                taken.append(rec.id)
                self.used_ids.add(rec.id)
            elif not rec.multi and rec.local_node is not None:
                change[rec.local_node] = change.get(rec.local_node, 0) + 1
            shares = all_shares.get(rec.key) if all_shares else None
            if shares:
                used: dict[str, int] = {}
                for _, consumed in shares.values():
                    for name, amount in consumed.items():
                        used[name] = used.get(name, 0) + amount
                self.cap_used[rec.id] = used
            if busy or shares:
                self._counters(rec, +1)
        if taken:
            self.used_bits |= bits_of(taken)
        for node, delta in change.items():
            if delta:
                self._set_free(node, self.free_local.get(node, 0) + delta)
