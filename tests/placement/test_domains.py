"""The multi-node domains (NVLink cliques, racks) follow the inventory, and are worked out again only
when what they are made of changes: a Node object, or the clique a node's devices report. A slice
republished or a class published leaves them as they were (working them out is a pass over every
node: ~21 ms at 31,250 nodes, paid by the next claim that asks)."""

from __future__ import annotations

import msgspec
from conftest import NIC_CLASS, claim, make_engine

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.topology import NVLINK_CLIQUE
from dralloc.discovery.fleet import build_fleet
from dralloc.schemas.resource import DeviceAttribute, Node, ObjectMeta, ResourceSlice

RACKS = [("gb200-nvl72", 36)]
"""Two GB200 NVL72 racks: trays 0-17 report one clique, trays 18-35 another."""


def _slices() -> list[ResourceSlice]:
    return [s for _, slices in build_fleet(RACKS) for s in slices]


def _republished(slice_: ResourceSlice, clique: str | None = None) -> ResourceSlice:
    """The slice's next generation: the same devices, or each reporting `clique` as its clique."""
    spec = slice_.spec
    devices = spec.devices
    if clique is not None:
        devices = [
            msgspec.structs.replace(d, attributes={**d.attributes, NVLINK_CLIQUE: DeviceAttribute(string=clique)}) if NVLINK_CLIQUE in d.attributes else d
            for d in devices
        ]
    pool = msgspec.structs.replace(spec.pool, generation=spec.pool.generation + 1)
    return msgspec.structs.replace(slice_, spec=msgspec.structs.replace(spec, pool=pool, devices=devices))


def test_a_slice_republished_or_a_class_published_leaves_the_domains_as_they_were():
    engine = make_engine(RACKS)
    topology = engine.placement.topology
    of, members = topology.domains()
    bits = topology.domain_bits()
    assert len(members) == 2 and len(of) == 36
    version = engine.inventory.version
    engine.apply(_republished(_slices()[0]))
    engine.apply(msgspec.structs.replace(NIC_CLASS, metadata=msgspec.structs.replace(NIC_CLASS.metadata, name="nic-too")))
    assert engine.inventory.version > version
    assert topology.domains() == (of, members)
    assert topology.domains()[1] is members  # not worked out again
    assert topology.domain_bits() is bits


def test_a_tray_whose_devices_report_another_clique_moves_to_its_domain():
    engine = make_engine(RACKS)
    topology = engine.placement.topology
    of, members = topology.domains()
    first, second = members
    moved = next(s for s in _slices() if s.spec.node_name == "gb200-nvl72-0" and any(NVLINK_CLIQUE in d.attributes for d in s.spec.devices))
    engine.apply(_republished(moved, clique=second))
    of, members = topology.domains()
    assert of["gb200-nvl72-0"] == second
    assert members[second][0] == "gb200-nvl72-0" and len(members[second]) == 19  # (in rank order: the first node)
    assert len(members[first]) == 17
    # a claim for a whole domain's worth goes where the domains now say
    assert engine.allocate([claim("gang-like", 4)])[0].status == "allocated"


def test_a_node_label_moves_a_node_to_its_rack_and_back():
    engine = make_engine([("h100-sxm", 3)])
    topology = engine.placement.topology
    assert topology.domains() == ({}, {})
    for i in range(3):
        name = f"h100-sxm-{i}"
        engine.apply(Node(metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, "dralloc.dev/rack": "r0" if i < 2 else "r1"})))
    assert topology.domains()[1] == {"r0": ["h100-sxm-0", "h100-sxm-1"], "r1": ["h100-sxm-2"]}
    engine.apply(Node(metadata=ObjectMeta(name="h100-sxm-1", labels={"kubernetes.io/hostname": "h100-sxm-1", "dralloc.dev/rack": "r1"})))
    assert topology.domains()[1] == {"r0": ["h100-sxm-0"], "r1": ["h100-sxm-1", "h100-sxm-2"]}
    engine.remove("Node", "h100-sxm-0")
    assert topology.domains()[1] == {"r1": ["h100-sxm-1", "h100-sxm-2"]}


def test_a_node_reporting_two_cliques_is_in_the_first_whether_or_not_its_topology_was_built():
    """The domains read a node's clique from its topology when it is built, else from its devices:
    both name the first clique in order, so which one answers does not change the domains. (Scoring
    off: no topology is built before it is asked for.)"""
    answers = []
    for build_first in (False, True):
        engine = Engine(scoring=False)
        for slice_ in _slices():
            if slice_.spec.node_name == "gb200-nvl72-0" and any(NVLINK_CLIQUE in d.attributes for d in slice_.spec.devices):
                devices = list(slice_.spec.devices)
                devices[0] = msgspec.structs.replace(devices[0], attributes={**devices[0].attributes, NVLINK_CLIQUE: DeviceAttribute(string="zz-later")})
                devices[1] = msgspec.structs.replace(devices[1], attributes={**devices[1].attributes, NVLINK_CLIQUE: DeviceAttribute(string="aa-first")})
                slice_ = msgspec.structs.replace(slice_, spec=msgspec.structs.replace(slice_.spec, devices=devices))
            engine.apply(slice_)
        topology = engine.placement.topology
        if build_first:
            assert topology.node("gb200-nvl72-0").clique == "aa-first"
        answers.append(topology.domains()[0]["gb200-nvl72-0"])
    assert answers == ["aa-first", "aa-first"]


def test_the_free_devices_per_domain_stay_exact_across_claims_releases_and_republished_slices():
    """Best fit's free count per domain (`KindIndex.domain_free`) is kept in step as devices are
    taken and freed; with the domains kept across inventory changes it is no longer summed afresh
    after each one, so it must stay exact through them too."""
    engine = make_engine(RACKS)
    placement = engine.placement
    trays = [s for s in _slices() if any(NVLINK_CLIQUE in d.attributes for d in s.spec.devices)]
    engine.apply(_republished(trays[20], clique="another"))  # a tray to a domain of its own
    for i in range(12):  # (the one-GPU claims read the sums: kept from here on)
        assert engine.allocate([claim(f"c{i}", 1 + i % 3)])[0].status == "allocated"
    of, members = placement.topology.domains()
    kept = {kind: placement.kinds.domain_free(kind, of) for kind in placement.kinds.free}
    engine.apply(_republished(trays[0]))  # (a node counted again, holding a claim's devices)
    engine.release("default/c3")
    assert engine.allocate([claim("late", 2)])[0].status == "allocated"
    engine.release("default/c7")
    assert placement.topology.domains() == (of, members)  # the same domains: the sums were kept, not summed again
    assert of["gb200-nvl72-20"] == "another" and len(members) == 3
    for kind, free in placement.kinds.free.items():
        assert placement.kinds.domain_free(kind, of) is kept[kind]
        summed: dict[str, int] = {}
        for node, n in free.items():
            if node in of:
                summed[of[node]] = summed.get(of[node], 0) + n
        assert {d: n for d, n in kept[kind].items() if n} == {d: n for d, n in summed.items() if n}, kind
