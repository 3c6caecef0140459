"""Size-aware packing: partly used nodes before whole ones, and among partly used nodes the one
the claim leaves with a useful hole (a power of two free) before one it leaves with an awkward
hole, at the cost of pure best fit (engine/placement.py `_hole_order`)."""

from __future__ import annotations

from conftest import claim, make_engine

from dralloc.allocator.engine.inventory import device_kind
from dralloc.allocator.engine.placement import _hole_order


def used(engine, node: str, gpus: int, name: str) -> None:
    assert engine.allocate([claim(name, gpus)], node=node)[0].status == "allocated"


def test_one_gpu_goes_where_it_leaves_four_free_not_three():
    # l40s-pcie-0: 4 free; l40s-pcie-1: 5 free; l40s-pcie-2: whole
    engine = make_engine([("l40s-pcie", 3)])
    used(engine, "l40s-pcie-0", 4, "a")
    used(engine, "l40s-pcie-1", 3, "b")
    outcome = engine.allocate([claim("one", 1)])[0]
    assert outcome.node == "l40s-pcie-1"  # leaves 4 there (and 4 on l40s-pcie-0): two 4-GPU holes
    assert engine.allocate([claim("four-a", 4)])[0].node in {"l40s-pcie-0", "l40s-pcie-1"}
    assert engine.allocate([claim("four-b", 4)])[0].node in {"l40s-pcie-0", "l40s-pcie-1"}
    assert engine.placement.kinds.free[device_kind("gpu.nvidia.com", "gpu")]["l40s-pcie-2"] == 8  # the whole node stays whole


def test_pure_best_fit_would_have_left_a_three_gpu_hole():
    """The same fleet with scoring off (Kubernetes' order) shows what the rule avoids: the first
    node (4 free) is left with 3, and the second 4-GPU claim breaks the whole node."""
    engine = make_engine([("l40s-pcie", 3)], scoring=False)
    used(engine, "l40s-pcie-0", 4, "a")
    used(engine, "l40s-pcie-1", 3, "b")
    assert engine.allocate([claim("one", 1)])[0].node == "l40s-pcie-0"
    assert engine.allocate([claim("four-a", 4)])[0].node == "l40s-pcie-1"
    assert engine.allocate([claim("four-b", 4)])[0].node == "l40s-pcie-2"


def test_partly_used_nodes_fill_before_a_whole_node_is_broken():
    engine = make_engine([("l40s-pcie", 3)])
    used(engine, "l40s-pcie-1", 7, "a")  # one GPU free
    used(engine, "l40s-pcie-2", 6, "b")  # two free
    assert engine.allocate([claim("one", 1)])[0].node == "l40s-pcie-1"  # the fullest: leaves none
    assert engine.allocate([claim("two", 1)])[0].node == "l40s-pcie-2"
    assert engine.allocate([claim("three", 1)])[0].node == "l40s-pcie-2"
    assert engine.allocate([claim("four", 1)])[0].node == "l40s-pcie-0"  # only now is a whole node broken


def test_hole_order():
    # a unit of one: leaves 0, 1, 2, then 4 (from 5 free), before the awkward 3, 5, 6
    assert _hole_order(1, 8) == (1, 2, 3, 5, 4, 6, 7)
    # a unit of two: 2 (leaves 0), 3, 4, 6 (leaves 4), then 5, 7; counts below two last
    assert _hole_order(2, 8) == (2, 3, 4, 6, 5, 7, 1)


def test_among_equally_full_nodes_the_one_with_more_claims_takes_a_small_claim():
    """A node held by one claim is whole again as soon as that claim leaves; one held by two
    waits for both. One more small claim on the node with more claims delays a whole node least."""
    engine = make_engine([("l40s-pcie", 3)])
    used(engine, "l40s-pcie-0", 4, "one-claim")  # 4 free, one claim to wait for
    used(engine, "l40s-pcie-1", 2, "a")
    used(engine, "l40s-pcie-1", 2, "b")  # 4 free, two claims to wait for
    assert engine.allocate([claim("small", 1)])[0].node == "l40s-pcie-1"
    # the counts follow releases: four claims came and went on l40s-pcie-0, one holds it now
    for key in ("small", "a", "b", "one-claim"):
        engine.release(f"default/{key}")
    for name in "defg":
        used(engine, "l40s-pcie-0", 1, name)
    for name in "defg":
        engine.release(f"default/{name}")
    used(engine, "l40s-pcie-0", 4, "h")
    used(engine, "l40s-pcie-1", 2, "i")
    used(engine, "l40s-pcie-1", 2, "j")
    assert engine.allocate([claim("small-2", 1)])[0].node == "l40s-pcie-1"


def test_the_claims_per_node_follow_allocations_and_releases():
    engine = make_engine([("l40s-pcie", 2)])
    kinds = engine.placement.kinds
    used(engine, "l40s-pcie-0", 2, "a")
    assert engine.allocate([claim("b", 1, nics=1)], node="l40s-pcie-0")[0].status == "allocated"
    assert kinds.claims["l40s-pcie-0"] == {"default/a": 2, "default/b": 2}  # its GPU and its NIC
    assert kinds.by_claims[2] == 1 << engine.inventory.node_rank["l40s-pcie-0"]
    engine.release("default/a")
    engine.release("default/b")
    assert kinds.claims["l40s-pcie-0"] == {} and not any(kinds.by_claims.values()) and not kinds.held
