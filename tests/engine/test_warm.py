"""Engine.warm: the idle work a first claim of a class would otherwise pay on its way through the fleet."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.engine import Engine, projector, topology, verdicts
from dralloc.allocator.engine.topology import Topology
from dralloc.allocator.engine.verdicts import Verdicts
from dralloc.discovery.fleet import build_fleet, fleet_nodes
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas.resource import ResourceClaim

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"
H100_NODES = 20


FLEET = [{"profile": "h100-sxm", "count": H100_NODES, "prefix": "node"}, {"profile": "h200-sxm-mig", "count": 1, "prefix": "mig"}]


def _fleet() -> Engine:
    """H100 nodes (8 GPUs and 8 NICs each) first, then one MIG node: the MIG class's first claim
    walks every H100 node before it finds a device of its class."""
    engine = Engine()
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        engine.apply(event.device_class)
    for _, slices in build_fleet(FLEET):
        for slice_ in slices:
            engine.apply(slice_)
    return engine


def _claim(name: str, device_class: str, count: int) -> ResourceClaim:
    request = {"name": device_class.split(".")[0], "exactly": {"deviceClassName": device_class, "count": count}}
    return msgspec.convert({"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": {"devices": {"requests": [request]}}}, ResourceClaim)


def _mig_claim(name: str) -> ResourceClaim:
    return _claim(name, "mig.nvidia.com", 1)


def _counted(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many devices `projector.representable` is asked of from now on."""
    calls = [0]
    real = projector.representable

    def counting(driver: str, device: object) -> bool:
        calls[0] += 1
        return real(driver, device)  # type: ignore[arg-type]

    monkeypatch.setattr(projector, "representable", counting)
    return calls


def _devices(engine: Engine) -> int:
    return sum(rec is not None for rec in engine.inventory.devices)


@pytest.mark.interpreted  # (counts calls by replacing projector.representable, which the compiled inventory does not look up)
def test_each_device_is_checked_once_as_its_slice_arrives_and_no_claim_checks_one(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whether Kubernetes can represent a device (what a shared verdict needs of every device it
    reads) is worked out as the device arrives: the first claims of a fleet, walking it, checked
    every device they passed (13% of churn-mixed's fill)."""
    calls = _counted(monkeypatch)
    engine = _fleet()
    assert calls[0] == _devices(engine) > H100_NODES * 16  # each device once
    outcomes = [engine.allocate([_mig_claim(f"m{i}")])[0] for i in range(3)]
    assert [o.status for o in outcomes] == ["allocated"] * 3
    assert calls[0] == _devices(engine)  # the walk past every H100 node checked none
    while engine.warm(1.0):  # (nor does the idle work)
        pass
    assert calls[0] == _devices(engine)


@pytest.mark.interpreted  # (counts calls by replacing projector.representable, which the compiled inventory does not look up)
def test_a_pool_rebuilt_checks_only_the_devices_it_did_not_have(monkeypatch: pytest.MonkeyPatch) -> None:
    """A pool of several slices is rebuilt whole when one of them changes: the devices of the others
    (the same objects) keep their answer; the changed slice's devices are new objects, checked."""
    engine = _fleet()
    pool = [s for s in engine.inventory.slices.values() if s.spec.pool.name == "mig-0" and s.spec.devices]
    assert len(pool) > 1
    calls = _counted(monkeypatch)
    again = msgspec.convert(msgspec.to_builtins(pool[1]), type(pool[1]))  # (as it comes off the bus: new objects)
    assert engine.apply(again) == []
    assert calls[0] == len(again.spec.devices) > 0
    held = sum(len(s.spec.devices) for s in pool)
    assert sum(rec is not None and rec.pool == "mig-0" for rec in engine.inventory.devices) == held  # the whole pool rebuilt


def test_warm_goes_in_hops_and_again_after_an_inventory_change() -> None:
    engine = _fleet()
    hops = 1
    while engine.warm(0.0):  # one step of devices a hop: the fleet has several
        hops += 1
    assert hops > 1
    assert not engine.warm(1.0)
    (_, slices), *_ = build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": "late"}])
    engine.apply(slices[0])  # new devices: new work
    assert engine.warm(0.0)
    while engine.warm(1.0):
        pass
    assert not engine.warm(1.0)


@pytest.mark.interpreted
def test_after_warm_a_claim_reads_the_multi_node_domains_warm_built(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fleet's domains are worked out again after a node's devices or Node object changed;
    warm does it, so a claim's walk does not (it asks each such node's clique when it does: every
    node after a fleet's load, ~21 ms at 31,250 nodes)."""
    cold, warm = _fleet(), _fleet()
    while warm.warm(1.0):
        pass
    asked: list[str] = []
    real = Topology._clique

    def counting(self: Topology, node: str) -> str | None:
        asked.append(node)
        return real(self, node)

    monkeypatch.setattr(Topology, "_clique", counting)
    assert warm.allocate([_mig_claim("m0")])[0].status == "allocated"
    assert asked == []
    assert cold.allocate([_mig_claim("m0")])[0].status == "allocated"
    assert len(asked) == H100_NODES + 1  # the rebuild a cold walk pays: every node's clique


@pytest.mark.interpreted
def test_after_warm_a_claim_builds_no_node_topology_though_the_nodes_came_after_their_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """A Node object arriving after its node's slices (its labels are news) leaves the node's
    topology stale with no pool rebuild to build it again; warm builds it, so no claim's walk does."""
    cold, warm = _fleet(), _fleet()
    for engine in (cold, warm):
        for node in fleet_nodes(FLEET):
            engine.apply(node)
    hops = 1
    while warm.placement.topology.warm(0.0):  # a few nodes a hop: a claim waits for one at most
        hops += 1
    assert hops > 1
    while warm.warm(1.0):
        pass
    built: list[str] = []
    real = topology.build_node

    def counting(node: str, *args: object) -> object:
        built.append(node)
        return real(node, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(topology, "build_node", counting)
    claims = [_claim("g0", "gpu.nvidia.com", 2), _mig_claim("m0"), _claim("g1", "gpu.nvidia.com", 2)]
    warmed = [warm.allocate([c])[0] for c in claims]
    assert built == []
    unwarmed = [cold.allocate([c])[0] for c in claims]
    assert len(built) >= H100_NODES  # the MIG claim's walk passes every H100 node
    assert [o.status for o in warmed] == ["allocated"] * 3
    assert [msgspec.to_builtins(o) for o in warmed] == [msgspec.to_builtins(o) for o in unwarmed]


def _selected_mig_claim(name: str) -> ResourceClaim:
    """A MIG claim with a selector of its own: a verdict no claim has walked the fleet for yet."""
    request = {
        "name": "mig",
        "exactly": {
            "deviceClassName": "mig.nvidia.com",
            "count": 1,
            "selectors": [{"cel": {"expression": 'device.attributes["gpu.nvidia.com"].profile == "1g.18gb"'}}],
        },
    }
    return msgspec.convert({"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": {"devices": {"requests": [request]}}}, ResourceClaim)


def _walked(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many nodes walks ask `Verdicts.outcomes` about from now on."""
    nodes = [0]
    real = Verdicts.outcomes

    def counting(self: Verdicts, alt: object, batch: list[tuple[int, int]]) -> object:
        nodes[0] += len(batch)
        return real(self, alt, batch)  # type: ignore[arg-type]

    monkeypatch.setattr(Verdicts, "outcomes", counting)
    return nodes


@pytest.mark.interpreted
def test_after_warm_a_new_selector_of_a_class_walks_only_the_nodes_its_class_reaches(monkeypatch: pytest.MonkeyPatch) -> None:
    cold, warm = _fleet(), _fleet()
    warm.allocate([_mig_claim("m0")])  # (the class's own claim walked the fleet: a new selector's has not)
    cold.allocate([_mig_claim("m0")])
    monkeypatch.setattr(verdicts, "WARM_STEP", 8)
    hops = 1
    while warm.warm(0.0):  # in hops of one step of 8 devices: each reach is worked out across several
        hops += 1
    assert hops > 20
    walked = _walked(monkeypatch)
    warmed = [warm.allocate([_selected_mig_claim(f"s{i}")])[0] for i in range(3)]
    assert walked[0] <= 1  # the MIG node alone: no H100 node has a device of the class
    unwarmed = [cold.allocate([_selected_mig_claim(f"s{i}")])[0] for i in range(3)]
    assert walked[0] >= H100_NODES
    assert [o.status for o in warmed] == ["allocated"] * 3
    assert [msgspec.to_builtins(o) for o in warmed] == [msgspec.to_builtins(o) for o in unwarmed]


def test_a_class_reach_is_not_used_once_the_inventory_changed() -> None:
    engine = Engine()
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        engine.apply(event.device_class)
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 3, "prefix": "node"}]):
        for slice_ in slices:
            engine.apply(slice_)
    while engine.warm(1.0):
        pass  # the MIG class reaches no node yet
    for _, slices in build_fleet([{"profile": "h200-sxm-mig", "count": 1, "prefix": "mig"}]):
        for slice_ in slices:
            engine.apply(slice_)
    (before,) = engine.allocate([_selected_mig_claim("s0")])  # not warmed since: every node may host it
    while engine.warm(1.0):
        pass
    (after,) = engine.allocate([_selected_mig_claim("s1")])
    assert (before.status, before.node, after.status, after.node) == ("allocated", "mig-0", "allocated", "mig-0")


class _Watched(list):
    """`Inventory.devices`, noting each device below `old` looked up by id."""

    def __init__(self, devices: list, old: int) -> None:
        super().__init__(devices)
        self.old = old
        self.read: list[int] = []

    def __getitem__(self, i):  # type: ignore[no-untyped-def]
        if isinstance(i, int) and i < self.old:
            self.read.append(i)
        return super().__getitem__(i)


@pytest.mark.interpreted
def test_warm_after_a_slice_arrives_reads_the_new_devices_alone() -> None:
    """A fleet arrives slice by slice, with a warm round between slices: a round that walked
    every device again (each class's reach) cost a pass over the fleet per slice."""
    engine = _fleet()
    while engine.warm(1.0):
        pass
    inv = engine.inventory
    before = dict(engine.verdicts._reach)
    watched = inv.devices = _Watched(inv.devices, len(inv.devices))
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 2, "prefix": "late"}]):
        for slice_ in slices:
            engine.apply(slice_)
            while engine.warm(1.0):
                pass
    assert watched.read == []  # no device there before was looked at again
    late = {inv.node_rank["late-0"], inv.node_rank["late-1"]}
    gpu = next(reach for key, reach in engine.verdicts._reach.items() if msgspec.json.decode(key)[0] == "gpu.nvidia.com")
    assert gpu.version == inv.version and {r for r in range(len(inv.node_names)) if gpu.ranks >> r & 1} >= late
    assert set(engine.verdicts._reach) == set(before)


def _reach_nodes(engine: Engine, device_class: str) -> set[str]:
    """The nodes `warm` found `device_class` to reach, for the inventory as it is now."""
    (reach,) = [reach for key, reach in engine.verdicts._reach.items() if msgspec.json.decode(key)[0] == device_class]
    assert reach.version == engine.inventory.version  # worked out for this inventory
    return {name for rank, name in enumerate(engine.inventory.node_names) if reach.ranks >> rank & 1}


def test_a_class_reach_after_most_of_its_devices_are_removed_is_exact_again() -> None:
    engine = Engine()
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        engine.apply(event.device_class)
    fleet = build_fleet([{"profile": "h100-sxm", "count": 4, "prefix": "node"}, {"profile": "h200-sxm-mig", "count": 1, "prefix": "mig"}])
    for _, slices in fleet:
        for slice_ in slices:
            engine.apply(slice_)
    while engine.warm(1.0):
        pass
    everyone = {"node-0", "node-1", "node-2", "node-3", "mig-0"}
    assert _reach_nodes(engine, "gpu.nvidia.com") == everyone
    assert _reach_nodes(engine, "mig.nvidia.com") == {"mig-0"}
    names = {node: [s.metadata.name for s in slices] for node, slices in ((s[0].spec.node_name, s) for _, s in fleet)}
    for name in names["node-0"]:
        engine.remove("ResourceSlice", name)
    while engine.warm(1.0):
        pass
    # a node's GPUs gone: its rank may stay (a walk may try it for nothing), no other goes
    assert _reach_nodes(engine, "gpu.nvidia.com") >= everyone - {"node-0"}
    for name in names["mig-0"] + names["node-1"] + names["node-2"]:
        engine.remove("ResourceSlice", name)
    while engine.warm(1.0):
        pass
    assert _reach_nodes(engine, "gpu.nvidia.com") == {"node-3"}  # most of those walked are gone: walked again
    assert _reach_nodes(engine, "mig.nvidia.com") == set()
    claim = _claim("g0", "gpu.nvidia.com", 8)
    (outcome,) = engine.allocate([claim])
    assert (outcome.status, outcome.node) == ("allocated", "node-3")


@pytest.mark.interpreted
def test_warm_after_a_node_object_arrives_looks_at_that_node_alone(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _fleet()
    while engine.warm(1.0):
        pass
    looked: list[str | None] = []
    real = Topology.node

    def counting(self: Topology, node: str | None) -> object:
        looked.append(node)
        return real(self, node)

    monkeypatch.setattr(Topology, "node", counting)
    (node,) = [n for n in fleet_nodes(FLEET) if n.metadata.name == "node-3"]
    engine.apply(node)  # its labels are news: its topology is stale
    while engine.warm(1.0):
        pass
    assert looked == ["node-3"]  # (a pass over every node per change was half of a round's work while a fleet arrived)
    assert engine.placement.topology.node("node-3").stamp == (engine.inventory._local_version["node-3"],)  # built
