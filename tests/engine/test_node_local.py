"""Placement's per-node indexes (#17 item 4, the frontier fleet): a node's verdict bits, its used
devices and the free devices per multi-node domain are kept per node instead of cut out of
fleet-wide bitsets per claim. They must always equal what the fleet-wide bitsets say, through
allocations, releases and a pool replaced under running claims; and the nodes the walk leaves
out as certain misfits must be nodes where the claim fails, never one where it fits."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.inventory import device_kind
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

NODES = [f"node-{i}" for i in range(6)]


def _node(name: str, rack: str | None = None) -> Node:
    labels = {"kubernetes.io/hostname": name} | ({"dralloc.dev/rack": rack} if rack else {})
    return msgspec.convert({"metadata": {"name": name, "labels": labels}}, Node)


def _class() -> DeviceClass:
    return msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}, DeviceClass)


def _slice(node: str, gpus: int, *, generation: int = 1, model: str = "a") -> ResourceSlice:
    devices = [{"name": f"gpu-{i}", "attributes": {"type": {"string": "gpu"}, "model": {"string": model}}} for i in range(gpus)]
    spec = {"driver": "gpu.example.com", "pool": {"name": node, "generation": generation, "resourceSliceCount": 1}, "nodeName": node, "devices": devices}
    return msgspec.convert({"metadata": {"name": f"{node}-gpus"}, "spec": spec}, ResourceSlice)


def _claim(name: str, count: int = 1, model: str | None = None) -> ResourceClaim:
    exactly: dict = {"deviceClassName": "gpu", "count": count}
    if model is not None:
        exactly["selectors"] = [{"cel": {"expression": f'device.attributes["gpu.example.com"].model == "{model}"'}}]
    return msgspec.convert(
        {"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}},
        ResourceClaim,
    )


def _fleet() -> Engine:
    """Six nodes of four GPUs (model "a" on even nodes, "b" on odd ones), two racks of two nodes
    (multi-node domains) and two nodes in none."""
    engine = Engine()
    racks = {"node-0": "r1", "node-1": "r1", "node-2": "r2", "node-3": "r2"}
    for name in NODES:
        engine.apply(_node(name, racks.get(name)))
    engine.apply(_class())
    for i, name in enumerate(NODES):
        engine.apply(_slice(name, 4, model="ab"[i % 2]))
    return engine


def _assert_local_indexes_agree(engine: Engine) -> None:
    inv, placement = engine.inventory, engine.placement
    for name in NODES:
        topo = placement.topology.node(name)
        assert topo is not None
        mask, _ = inv.node_mask(name)
        used = ((engine.ledger.used_bits & mask) >> topo.lo) & topo.span
        assert placement.kinds.used_on(name, topo.lo) & topo.span == used, name
        for key, (matched, failed) in topo.verdicts.items():
            verdict = engine.verdicts._cache[key]
            assert matched == ((verdict.matched & mask) >> topo.lo) & topo.span, (name, key)
            assert failed == ((verdict.failed & mask) >> topo.lo) & topo.span, (name, key)
    of, members = placement.topology.domains()
    kind = device_kind("gpu.example.com", "gpu")
    if kind in placement.kinds.free and of:
        sums = placement.kinds.domain_free(kind, of)
        for domain, nodes in members.items():
            assert sums.get(domain, 0) == sum(placement.kinds.free[kind].get(n, 0) for n in nodes), domain


def test_node_local_indexes_equal_the_fleet_wide_bitsets_through_allocation_release_and_a_pool_rebuild():
    engine = _fleet()
    held = []
    for i, (count, model) in enumerate([(1, "a"), (2, None), (3, "b"), (1, None), (2, "a"), (4, None), (1, "b")]):
        (outcome,) = engine.allocate([_claim(f"c{i}", count, model)])
        assert outcome.status == "allocated"
        held.append(outcome)
        _assert_local_indexes_agree(engine)
    assert engine.release(held[1].claim) and engine.release(held[4].claim)
    _assert_local_indexes_agree(engine)
    # a pool replaced under running claims: new device ids, the node's topology rebuilt, and
    # the ledger re-reads what it holds there
    node = held[0].node
    assert node is not None
    engine.apply(_slice(node, 4, generation=2, model="a" if int(node[-1]) % 2 == 0 else "b"))
    _assert_local_indexes_agree(engine)
    (after,) = engine.allocate([_claim("after", 1)])
    assert after.status == "allocated"
    _assert_local_indexes_agree(engine)


def test_a_node_left_out_as_a_certain_misfit_is_one_where_the_claim_fails():
    engine = _fleet()
    # model "a" (nodes 0, 2, 4): node-0 full, node-2 with one GPU free, node-4 all free
    for name, count in (("node-0", 4), ("node-2", 3)):
        (outcome,) = engine.allocate([_claim(f"fill-{name}", count, "a")], node=name)
        assert outcome.status == "allocated"
    plans = [engine._plan(_claim("probe", 2, "a"))]
    walked = list(engine.placement.order_nodes(plans, -1))
    kept = list(engine.placement.order_nodes(plans, -1, skip_short=True))
    inv, alt = engine.inventory, plans[0].requests[0].alts[0]

    def free_matching(name: str) -> int:  # from the fleet-wide bitsets, not placement's indexes
        mask, _ = inv.node_mask(name)
        return (engine.verdicts.get(alt, mask).matched & mask & ~engine.ledger.used_bits).bit_count()

    short = [n for n in walked if free_matching(n) < 2]
    assert sorted(short) == ["node-0", "node-1", "node-2", "node-3", "node-5"]
    # the nodes that cannot serve it are left out but the first, yielded last; the order of
    # the rest (where the claim could go) is the walk's own
    assert kept == ["node-4", short[0]]
    ranks = engine.misfits.known(plans)
    assert {inv.node_names[r] for r in range(len(NODES)) if ranks >> r & 1} == set(short)
    (placed,) = engine.allocate([_claim("two-a", 2, "a")])
    assert placed.status == "allocated" and placed.node == "node-4"
    (rest,) = engine.allocate([_claim("rest-a", 2, "a")])
    assert rest.status == "allocated" and rest.node == "node-4"
    # now it fits nowhere: refused, with a reason naming a node, as with every node tried
    (refused,) = engine.allocate([_claim("more-a", 2, "a")])
    assert refused.status == "unsatisfiable" and "on node node-" in refused.message
    (explained,) = engine.allocate([_claim("more-a-explained", 2, "a")], explain=True)
    assert explained.status == "unsatisfiable" and explained.explanation is not None
    # a release makes a left-out node fit again: it is no longer left out
    assert engine.release("ns/fill-node-2")
    (fits,) = engine.allocate([_claim("fits", 2, "a")])
    assert fits.status == "allocated" and fits.node == "node-2"


@pytest.mark.interpreted
def test_left_out_nodes_never_change_where_claims_go(monkeypatch: pytest.MonkeyPatch):
    # the same claims with and without the walk leaving certain misfits out: the same devices
    claims = [(3, "a"), (2, "b"), (2, "a"), (4, None), (1, "a"), (2, "a"), (3, "b"), (1, None), (2, None), (4, "b"), (1, "b")]
    results = []
    for skip in (True, False):
        engine = _fleet()
        if not skip:
            walk = engine.placement.order_nodes
            monkeypatch.setattr(engine.placement, "order_nodes", lambda plans, viable, skip_short=False, walk=walk: walk(plans, viable))
        out = []
        for i, (count, model) in enumerate(claims):
            (outcome,) = engine.allocate([_claim(f"c{i}", count, model)])
            devices = [(r.pool, r.device) for r in outcome.allocation.devices.results] if outcome.allocation is not None else None
            out.append((outcome.status, devices))
        results.append(out)
    assert results[0] == results[1]
    assert any(status == "unsatisfiable" for status, _ in results[0])  # some claims were refused: the skip was exercised


def test_the_walk_yields_every_node_once_whole_or_not():
    # two racks (multi-node domains) and two nodes in none: the walk goes past the nodes outside
    # any domain into the racks, whether or not some node still has every GPU free
    engine = _fleet()
    plans = [engine._plan(_claim("probe", 1))]
    assert sorted(engine.placement.order_nodes(plans, -1)) == NODES  # every node whole
    for name in NODES[:3]:
        (outcome,) = engine.allocate([_claim(f"one-{name}", 1)], node=name)
        assert outcome.status == "allocated"
    assert sorted(engine.placement.order_nodes(plans, -1)) == NODES  # some whole, some not
    for name in NODES[3:]:
        (outcome,) = engine.allocate([_claim(f"one-{name}", 1)], node=name)
        assert outcome.status == "allocated"
    walked = list(engine.placement.order_nodes(plans, -1))  # none whole
    assert sorted(walked) == NODES
    # the nodes outside any domain first, then rack by rack
    assert set(walked[:2]) == {"node-4", "node-5"} and {frozenset(walked[2:4]), frozenset(walked[4:])} == {frozenset(NODES[:2]), frozenset(NODES[2:4])}
