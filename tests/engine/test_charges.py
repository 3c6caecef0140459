"""The ledger charges a record's devices together (ledger.py `_charge`, placement.py
`KindIndex._charge`): after any allocations and releases, what it keeps incrementally (devices in
use, free counts per node and kind, nodes with k free, whole nodes, claims per node) is what a
pool rebuild works out again from the records, and each node's free count is its devices' count."""

from __future__ import annotations

import random

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.inventory import DEVICE_KINDS_KEPT, device_kind
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"


def _slice(node: str, generation: int) -> ResourceSlice:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "nvlink": {"string": f"{node}/{i // 4}"}}} for i in range(8)]
    spec = {"driver": DRIVER, "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "nodeName": node, "devices": devices}
    return msgspec.convert({"metadata": {"name": f"{node}-gpus"}, "spec": spec}, ResourceSlice)


def _claim(name: str, count: int, match: bool) -> ResourceClaim:
    devices: dict = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}
    if match:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/nvlink"}]
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": devices}}, ResourceClaim)


def _state(engine: Engine) -> tuple:
    """What the ledger and placement's index keep, by device and node name (ids change in a rebuild)."""
    ledger, kinds, inv = engine.ledger, engine.placement.kinds, engine.inventory
    used = sorted(inv.devices[i].label for i in range(len(inv.devices)) if (ledger.used_bits >> i) & 1)
    local = sorted(inv.devices[lo + off].label for node, (lo, bits) in kinds.used_local.items() for off in range(bits.bit_length()) if (bits >> off) & 1)
    return (
        used,
        sorted(inv.devices[i].label for i in ledger.used_ids),
        local,
        dict(ledger.free_local),
        [b for b in ledger.free_ge if b],
        {k: dict(v) for k, v in kinds.free.items()},
        {k: [b for b in v if b] for k, v in kinds.ge.items()},
        dict(kinds.whole),
        {n: dict(c) for n, c in kinds.claims.items() if c},
        {n: b for n, b in kinds.by_claims.items() if b},
        list(kinds.most_claims_first),
        {inv.devices[i].label: holder for i, holder in kinds.held.items()},  # type: ignore[union-attr]  # (held devices are live)
    )


def _free_counted(engine: Engine) -> dict[str, int]:
    """Free exclusive devices per node, counted device by device."""
    inv, used = engine.inventory, engine.ledger.used_ids
    return {node: sum(1 for i in inv.local.ids(node) if i not in used) for node in inv.local.nodes()}


def test_incremental_charges_are_what_a_rebuild_finds():
    rng = random.Random(11)
    nodes = ["node-a", "node-b", "node-c"]
    engine = Engine()
    engine.apply(msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass))
    for node in nodes:
        engine.apply(msgspec.convert({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}, Node))
        engine.apply(_slice(node, 1))
    generation, running, checked = 1, [], 0
    for i in range(120):
        if running and rng.random() < 0.4:
            assert engine.release(running.pop(rng.randrange(len(running))))
        else:
            count = rng.choice([1, 2, 3, 4, 8])
            (outcome,) = engine.allocate([_claim(f"c{i}", count, match=count > 1 and rng.random() < 0.7)])
            if outcome.status == "allocated":
                running.append(outcome.claim)
        assert engine.ledger.free_local == _free_counted(engine)
        kinds = engine.placement.kinds  # the counts with a node, largest first: kept per change, not sorted again
        assert kinds.most_claims_first == sorted((n for n, ranks in kinds.by_claims.items() if ranks), reverse=True)
        if i % 10 == 9:
            kept = _state(engine)
            generation += 1
            for node in nodes:  # the same devices again: the pools are rebuilt from the records
                assert engine.apply(_slice(node, generation)) == []
            assert _state(engine) == kept
            checked += len(running)
    assert checked > 50


def test_claim_counts_are_listed_largest_first_as_they_come_and_go():
    """`KindIndex.most_claims_first` puts a count in (or takes it out) where it goes, never sorting:
    counts appear above and below those listed, and leave from the middle and the ends."""
    engine = Engine()
    engine.apply(msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass))
    for node in ("node-a", "node-b", "node-c"):
        engine.apply(msgspec.convert({"metadata": {"name": node, "labels": {"kubernetes.io/hostname": node}}}, Node))
        engine.apply(_slice(node, 1))
    kinds, seen = engine.placement.kinds, set()
    steps = [("a", 1), ("c", 1), ("c", 1), ("c", 1), ("b", 1), ("b", 1), ("a", 1), ("c", -1), ("b", -1), ("c", -1), ("c", 1), ("a", -1), ("b", -1)]
    for i, (node, change) in enumerate(steps):
        if change > 0:
            (outcome,) = engine.allocate([_claim(f"{node}-{i}", 1, match=False)], node=f"node-{node}")
            assert outcome.status == "allocated"
        else:
            held = sorted(k for k in engine.ledger.claims if k.startswith(f"ns/{node}-"))
            assert engine.release(held[-1])
        assert kinds.most_claims_first == sorted((n for n, ranks in kinds.by_claims.items() if ranks), reverse=True)
        seen.add(tuple(kinds.most_claims_first))
    assert (3, 2, 1) in seen and (3, 1) in seen  # a count added below and above others, one taken from the middle


def test_no_two_driver_and_type_pairs_make_one_kind():
    """A device kind is one string (`device_kind`): however a hostile slice names its driver or its
    type, two different pairs never count as one kind, and the same pair is the same string."""
    pairs = [("a/b", "c"), ("a", "b/c"), ("a", "bc"), ("ab", "c"), ("1:a", "b"), ("", "1:a/b"), ("a", "")]
    kinds = [device_kind(driver, type_) for driver, type_ in pairs]
    assert len(set(kinds)) == len(pairs)
    assert [device_kind(driver, type_) for driver, type_ in pairs] == kinds
    for i in range(DEVICE_KINDS_KEPT + 5):  # past what the cache keeps: still the same answers
        device_kind(f"d{i}.example.com", "gpu")
    assert [device_kind(driver, type_) for driver, type_ in pairs] == kinds
