"""The load path (#17 item 4: cold start at 250,000 GPUs) does per pool what it did per device:
the inventory indexes a pool's devices at once (`Inventory._index`), the ledger changes each
node's free count once by a pool's net change (`Ledger._pool_rebuilt`), capacities are parsed
once per shared capacity map (`CapacityMaps`) and topology reads attribute values directly
(`attribute_value`); placement's kind index adds a new pool's devices to its nodes' counts
(`KindIndex._added`); a pool arriving as several slices has each slice read once to validate it
(`SliceCheck`), not at each slice it grows by. Whatever order slices come, go and are replaced in, with claims holding
devices, the engine must be left as a fresh load of the final slices with the same claims."""

from __future__ import annotations

import random

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.inventory import CapacityMaps, _validate_pool, attribute_value, iter_bits, lookup_attribute
from dralloc.allocator.engine.topology import NodeTopology
from dralloc.schemas.resource import Device, DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"
NODES = ["node-a", "node-b", "node-c", "node-d"]


def _class() -> DeviceClass:
    return msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass)


def _node(name: str) -> Node:
    return msgspec.convert({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}, Node)


def _slice(node: str, names: list[str], generation: int, *, multi: int = -1, pool: str = "gpus") -> ResourceSlice:
    """The node's GPUs `names` in its pool `pool` (NVLink pairs by position; `multi`: that position
    allows multiple allocations). A node has two pools, both of GPUs: each counts in the other's kind."""
    devices = [
        {
            "name": name,
            "attributes": {
                "type": {"string": "gpu"},
                "dralloc.dev/nvlinkDomain": {"string": f"{node}/{pool}/{i // 2}"},
                "uuid": {"string": f"{node}-{pool}-{name}"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
            **({"allowMultipleAllocations": True} if i == multi else {}),
        }
        for i, name in enumerate(names)
    ]
    spec = {"driver": DRIVER, "pool": {"name": f"{node}-{pool}", "generation": generation, "resourceSliceCount": 1}, "nodeName": node, "devices": devices}
    return msgspec.json.decode(msgspec.json.encode({"metadata": {"name": f"{node}-{pool}"}, "spec": spec}), type=ResourceSlice)


def _claim(name: str, count: int) -> ResourceClaim:
    devices = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": devices}}, ResourceClaim)


def _labels(engine: Engine, bits: int) -> list[str]:
    return sorted(engine.inventory.devices[i].label for i in iter_bits(bits))  # type: ignore[union-attr]


def _state(engine: Engine) -> dict:
    """Everything the load path derives, by device label and node name (ids differ between engines),
    and each node-rank bitset as the nodes whose counts reach each k."""
    inv, ledger, kinds, topo = engine.inventory, engine.ledger, engine.placement.kinds, engine.placement.topology
    nodes = inv.nodes()
    rank = inv.node_rank

    def at_least(ge: list[int]) -> dict[str, int]:  # node -> the highest k whose bitset holds it
        return {n: max((k for k, b in enumerate(ge) if k and (b >> rank[n]) & 1), default=0) for n in nodes}

    return {
        "devices": sorted(rec.label for rec in inv.by_key.values()),
        "live": _labels(engine, inv.live),
        "multi": _labels(engine, inv.multi_bits),
        "local": {n: _labels(engine, inv.local.get(n)) for n in nodes},
        "used": _labels(engine, ledger.used_bits),
        "used_ids": sorted(inv.devices[i].label for i in ledger.used_ids),  # type: ignore[union-attr]
        "free": {n: ledger.free_local.get(n, 0) for n in nodes},
        "free_ge": at_least(ledger.free_ge),
        "kind_free": {k: {n: v for n, v in d.items() if v} for k, d in kinds.free.items()},
        "kind_ge": {k: at_least(ge) for k, ge in kinds.ge.items()},
        "whole": {k: sorted(n for n in nodes if (b >> rank[n]) & 1) for k, b in kinds.whole.items()},
        "held": {inv.devices[i].label: holder for i, holder in kinds.held.items()},  # type: ignore[union-attr]
        "topology": {n: _groups(engine, t) for n in nodes if (t := topo.node(n)) is not None},
    }


def _groups(engine: Engine, topo: NodeTopology) -> list[list[tuple[tuple[str, ...], str | None]]]:
    """Per level, the node's groups as device labels with the group's name (group indexes follow
    device order, which differs between loads)."""
    levels = []
    for pos, names in enumerate(topo.names):
        members: dict[int, list[str]] = {}
        for i, groups in topo.groups.items():
            members.setdefault(groups[pos], []).append(engine.inventory.devices[i].label)  # type: ignore[union-attr]
        levels.append(sorted((tuple(sorted(labels)), names.get(g)) for g, labels in members.items()))
    return levels


def _kinds_counted(engine: Engine) -> dict:
    """(kind, node) -> (free, total) of the node's exclusive devices of the kind, counted device by device."""
    inv, used = engine.inventory, engine.ledger.used_ids
    out: dict[tuple, tuple[int, int]] = {}
    for node in inv.nodes():
        for i in inv.local.ids(node):
            rec = inv.devices[i]
            if rec is not None and not rec.multi:
                free, total = out.get((rec.kind, node), (0, 0))
                out[(rec.kind, node)] = (free + (i not in used), total + 1)
    return out


def _kinds_kept(engine: Engine) -> dict:
    """The same as placement's kind index keeps it."""
    kinds = engine.placement.kinds
    return {(kind, node): (kinds.free[kind].get(node, 0), total) for kind, totals in kinds.total.items() for node, total in totals.items() if total}


def test_slices_replaced_and_removed_with_claims_held_leave_what_a_fresh_load_would():
    rng = random.Random(5)
    engine = Engine()
    engine.apply(_class())
    for node in NODES:
        engine.apply(_node(node))
    generation = 0
    current: dict[tuple[str, str], tuple[list[str], int]] = {}  # (node, pool) -> the pool's device names, the multi-allocatable position
    running: list[str] = []
    for step in range(60):
        pool = (rng.choice(NODES), rng.choice(["gpus", "more"]))
        if pool in current and rng.random() < 0.15:
            engine.remove("ResourceSlice", f"{pool[0]}-{pool[1]}")
            del current[pool]
        else:  # a new or replaced pool: some devices kept by name (held ones among them), some gone, some new
            generation += 1
            current[pool] = (sorted(rng.sample([f"dev-{i}" for i in range(10)], rng.randint(2, 8))), rng.choice([-1, 0, 3]))
            assert engine.apply(_slice(pool[0], current[pool][0], generation, multi=current[pool][1], pool=pool[1])) == []
        for i in range(rng.randint(0, 3)):
            if running and rng.random() < 0.3:
                engine.release(running.pop(rng.randrange(len(running))))
            (outcome,) = engine.allocate([_claim(f"c{step}-{i}", rng.choice([1, 1, 2, 3]))])
            if outcome.status == "allocated":
                running.append(outcome.claim)
        fresh = Engine()
        fresh.apply(_class())
        for name in NODES:
            fresh.apply(_node(name))
        for (name, pool_name), (names, multi) in current.items():
            assert fresh.apply(_slice(name, names, 1, multi=multi, pool=pool_name)) == []
        for key in running:
            record = engine.ledger.claims[key]
            held = msgspec.convert(
                {
                    "metadata": {"name": key.split("/")[1], "namespace": "ns"},
                    "spec": {"devices": {}},
                    "status": {"allocation": msgspec.to_builtins(record.allocation)},
                },
                ResourceClaim,
            )
            assert fresh.restore(held) == []
        assert _state(engine) == _state(fresh), f"step {step}"
        assert _kinds_counted(engine) == _kinds_kept(engine), f"step {step}"
    assert len(running) > 3


def test_capacity_maps_answer_as_a_parse_of_each_map_per_driver():
    maps = CapacityMaps()
    shared = {"memory": {"value": "80Gi"}, f"{DRIVER}/memory": {"value": "40Gi"}, "cores": {"value": "2"}}
    device = msgspec.convert({"name": "gpu-0", "capacity": shared}, Device)
    namesake = msgspec.convert({"name": "gpu-0", "capacity": {"memory": {"value": "1Gi"}}}, Device)
    for _ in range(2):  # the second time from what it remembers
        assert maps.of(DRIVER, device) == CapacityMaps().of(DRIVER, device)  # (a new one parses)
        assert maps.of(DRIVER, device)[f"{DRIVER}/memory"].value == 40 * 2**30 * 10**9  # the driver's own domain wins
        assert maps.of("other.example.com", device) == CapacityMaps().of("other.example.com", device)  # the same map, another driver
        assert maps.of("other.example.com", device)["other.example.com/memory"].value == 80 * 2**30 * 10**9
        assert maps.of(DRIVER, namesake)[f"{DRIVER}/memory"].value == 2**30 * 10**9  # a name is not a map
    assert maps.of(DRIVER, msgspec.convert({"name": "nic"}, Device)) == {}


def test_attribute_value_is_lookup_attributes_value_for_every_kind_and_name():
    attributes = {
        "text": {"string": "a"},
        "empty": {"string": ""},
        "number": {"int": 0},
        "flag": {"bool": False},
        "release": {"version": "1.2.3"},
        "many": {"strings": ["x", "y"]},
        "numbers": {"ints": [1, 2]},
        f"{DRIVER}/qualified": {"int": 7},
        "other.example.com/theirs": {"string": "t"},
        "two": {"int": 1, "string": "s"},  # hostile: two kinds set
    }
    device = msgspec.convert({"name": "gpu-0", "attributes": attributes}, Device)
    engine = Engine()
    engine.apply(
        msgspec.convert(
            {
                "metadata": {"name": "s"},
                "spec": {
                    "driver": DRIVER,
                    "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                    "nodeName": "n",
                    "devices": [msgspec.to_builtins(device)],
                },
            },
            ResourceSlice,
        )
    )
    rec = next(iter(engine.inventory.by_key.values()))
    names = [*attributes, f"{DRIVER}/text", f"{DRIVER}/flag", "qualified", "theirs", "other.example.com/text", "missing", f"{DRIVER}/missing", "no-domain/"]
    for name in names:
        found = lookup_attribute(rec, name)
        assert attribute_value(rec, name) == (found[1] if found is not None else None), name
        assert type(attribute_value(rec, name)) is type(found[1] if found is not None else None), name


def _mig_slices(pool: str, count: int, faults: dict[int, dict]) -> list[ResourceSlice]:
    """A MIG pool as `count` slices: slice 0 holds the counter set of the pool's GPU, the others one
    partition each consuming from it. `faults[i]` is merged into slice i's spec (hostile variants)."""
    slices = []
    for i in range(count):
        spec: dict = {"driver": DRIVER, "pool": {"name": pool, "generation": 1, "resourceSliceCount": count}, "nodeName": "node-a"}
        if i == 0:
            spec["sharedCounters"] = [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "7"}}}]
            spec["devices"] = [
                {
                    "name": "gpu-0",
                    "capacity": {"memory": {"value": "80Gi"}},
                    "consumesCounters": [{"counterSet": "gpu-0", "counters": {"slices": {"value": "7"}}}],
                }
            ]
        else:
            consumes = [{"counterSet": "gpu-0", "counters": {"memory": {"value": "10Gi"}, "slices": {"value": "1"}}}]
            spec["devices"] = [{"name": f"mig-{i}", "capacity": {"memory": {"value": "10Gi"}}, "consumesCounters": consumes}]
        spec.update(faults.get(i, {}))
        raw = {"metadata": {"name": f"{pool}-{i}"}, "spec": spec}
        slices.append(msgspec.json.decode(msgspec.json.encode(raw), type=ResourceSlice))
    return slices


class _CountingMaps(CapacityMaps):
    """CapacityMaps counting the devices it is asked about, by name."""

    __slots__ = ("asked",)

    def __init__(self) -> None:
        super().__init__()
        self.asked: dict[str, int] = {}

    def of(self, driver: str, device: Device) -> dict:
        self.asked[device.name] = self.asked.get(device.name, 0) + 1
        return super().of(driver, device)


@pytest.mark.interpreted
def test_a_pool_of_several_slices_reads_each_slice_once_to_validate_it():
    engine = Engine()
    maps = engine.inventory.capacity_maps = _CountingMaps()
    for slice_ in _mig_slices("node-a-gpu-0", 5, {}):
        assert engine.apply(slice_) == []
    # each device once validating its slice, once building the pool (before: the first slice's
    # device 6 times, once at each of the 5 slices the pool grew by, and once built)
    assert maps.asked == {"gpu-0": 2, "mig-1": 2, "mig-2": 2, "mig-3": 2, "mig-4": 2}
    assert len(engine.inventory.pools[(DRIVER, "node-a-gpu-0")].devices) == 5
    assert engine.inventory._slice_checks == {}  # nothing kept of a pool complete


def test_a_pool_of_several_slices_is_refused_as_one_walk_of_all_of_them_would():
    wrong_quantity = {"devices": [{"name": "mig-2", "consumesCounters": [{"counterSet": "gpu-0", "counters": {"slices": {"value": "1x"}}}]}]}
    faults: list[dict[int, dict]] = [
        {3: {"devices": [{"name": "mig-1"}]}},  # a device name another slice has
        {2: {"devices": [{"name": "mig-2", "consumesCounters": [{"counterSet": "gpu-9", "counters": {}}]}]}},
        {4: {"devices": [{"name": "mig-4", "consumesCounters": [{"counterSet": "gpu-0", "counters": {"power": {"value": "1"}}}]}]}},
        {1: {"sharedCounters": [{"name": "gpu-0", "counters": {}}]}},  # a counter set's name twice
        {2: wrong_quantity},
        {1: {"devices": [{"name": "mig-1", "capacity": {"memory": {"value": "ten"}}}]}},
        {0: {"sharedCounters": [{"name": "gpu-0", "counters": {"memory": {"value": "80Gi"}, "slices": {"value": "-"}}}]}},
        {1: {"devices": [{"name": "mig-1"}, {"name": "mig-1"}]}, 3: {"devices": [{"name": "gpu-0"}]}},
    ]
    for fault in faults:
        engine = Engine()
        slices = _mig_slices("node-a-gpu-0", 5, fault)
        for count, slice_ in enumerate(slices, 1):
            problems = engine.apply(slice_)
            pool = engine.inventory.pools[(DRIVER, "node-a-gpu-0")]
            expected = _validate_pool(pool, CapacityMaps())  # the whole walk of the slices so far
            assert pool.invalid == expected, (fault, count)
            assert problems == ([f"pool {DRIVER}/node-a-gpu-0 is invalid and is not used: {expected}"] if expected else [])
        assert pool.invalid is not None and not pool.devices, fault
    # the valid pool, its slices in any order (the partitions before their counter set are refused
    # until it comes), one replaced, one removed and given back: as the whole walk says, valid at the end
    engine = Engine()
    order = random.Random(7).sample(_mig_slices("node-a-gpu-0", 5, {}), 5) + _mig_slices("node-a-gpu-0", 5, {2: wrong_quantity})[2:3]
    for slice_ in order + _mig_slices("node-a-gpu-0", 5, {})[2:3]:
        engine.apply(slice_)
        pool = engine.inventory.pools[(DRIVER, "node-a-gpu-0")]
        assert pool.invalid == _validate_pool(pool, CapacityMaps())
    engine.remove("ResourceSlice", "node-a-gpu-0-0")
    pool = engine.inventory.pools[(DRIVER, "node-a-gpu-0")]
    assert not pool.complete and not pool.devices and pool.invalid is not None  # (consumed from a set gone)
    assert engine.apply(_mig_slices("node-a-gpu-0", 5, {})[0]) == []
    assert len(engine.inventory.pools[(DRIVER, "node-a-gpu-0")].devices) == 5
