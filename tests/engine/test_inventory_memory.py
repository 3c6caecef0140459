"""The inventory's per-node indexes stay small on a large fleet (#17 frontier scale) and still
answer exactly: a node's mask is kept shifted by its lowest device id, fleet-wide masks only for
the nodes used most recently, and a node's topology is built once per run of its slices."""

from __future__ import annotations

import itertools
import random

import msgspec
import pytest

from dralloc.allocator.engine import Engine, inventory, topology
from dralloc.allocator.engine.inventory import Inventory, iter_bits
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice


def _node(name: str) -> Node:
    return msgspec.convert({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}, Node)


def _slice(name: str, node: str, devices: int, *, driver: str = "gpu.example.com", generation: int = 1) -> ResourceSlice:
    spec = {
        "driver": driver,
        "pool": {"name": node, "generation": generation, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": [{"name": f"dev-{i}", "attributes": {"domain": {"string": f"{node}/nvlink"}}} for i in range(devices)],
    }
    return msgspec.convert({"metadata": {"name": name}, "spec": spec}, ResourceSlice)


def _expected(inv: Inventory, node: str) -> set[int]:
    return {rec.id for rec in inv.devices if rec is not None and rec.local_node == node}


def test_node_masks_are_stored_node_sized_and_answer_exactly_past_the_cache(monkeypatch):
    monkeypatch.setattr(inventory, "NODE_MASKS_KEPT", 3)
    inv = Inventory()
    names = [f"node-{n:02d}" for n in range(12)]
    for name in names:
        inv.apply_node(_node(name))
        inv.apply_slice(_slice(f"{name}-gpus", name, 8))
    for name in names:
        lo, bits = inv.local.span(name)
        assert bits.bit_length() <= 8  # not as wide as the fleet's highest id
        assert {lo + i for i in iter_bits(bits)} == _expected(inv, name)
    for _ in range(2):  # twice: the second pass finds most masks evicted and rebuilds them
        for name in names:
            bits, ids = inv.node_mask(name)
            assert set(iter_bits(bits)) == set(ids) == _expected(inv, name)
    assert len(inv._node_bits) == 3
    # a rebuilt pool gets new ids: the mask follows, cached or not
    inv.apply_slice(_slice("node-03-gpus", "node-03", 5, generation=2))
    bits, ids = inv.node_mask("node-03")
    assert set(iter_bits(bits)) == set(ids) == _expected(inv, "node-03") and len(ids) == 5
    lo, span = inv.local.span("node-03")
    assert span.bit_length() <= 5 and lo == min(ids)


@pytest.mark.interpreted
def test_a_node_publishing_two_slices_gets_its_topology_built_once(monkeypatch):
    built: list[str] = []
    real = topology.build_node

    def counting(node, recs, stamp, pools, shapes=None, last_names=None):  # type: ignore[no-untyped-def]
        built.append(node)
        return real(node, recs, stamp, pools, shapes, last_names)

    monkeypatch.setattr(topology, "build_node", counting)
    engine = Engine()  # scoring on: topologies are built as pools change
    engine.apply(
        msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}, DeviceClass)
    )
    for name in ("node-a", "node-b"):
        engine.apply(_node(name))
        engine.apply(_slice(f"{name}-gpus", name, 4))
        engine.apply(_slice(f"{name}-nics", name, 2, driver="nic.example.com"))
    assert built == ["node-a"]  # built when the slices moved on to node-b; node-b's run may not be over
    topo = engine.placement.topology
    for name in ("node-a", "node-b", "node-a", "node-b"):
        assert topo.node(name).devices == 6  # with the GPUs and the NICs
    assert built == ["node-a", "node-b"]  # once each
    claim = {
        "metadata": {"name": "c", "namespace": "ns"},
        "spec": {"devices": {"requests": [{"name": "g", "exactly": {"deviceClassName": "gpu", "count": 4}}]}},
    }
    (outcome,) = engine.allocate([msgspec.convert(claim, ResourceClaim)])
    assert outcome.status == "allocated" and built == ["node-a", "node-b"]


def test_applied_devices_share_one_empty_list_and_stay_equal_and_encoded_alike():
    slices = [_slice(f"node-{n}-gpus", f"node-{n}", 4) for n in range(3)]
    tainted = msgspec.convert(
        {
            "metadata": {"name": "node-9-gpus"},
            "spec": {
                "driver": "gpu.example.com",
                "pool": {"name": "node-9", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-9",
                "devices": [{"name": "dev-0", "taints": [{"key": "k", "effect": "NoSchedule"}], "bindingConditions": ["ready"]}],
            },
        },
        ResourceSlice,
    )
    before = [msgspec.json.encode(s) for s in (*slices, tainted)]
    copies = [msgspec.json.decode(b, type=ResourceSlice) for b in before]
    inv = Inventory()
    for s in (*slices, tainted):
        inv.apply_slice(s)
    devices = [d for s in slices for d in s.spec.devices]
    assert len({id(d.taints) for d in devices}) == 1 and len({id(d.binding_conditions) for d in devices}) == 1
    assert devices[0].taints is devices[-1].consumes_counters  # one list for every empty field
    assert tainted.spec.devices[0].taints[0].key == "k" and tainted.spec.devices[0].binding_conditions == ["ready"]
    assert tainted.spec.devices[0].taints is not devices[0].taints
    assert [msgspec.json.encode(s) for s in (*slices, tainted)] == before
    assert list((*slices, tainted)) == copies
    assert inventory._EMPTY == []


def test_candidate_order_is_binding_pools_last_then_names():
    inv = Inventory()
    inv.apply_slice(_slice("b-gpus", "node-b", 2))
    inv.apply_slice(_slice("a-gpus", "node-a", 2))
    recs = [rec for rec in inv.devices if rec is not None]
    assert [rec.order for rec in sorted(recs, key=lambda r: r.order)] == [
        (False, "gpu.example.com", "node-a", "a-gpus", "dev-0"),
        (False, "gpu.example.com", "node-a", "a-gpus", "dev-1"),
        (False, "gpu.example.com", "node-b", "b-gpus", "dev-0"),
        (False, "gpu.example.com", "node-b", "b-gpus", "dev-1"),
    ]


def test_node_bits_equal_the_node_mask_without_sorting_ids():
    inv = Inventory()
    names = [f"node-{n:02d}" for n in range(5)]
    for name in names:
        inv.apply_node(_node(name))
        inv.apply_slice(_slice(f"{name}-gpus", name, 3))
    assert [inv.node_bits(n) for n in names] and not inv._node_ids  # bits kept, no ids sorted
    assert [inv.node_bits(n) for n in names] == [inv.node_mask(n)[0] for n in names]
    inv.apply_slice(_slice("node-02-gpus", "node-02", 2, generation=2))  # new ids: not the stale cached bits
    assert inv.node_bits("node-02") == inv.node_mask("node-02")[0] and set(iter_bits(inv.node_bits("node-02"))) == _expected(inv, "node-02")
    shared = msgspec.convert(
        {
            "metadata": {"name": "fabric"},
            "spec": {
                "driver": "net.example.com",
                "pool": {"name": "fabric", "generation": 1, "resourceSliceCount": 1},
                "allNodes": True,
                "devices": [{"name": "link-0"}],
            },
        },
        ResourceSlice,
    )
    inv.apply_slice(shared)  # a device local to no node: every node's mask has it
    for name in names:
        assert inv.node_bits(name) == inv.node_mask(name)[0] != inv.local.get(name)


def _gpu_slice(node: str, uuids: list[str], *, numa: dict | None = None) -> ResourceSlice:
    """A node's GPUs as a decoded slice (every value a fresh object, as off the bus)."""
    devices = [
        {
            "name": f"gpu-{i}",
            "attributes": {
                "productName": {"string": "NVIDIA H100"},
                "uuid": {"string": uuid},
                "numa": numa if numa is not None else {"int": i // 2},
                "driverVersion": {"version": "550.54.15"},
            },
            "capacity": {"memory": {"value": "80Gi"}},
        }
        for i, uuid in enumerate(uuids)
    ]
    spec = {"driver": "gpu.example.com", "pool": {"name": node, "generation": 1, "resourceSliceCount": 1}, "nodeName": node, "devices": devices}
    return msgspec.json.decode(msgspec.json.encode({"metadata": {"name": f"{node}-gpus"}, "spec": spec}), type=ResourceSlice)


def test_namesakes_share_equal_attribute_values_names_and_capacity_maps_and_stay_equal():
    slices = [_gpu_slice(f"node-{n}", [f"GPU-{n}-{i}" for i in range(4)]) for n in range(3)]
    before = [msgspec.json.encode(s) for s in slices]
    inv = Inventory()
    for s in slices:
        inv.apply_slice(s)
    first, *rest = (s.spec.devices for s in slices)
    for devices in rest:
        for mine, theirs in zip(devices, first):
            assert mine.name is theirs.name and mine.capacity is theirs.capacity
            for key in ("productName", "numa", "driverVersion"):
                assert mine.attributes[key] is theirs.attributes[key]
            assert mine.attributes["uuid"] is not theirs.attributes["uuid"]  # unequal values stay apart
    assert first[0].attributes["numa"] is not first[2].attributes["numa"]  # numa 0 and 1
    assert [msgspec.json.encode(s) for s in slices] == before
    recs = {rec.label: rec for rec in inv.devices if rec is not None}
    assert recs["gpu.example.com/node-2/gpu-3"].attribute("gpu.example.com/uuid") == ("string", "GPU-2-3")
    assert recs["gpu.example.com/node-2/gpu-3"].attribute("numa") == ("int", 1)


def test_values_of_different_kinds_are_never_merged():
    inv = Inventory()
    as_int = _gpu_slice("node-a", ["a"], numa={"int": 1})
    as_bool = _gpu_slice("node-b", ["b"], numa={"bool": True})
    two_set = _gpu_slice("node-c", ["c"], numa={"int": 1, "bool": True})  # hostile: two fields
    for s in (as_int, as_bool, two_set):
        inv.apply_slice(s)
    got = [s.spec.devices[0].attributes["numa"] for s in (as_int, as_bool, two_set)]
    assert len({id(a) for a in got}) == 3
    assert (got[0].int, got[0].bool) == (1, None) and (got[1].int, got[1].bool) == (None, True)
    assert (got[2].int, got[2].bool) == (1, True)


def test_a_pools_slice_names_are_kept_compactly_and_exactly_for_few_and_many_slices():
    def part(i: int, count: int) -> ResourceSlice:
        spec = {
            "driver": "gpu.example.com",
            "pool": {"name": "big", "generation": 1, "resourceSliceCount": count},
            "nodeName": "node-a",
            "devices": [{"name": f"dev-{i}"}],
        }
        return msgspec.convert({"metadata": {"name": f"big-{i}"}, "spec": spec}, ResourceSlice)

    inv = Inventory()
    inv.apply_slice(_slice("small", "node-b", 2))
    assert inv._pool_slices[("gpu.example.com", "node-b")] == ("small",)  # a tuple, not a set
    for i in range(12):  # past POOL_NAMES_IN_TUPLE: a set from then on
        if i:  # incomplete until the twelfth
            assert not inv.pools[("gpu.example.com", "big")].usable
        inv.apply_slice(part(i, 12))
    pool = inv.pools[("gpu.example.com", "big")]
    assert pool.usable and len(pool.devices) == 12 and set(inv._pool_slices[("gpu.example.com", "big")]) == {f"big-{i}" for i in range(12)}
    inv.apply_slice(part(3, 12))  # replaced by itself: still one name
    assert len(inv._pool_slices[("gpu.example.com", "big")]) == 12
    for i in range(12):
        inv.remove_slice(f"big-{i}")
        if i < 11:
            assert not inv.pools[("gpu.example.com", "big")].usable
    assert ("gpu.example.com", "big") not in inv._pool_slices and ("gpu.example.com", "big") not in inv.pools
    inv.remove_slice("small")
    assert not inv._pool_slices


@pytest.mark.interpreted
def test_nodes_of_one_profile_share_the_group_names_that_are_alike_and_keep_their_own():
    from dralloc.discovery.fleet import build_fleet, fleet_nodes

    fleet = [{"profile": "h100-sxm", "count": 3, "prefix": "node"}]
    built = []
    for sharing in (True, False):
        engine = Engine()
        for node in fleet_nodes(fleet):
            engine.apply(node)
        for _, slices in build_fleet(fleet):
            for slice_ in slices:
                engine.apply(slice_)
        topo = engine.placement.topology
        if not sharing:
            topo._last_names = None  # type: ignore[assignment]  # each node its own names, to compare with
            topo._nodes.clear()
        built.append([topo.node(name) for name in engine.inventory.nodes()])
    shared, own = built
    assert [t.names for t in shared] == [t.names for t in own]  # the same names either way
    a, b, _ = shared
    alike = [level for level in range(len(topology.GROUP_LEVELS)) if a.names[level] == b.names[level]]
    assert topology.NUMA in alike and topology.GPU not in alike  # NUMA nodes named alike; GPUs by uuid
    assert all(a.names[level] is b.names[level] for level in alike)
    assert all(a.names[level] is not b.names[level] for level in range(len(topology.GROUP_LEVELS)) if level not in alike)


def test_iter_bits_yields_every_set_bit_lowest_first_at_any_width_and_density() -> None:
    """Bitsets of a word, of a node's span (a window read through its bytes), of a fleet (windows
    that grow, runs of zeros jumped), sparse and dense, and a caller that stops early."""
    rng = random.Random(3)
    for width in (1, 8, 61, 62, 63, 64, 200, 256, 257, 700, 5_000, 70_000, 300_000):
        for density in (0.001, 0.05, 0.5, 1.0):
            x = sum(1 << i for i in range(width) if rng.random() < density) | (1 << (width - 1))
            expected = [i for i, c in enumerate(reversed(bin(x)[2:])) if c == "1"]
            assert list(iter_bits(x)) == expected, (width, density)
            assert list(itertools.islice(iter_bits(x), 3)) == expected[:3]
    assert list(iter_bits(0)) == []
