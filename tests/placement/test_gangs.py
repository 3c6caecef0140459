"""Gangs: all-or-nothing across nodes, inside one NVLink clique or labelled domain."""

from __future__ import annotations

from conftest import claim, devices, make_engine

from dralloc.allocator.engine.gang import allocate_gang, gang_of
from dralloc.schemas.resource import Node, ObjectMeta


def _members(name: str, n: int, gpus: int) -> list:
    return [
        claim(
            f"{name}-{i}",
            gpus,
            annotations={"dralloc.dev/gang": name, "dralloc.dev/gang-size": str(n)},
        )
        for i in range(n)
    ]


def _held(engine, gang: list) -> list[str]:
    return [c.key for c in gang if c.key in engine.ledger.claims]


def test_two_gangs_compete_for_one_clique_one_wins_whole_the_other_waits_whole():
    for scoring in (True, False):
        engine = make_engine([("gb200-nvl72", 18)], scoring=scoring)  # one NVL72 rack: 72 GPUs
        a, b = _members("a", 10, 4), _members("b", 10, 4)
        won = allocate_gang(engine, a, name="a")
        assert [o.status for o in won] == ["allocated"] * 10
        assert len({o.node for o in won}) == 10  # ten trays, four GPUs each
        lost = allocate_gang(engine, b, name="b")
        assert [o.status for o in lost] == ["unsatisfiable"] * 10
        assert "none holds devices" in lost[0].message
        assert _held(engine, b) == []  # no partial gang holds devices
        assert sum(len(r.entries) for r in engine.ledger.claims.values()) == 40
        # a single claim still fits in what is left: the gang did not leak
        assert engine.allocate([claim("single", 4)])[0].status == "allocated"
        engine.release("default/single")
        for o in won:
            engine.release(o.claim)
        assert [o.status for o in allocate_gang(engine, b, name="b")] == ["allocated"] * 10


def test_gang_stays_inside_one_clique_and_prefers_the_fuller_one():
    engine = make_engine([("gb200-nvl72", 36)])  # two racks: nodes 0-17 and 18-35
    for i in range(3):
        devices(engine.allocate([claim(f"s{i}", 4)])[0])
    racks = {n.metadata.name: n.metadata.labels["dralloc.dev/rack"] for n in _nodes(36)}
    assert {racks[r.node] for r in engine.ledger.claims.values()} == {"gb200-nvl72-rack-0"}
    # 15 trays are free in rack 0 and 18 in rack 1: a 15-tray gang takes rack 0 (best fit)
    small = allocate_gang(engine, _members("small", 15, 4), name="small")
    assert {racks[o.node] for o in small} == {"gb200-nvl72-rack-0"}
    # rack 0 is full now: a 16-tray gang goes to rack 1, whole
    big = allocate_gang(engine, _members("big", 16, 4), name="big")
    assert {racks[o.node] for o in big} == {"gb200-nvl72-rack-1"}
    # and a gang bigger than any clique's free room waits, though 2 + 0 trays are free in total
    assert {o.status for o in allocate_gang(engine, _members("late", 3, 4), name="late")} == {"unsatisfiable"}


def _nodes(n: int) -> list[Node]:
    from dralloc.discovery.fleet import fleet_nodes

    return fleet_nodes([("gb200-nvl72", n)])


def test_gang_by_node_label_rack():
    engine = make_engine([("h100-sxm", 4)])
    for i in range(4):  # racks of two nodes
        name = f"h100-sxm-{i}"
        engine.apply(
            Node(
                metadata=ObjectMeta(
                    name=name,
                    labels={
                        "kubernetes.io/hostname": name,
                        "dralloc.dev/rack": f"r{i // 2}",
                    },
                )
            )
        )
    devices(engine.allocate([claim("x", 1)])[0])  # h100-sxm-0 (rack r0) is no longer whole
    gang = allocate_gang(engine, _members("job", 2, 8), name="job", domain_label="dralloc.dev/rack")
    assert sorted(o.node for o in gang) == ["h100-sxm-2", "h100-sxm-3"]
    assert "r1" in gang[0].message


def test_gang_member_error_fails_the_whole_gang():
    engine = make_engine([("gb200-nvl72", 18)])
    members = _members("bad", 3, 4)
    members[2].spec.devices.requests[0].exactly.device_class_name = "no-such-class"
    outcomes = allocate_gang(engine, members, name="bad")
    assert {o.status for o in outcomes} == {"error"}
    assert "no-such-class" in outcomes[0].message
    assert engine.ledger.claims == {}


def test_gang_annotations():
    c = claim(
        "p",
        1,
        annotations={
            "dralloc.dev/gang": "job",
            "dralloc.dev/gang-size": "4",
            "dralloc.dev/gang-domain": "dralloc.dev/rack",
        },
    )
    assert gang_of(c) == ("default/job", 4, "dralloc.dev/rack")
    assert gang_of(claim("q", 1)) is None


def test_small_claim_fills_a_hole_before_breaking_a_whole_node_of_the_fuller_rack():
    """Rack r0: h100-sxm-0 full, h100-sxm-1 whole (8 free). Rack r1: h100-sxm-2 with one GPU
    free, h100-sxm-3 whole (9 free). r0 is the fuller rack, but a one-GPU claim takes r1's
    hole: breaking h100-sxm-1 would leave r0 no node for an 8-GPU claim or gang member."""
    engine = make_engine([("h100-sxm", 4)])
    for i in range(4):
        name = f"h100-sxm-{i}"
        engine.apply(Node(metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, "dralloc.dev/rack": f"r{i // 2}"})))
    assert engine.allocate([claim("full", 8)], node="h100-sxm-0")[0].status == "allocated"
    assert engine.allocate([claim("seven", 7)], node="h100-sxm-2")[0].status == "allocated"
    assert engine.allocate([claim("one", 1)])[0].node == "h100-sxm-2"
    # no hole left: a whole node; both racks have 8 free now, r0 comes first by rank
    assert engine.allocate([claim("two", 1)])[0].node == "h100-sxm-1"


def test_a_rack_named_as_a_clique_is_a_domain_of_its_own():
    """Nodes 0-1 share the NVLink clique label "x", nodes 2-3 the rack label "x": two domains, not
    one name over both (nor one hiding the other), each with its own nodes."""
    engine = make_engine([("h100-sxm", 4)])
    for i in range(4):
        name = f"h100-sxm-{i}"
        label = {"nvidia.com/gpu.clique": "x"} if i < 2 else {"dralloc.dev/rack": "x"}
        engine.apply(Node(metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **label})))
    of, members = engine.placement.topology.domains()
    assert members == {"x": ["h100-sxm-0", "h100-sxm-1"], "rack:x": ["h100-sxm-2", "h100-sxm-3"]}
    assert [of[f"h100-sxm-{i}"] for i in range(4)] == ["x", "x", "rack:x", "rack:x"]


def test_a_clique_whose_value_reads_like_a_prefixed_rack_hides_no_domain():
    """A clique labelled "rack:x" (first), a clique "x", then a rack "x": the rack's prefixed name is
    taken, so it is prefixed again; three domains, each with its own node."""
    engine = make_engine([("h100-sxm", 3)])
    labels = [{"nvidia.com/gpu.clique": "rack:x"}, {"nvidia.com/gpu.clique": "x"}, {"dralloc.dev/rack": "x"}]
    for i, label in enumerate(labels):
        name = f"h100-sxm-{i}"
        engine.apply(Node(metadata=ObjectMeta(name=name, labels={"kubernetes.io/hostname": name, **label})))
    _, members = engine.placement.topology.domains()
    assert members == {"rack:x": ["h100-sxm-0"], "x": ["h100-sxm-1"], "rack:rack:x": ["h100-sxm-2"]}
