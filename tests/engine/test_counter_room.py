"""The ledger keeps `counter_room`'s answer on each device drawing on one counter set while the
set's clock has not moved (`DeviceRec.room_ok`, `CounterClock`): after any allocations, releases
and pool rebuilds, every answer it gives is the one worked out afresh from the counters
(`_counter_room`), for devices drawing on one set and on two (whose changes move both sets' clocks)."""

from __future__ import annotations

import random

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"


def _partitions(chip: str) -> list[dict]:
    """A chip's whole device, its halves and quarters (MIG-like: each consumes the slices it covers)."""
    shapes = [("whole", range(4)), ("half-0", range(2)), ("half-1", range(2, 4)), *((f"quarter-{i}", range(i, i + 1)) for i in range(4))]
    return [
        {
            "name": f"{chip}-{name}",
            "attributes": {"part": {"string": f"{chip}-{name}"}},
            "consumesCounters": [{"counterSet": chip, "counters": {f"slice-{s}": {"value": "1"} for s in slices}}],
        }
        for name, slices in shapes
    ]


def _slice(node: str, generation: int, slices: int) -> ResourceSlice:
    """Two chips of four slices each (`slices` of them published: a rebuild may shrink them), and a
    bridge device drawing on both chips' sets."""
    devices = [*_partitions("chip-0"), *_partitions("chip-1")]
    devices.append(
        {
            "name": "bridge",
            "attributes": {"part": {"string": "bridge"}},
            "consumesCounters": [{"counterSet": chip, "counters": {"slice-3": {"value": "1"}}} for chip in ("chip-0", "chip-1")],
        }
    )
    counters = [{"name": chip, "counters": {f"slice-{s}": {"value": "1" if s < slices else "0"} for s in range(4)}} for chip in ("chip-0", "chip-1")]
    spec = {"driver": DRIVER, "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "nodeName": node, "devices": devices}
    spec["sharedCounters"] = counters
    return msgspec.convert({"metadata": {"name": f"{node}-chips"}, "spec": spec}, ResourceSlice)


def _claim(name: str, device: str) -> ResourceClaim:
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].part == "{device}"'}}
    exactly = {"deviceClassName": "chips", "count": 1, "selectors": [selector]}
    devices = {"requests": [{"name": "part", "exactly": exactly}]}
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": {"devices": devices}}, ResourceClaim)


def _check(engine: Engine) -> int:
    """Ask every counter-consuming device's room twice (the second answer may be the kept one) and
    compare both with the answer worked out afresh; the number of devices without room."""
    ledger, full = engine.ledger, 0
    for rec in engine.inventory.devices:
        if rec is None or not rec.consumes:
            continue
        fresh = ledger._counter_room(rec)
        assert ledger.counter_room(rec) == fresh, rec.label
        assert ledger.counter_room(rec) == fresh, rec.label
        full += not fresh
    return full


def test_counter_room_answers_kept_are_the_fresh_ones():
    rng = random.Random(5)
    engine = Engine(scoring=False)
    klass = {"metadata": {"name": "chips"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
    engine.apply(msgspec.convert(klass, DeviceClass))
    for node in ("node-a", "node-b"):
        engine.apply(msgspec.convert({"metadata": {"name": node}}, Node))
        assert engine.apply(_slice(node, 1, 4)) == []
    names = [d["name"] for d in _partitions("chip-0") + _partitions("chip-1")] + ["bridge"]
    held: list[str] = []
    generation, taken, blocked = 1, 0, 0
    for step in range(400):
        _check(engine)  # every answer kept before the change
        roll = rng.random()
        if roll < 0.5:
            (outcome,) = engine.allocate([_claim(f"c-{step}", rng.choice(names))])
            if outcome.status == "allocated":
                held.append(outcome.claim)
                taken += 1
        elif roll < 0.95 and held:
            engine.release(held.pop(rng.randrange(len(held))))
        else:
            generation += 1  # the pool rebuilt, its counters shrunk or grown back
            assert engine.apply(_slice(rng.choice(("node-a", "node-b")), generation, rng.choice((2, 4)))) == []
        blocked += _check(engine)
    assert taken > 50 and blocked > 50  # the walk did take devices and fill counters
