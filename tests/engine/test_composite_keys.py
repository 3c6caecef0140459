"""The engine's composite dict keys stay the one object they were made as (inventory.py's note on
composite keys): a device's key and counter keys, and a request's verdict keys. Typed as
fixed-length tuples, the native build keeps them unboxed and every read makes a new tuple, hashed
and compared item by item on each dict lookup (~10% of a churn-mixed claim's instructions). The
interpreter never copies a tuple; this fails on the native build (DRALLOC_NATIVE=1) if one of these
is typed back to a fixed length."""

from __future__ import annotations

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.inventory import counter_parts
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"


def _engine() -> Engine:
    """One node with a GPU split in two halves drawing on the GPU's counter set."""
    engine = Engine()
    klass = {"metadata": {"name": "gpus"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
    engine.apply(msgspec.convert(klass, DeviceClass))
    engine.apply(msgspec.convert({"metadata": {"name": "node-a"}}, Node))
    devices = [
        {
            "name": f"gpu-0-half-{h}",
            "attributes": {"half": {"int": h}},
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1"}}}],
        }
        for h in range(2)
    ]
    spec = {
        "driver": DRIVER,
        "pool": {"name": "node-a", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": devices,
        "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "2"}}}],
    }
    assert engine.apply(msgspec.convert({"metadata": {"name": "node-a-gpus"}, "spec": spec}, ResourceSlice)) == []
    return engine


def test_device_and_counter_keys_are_read_as_the_same_object():
    engine = _engine()
    rec = next(r for r in engine.inventory.devices if r is not None)
    assert rec.key == (DRIVER, "node-a", "gpu-0-half-0")
    assert rec.key is rec.key
    assert next(k for k in engine.inventory.by_key if k == rec.key) is rec.key
    assert rec.counter_set is not None and counter_parts(rec.counter_set) == [DRIVER, "node-a", "gpu-0"]
    ((counter, amount),) = rec.consumes
    assert counter_parts(counter) == [DRIVER, "node-a", "gpu-0", "memory"] and amount > 0
    pool = engine.inventory.pool_of(rec)
    assert next(k for k in pool.counters if k == counter) is counter  # the key the device reads is the pool's own
    assert pool.counter_sets[counter] is rec.counter_set


def test_verdict_keys_are_read_as_the_same_object():
    engine = _engine()
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].half == 1'}}
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpus", "selectors": [selector]}}]}},
    }
    plan = engine.planner.plan(msgspec.convert(claim, ResourceClaim), engine.inventory.classes, engine.inventory.class_versions)
    (alt,) = plan.requests[0].alts
    assert alt.verdict_key == ("gpus", engine.inventory.class_versions["gpus"], (selector["cel"]["expression"],))
    assert alt.verdict_key is alt.verdict_key
    assert alt.class_key is alt.class_key
    (outcome,) = engine.allocate([msgspec.convert(claim, ResourceClaim)])
    assert outcome.status == "allocated" and outcome.allocation.devices.results[0].device == "gpu-0-half-1"
