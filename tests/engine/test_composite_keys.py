"""The engine's composite dict keys stay the one object they were made as (inventory.py's note on
composite keys): a device's key (a tuple of any length), and counter keys and a request's verdict
keys (strings that name their parts injectively). Typed as fixed-length tuples, the native build
keeps them unboxed and every read makes a new tuple, hashed
and compared item by item on each dict lookup (~10% of a churn-mixed claim's instructions). The
interpreter never copies a tuple; this fails on the native build (DRALLOC_NATIVE=1) if one of these
is typed back to a fixed length."""

from __future__ import annotations

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.inventory import counter_key, counter_parts, counter_prefix
from dralloc.allocator.engine.plan import verdict_key
from dralloc.schemas.quantity import NANO
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"


def _engine() -> Engine:
    """One node with a GPU split in two halves drawing on the GPU's counter set."""
    engine = Engine()
    klass = {"metadata": {"name": "gpus"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}
    engine.apply(msgspec.convert(klass, DeviceClass))
    engine.apply(msgspec.convert({"metadata": {"name": "node-a"}}, Node))
    assert engine.apply(_halves("node-a", first=0)) == []
    return engine


def _halves(pool: str, *, first: int, generation: int = 1) -> ResourceSlice:
    """Pool `pool` on node-a: a GPU's two halves (attribute `half`: `first`, `first` + 1), each
    consuming 1 of the GPU's memory counter of 2."""
    devices = [
        {
            "name": f"gpu-0-half-{h}",
            "attributes": {"half": {"int": first + h}},
            "consumesCounters": [{"counterSet": "gpu-0", "counters": {"memory": {"value": "1"}}}],
        }
        for h in range(2)
    ]
    spec = {
        "driver": DRIVER,
        "pool": {"name": pool, "generation": generation, "resourceSliceCount": 1},
        "nodeName": "node-a",
        "devices": devices,
        "sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "2"}}}],
    }
    return msgspec.convert({"metadata": {"name": f"{pool.replace('/', '-')}-gpus"}, "spec": spec}, ResourceSlice)


def _claim(name: str, half: int) -> ResourceClaim:
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].half == {half}'}}
    claim = {
        "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpus", "selectors": [selector]}}]}},
    }
    return msgspec.convert(claim, ResourceClaim)


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


def test_counter_keys_tell_any_names_apart_and_their_pool_by_prefix():
    names = [
        (DRIVER, "node-a", "gpu-0", "memory"),
        (DRIVER, "node-a", "gpu-0\x00memory", ""),  # (what joining with NUL would have made one key)
        (DRIVER, "node-a", "gpu-0", "memory\x00"),
        (DRIVER, "node-a/x", "gpu-0", "memory"),
        (DRIVER, 'node-a","gpu-0', "memory", "x"),
        (DRIVER, "node-a", 'gpu-0"]', "memory"),
    ]
    keys = [counter_key(*n) for n in names]
    assert len(set(keys)) == len(names)
    assert [counter_parts(k) for k in keys] == [list(n) for n in names]
    prefix = counter_prefix(DRIVER, "node-a")
    assert [k.startswith(prefix) for k in keys] == [n[1] == "node-a" for n in names]
    assert counter_key(DRIVER, "node-a", "gpu-0").startswith(prefix)


def test_a_pool_rebuilt_recounts_its_own_counters_and_no_other_pools():
    engine = _engine()
    assert engine.apply(_halves("node-a/x", first=10)) == []  # a pool whose name starts with the other's
    for name, half in (("a", 0), ("b", 10)):
        (outcome,) = engine.allocate([_claim(name, half)])
        assert outcome.status == "allocated", outcome
    mine, other = counter_key(DRIVER, "node-a/x", "gpu-0", "memory"), counter_key(DRIVER, "node-a", "gpu-0", "memory")
    assert engine.ledger.counter_used == {other: NANO, mine: NANO}
    assert engine.apply(_halves("node-a/x", first=10, generation=2)) == []  # the same devices again: rebuilt
    assert engine.ledger.counter_used == {other: NANO, mine: NANO}  # (nano-units) its own dropped and charged again, once
    (outcome,) = engine.allocate([_claim("c", 11)])  # its other half: 1 left of 2
    assert outcome.status == "allocated", outcome
    assert engine.ledger.counter_used == {other: NANO, mine: 2 * NANO}


def test_verdict_keys_tell_any_classes_and_selectors_apart():
    specs = [
        ("gpus", 1, ('device.driver == "a"', "true")),
        ("gpus", 1, ('device.driver == "a", "true"',)),  # (one expression holding what joins two)
        ("gpus", 1, ('device.driver == "a"', "true", "")),
        ("gpus", 2, ('device.driver == "a"', "true")),
        ('gpus", 1', 1, ('device.driver == "a"', "true")),
        ("gpus", 1, ()),
        ("gpus", 11, ()),
    ]
    keys = [verdict_key(*spec) for spec in specs]
    assert len(set(keys)) == len(specs)
    assert [msgspec.json.decode(k) for k in keys] == [[c, v, list(e)] for c, v, e in specs]


def test_verdict_keys_are_read_as_the_same_object():
    engine = _engine()
    selector = {"cel": {"expression": f'device.attributes["{DRIVER}"].half == 1'}}
    claim = {
        "metadata": {"name": "c", "namespace": "ns", "uid": "uid-c"},
        "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpus", "selectors": [selector]}}]}},
    }
    plan = engine.planner.plan(msgspec.convert(claim, ResourceClaim), engine.inventory.classes, engine.inventory.class_versions)
    (alt,) = plan.requests[0].alts
    assert alt.verdict_key == verdict_key("gpus", engine.inventory.class_versions["gpus"], (selector["cel"]["expression"],))
    assert alt.verdict_key is alt.verdict_key
    assert alt.class_key is alt.class_key
    (outcome,) = engine.allocate([msgspec.convert(claim, ResourceClaim)])
    assert outcome.status == "allocated" and outcome.allocation.devices.results[0].device == "gpu-0-half-1"
