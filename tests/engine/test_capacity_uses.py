"""An alternative with capacity requests keeps what taking a device consumes per published capacity
map (plan.py `Alt.uses`): the answer `consumed_capacity` gives is the one worked out afresh
(`_consumed`) for every device, also where devices of two drivers publish one map instance (the
engine shares equal maps of namesakes, repeats.py, and the fully-qualified names differ by driver),
and the claims of one spec share it."""

from __future__ import annotations

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.plan import _consumed, consumed_capacity
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVERS = ("a.example.com", "b.example.com")


def _slice(driver: str, node: str, memory: str) -> ResourceSlice:
    policy = {"default": "8Gi", "validRange": {"min": "4Gi", "step": "4Gi"}}
    devices = [{"name": f"vgpu-{i}", "allowMultipleAllocations": True, "capacity": {"memory": {"value": memory, "requestPolicy": policy}}} for i in range(2)]
    spec = {"driver": driver, "pool": {"name": f"{node}-{driver}", "generation": 1, "resourceSliceCount": 1}, "nodeName": node, "devices": devices}
    return msgspec.convert({"metadata": {"name": f"{node}-{driver}"}, "spec": spec}, ResourceSlice)


def _claim(name: str, memory: str) -> ResourceClaim:
    exactly = {"deviceClassName": "vgpu", "count": 1, "capacity": {"requests": {"memory": memory}}}
    devices = {"requests": [{"name": "gpu", "exactly": exactly}]}
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"}, "spec": {"devices": devices}}, ResourceClaim)


def test_capacity_uses_kept_per_map_are_the_fresh_ones():
    engine = Engine()
    expression = " || ".join(f'device.driver == "{d}"' for d in DRIVERS)
    engine.apply(msgspec.convert({"metadata": {"name": "vgpu"}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}, DeviceClass))
    for n, memory in enumerate(("48Gi", "48Gi", "80Gi")):
        engine.apply(msgspec.convert({"metadata": {"name": f"node-{n}"}}, Node))
        for driver in DRIVERS:
            assert engine.apply(_slice(driver, f"node-{n}", memory)) == []
    recs = [rec for rec in engine.inventory.devices if rec is not None]
    drivers_of: dict[int, set[str]] = {}  # map instance -> drivers of the devices publishing it
    for rec in recs:
        drivers_of.setdefault(id(rec.spec.capacity), set()).add(rec.driver)
    assert any(len(drivers) == 2 for drivers in drivers_of.values())  # namesakes share a map, across drivers too
    for memory in ("6Gi", "30Gi", "64Gi"):
        plan = engine._plan(_claim(f"c-{memory.lower()}", memory))
        alt = plan.requests[0].alts[0]
        for _ in range(2):  # (the second pass reads what the first kept)
            for rec in recs:
                assert consumed_capacity(alt, rec) == _consumed(alt, rec), (rec.label, memory)
        assert alt.uses
        again = engine._plan(_claim(f"d-{memory.lower()}", memory))
        assert again.requests[0].alts[0] is alt  # one spec, one alternative: what it keeps serves the next claim
    # and the claims themselves: shares of each driver's devices, with the driver's own capacity names
    outcomes = engine.allocate([_claim(f"e-{i}", "24Gi") for i in range(12)])
    assert [o.status for o in outcomes] == ["allocated"] * 12
    assert {o.allocation.devices.results[0].driver for o in outcomes} == set(DRIVERS)
    assert all(o.allocation.devices.results[0].consumed_capacity == {"memory": "24Gi"} for o in outcomes)
