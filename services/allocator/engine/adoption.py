"""Adopting an allocation made elsewhere, only when it conflicts with nothing already held.

A claim may arrive with `status.allocation` set: from Kubernetes, where another allocator
(kube-scheduler) made it, or from a file or the CLI, where anyone wrote it. The engine must not
take it on trust: a result naming a device another claim holds (in any namespace), a share id
another claim uses, more capacity than a shared device has left, or counters a partition's
siblings already use, would hand those out twice. `adopt` records the allocation exactly as
`Engine.restore` does, then checks the ledger around this claim's entries; on any conflict it
takes the claim out again (the ledger is back where it was) and says who holds what.

A device the inventory does not know (its slice not published yet, or never) conflicts with
nothing now; it is held from then on, so its slice arriving later cannot give it out twice.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dralloc.allocator.engine.inventory import counter_parts
from dralloc.schemas.resource import ResourceClaim

if TYPE_CHECKING:
    from dralloc.allocator.engine.engine import Engine
    from dralloc.allocator.engine.inventory import CounterKey, DevKey
    from dralloc.allocator.engine.ledger import Ledger


def adopt(engine: Engine, claim: ResourceClaim) -> list[str]:
    """Hold the claim's `status.allocation` if it conflicts with nothing; otherwise hold nothing
    and return the conflicts, each naming the device and the claim(s) holding it."""
    key = claim.key
    allocation = claim.status.allocation if claim.status is not None else None
    if allocation is None:
        return [f"claim {key} has no status.allocation to adopt"]
    ledger = engine.ledger
    # A share id already used by another claim: restoring would overwrite that claim's share.
    conflicts = []
    exclusive: set[tuple[str, str, str]] = set()
    for result in allocation.devices.results:
        dkey = (result.driver, result.pool, result.device)
        rec = engine.inventory.by_key.get(dkey)
        if result.share_id is None and not result.admin_access and not (rec is not None and rec.multi):
            if dkey in exclusive:
                conflicts.append(f"device {_label(*dkey)} is listed twice")
            exclusive.add(dkey)
        if result.share_id is not None:
            holder = ledger.shares.get((result.driver, result.pool, result.device), {}).get(result.share_id)
            if holder is not None and holder[0] != key:
                conflicts.append(f"share {result.share_id} of device {_label(result.driver, result.pool, result.device)} belongs to claim {holder[0]}")
    if conflicts:
        return conflicts
    conflicts = engine.restore(claim)  # "already allocated to claim X", unreadable consumedCapacity
    record = ledger.claims.get(key)
    if record is not None:
        conflicts += _overuse(ledger, key, [entry.device for entry in record.entries])
    if conflicts:
        engine.release(key)
    return conflicts


def _overuse(ledger: Ledger, key: str, devices: list[DevKey]) -> list[str]:
    """What this claim's devices now over-use: a device both exclusive and shared, capacity
    past a shared device's own, counters past their set's."""
    inventory = ledger.inv
    found: list[str] = []
    counters_seen: set[CounterKey] = set()
    for dkey in dict.fromkeys(devices):  # each device once, in result order
        label = _label(*dkey)
        sharers = sorted({claim for claim, _ in ledger.shares.get(dkey, {}).values()})
        exclusive = ledger.exclusive.get(dkey)
        if exclusive is not None and any(s != exclusive for s in sharers):
            others = sorted({exclusive, *sharers} - {key})
            found.append(f"device {label} is allocated to claim {', '.join(others)}")
            continue
        rec = inventory.by_key.get(dkey)
        if rec is None:
            continue  # not in the inventory: nothing to compare with (see the module docstring)
        if sharers and not rec.multi and len(sharers) > 1:
            found.append(f"device {label} does not allow multiple allocations and is allocated to claim {', '.join(s for s in sharers if s != key)}")
            continue
        for name, used in ledger.cap_used.get(rec.id, {}).items():
            capacity = rec.capacity.get(name)
            if capacity is None or used > capacity.value:
                holders = ", ".join(s for s in sharers if s != key) or "no other claim"
                has = "has no such capacity" if capacity is None else f"has {capacity.value}, {used} would be in use"
                found.append(f"device {label}: capacity {name} {has} (shared with claim {holders})")
        pool = inventory.pools.get((rec.driver, rec.pool))
        for counter, _ in rec.consumes:
            if counter in counters_seen or pool is None:
                continue
            counters_seen.add(counter)
            if ledger.counter_used.get(counter, 0) > pool.counters.get(counter, 0):
                others = _counter_holders(ledger, counter, key)
                _, _, counter_set, name = counter_parts(counter)
                found.append(
                    f"device {label}: counter {counter_set}/{name} of pool {rec.driver}/{rec.pool} is used up by claim {', '.join(others) or '(none)'}"
                )
    return found


def _counter_holders(ledger: Ledger, counter: CounterKey, key: str) -> list[str]:
    """Other claims holding a device that consumes `counter` (only asked after a conflict)."""
    inventory = ledger.inv
    holders = []
    for claim, record in ledger.claims.items():
        if claim == key:
            continue
        for entry in record.entries:
            rec = inventory.by_key.get(entry.device)
            if entry.kind != "admin" and rec is not None and any(k == counter for k, _ in rec.consumes):
                holders.append(claim)
                break
    return sorted(holders)


def _label(driver: str, pool: str, device: str) -> str:
    return f"{driver}/{pool}/{device}"
