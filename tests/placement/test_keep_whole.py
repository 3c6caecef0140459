"""Whole nodes kept for large claims in proportion to the large demand seen recently
(engine/keep_whole.py, placement.py `kept_whole`): off by default; on, a small claim is refused
rather than break the last whole nodes of a group that large claims have been taking, and the
number kept follows the demand as it decays."""

from __future__ import annotations

import pytest
from conftest import claim, make_engine

from dralloc.allocator.engine.inventory import device_kind
from dralloc.allocator.engine.keep_whole import KeepWhole

GPU = device_kind("gpu.nvidia.com", "gpu")


def allocated(engine, name: str, gpus: int, node: str | None = None) -> str | None:
    outcome = engine.allocate([claim(name, gpus)], node=node)[0]
    return outcome.node if outcome.status == "allocated" else None


def test_the_demand_decays_with_claims_placed_and_sets_the_nodes_kept():
    keep = KeepWhole(factor=1.0, horizon=10, cap=2)
    group = (GPU, 7)
    assert keep.keep(group) == 0
    keep.large(group)
    keep.large(group)
    keep.large(group)
    assert keep.demand(group) == pytest.approx(3.0)
    assert keep.keep(group) == 2  # capped
    for _ in range(10):
        keep.placed()
    assert keep.demand(group) == pytest.approx(3.0 / 2.718281828, rel=1e-6)
    assert keep.keep(group) == 1
    for _ in range(20):
        keep.placed()
    assert keep.keep(group) == 0
    assert keep.groups(GPU) == []
    assert KeepWhole(factor=0.0).keep(group) == 0  # off


def test_off_by_default_a_small_claim_breaks_the_last_whole_node():
    engine = make_engine([("l40s-pcie", 2)])
    assert allocated(engine, "big", 8) is not None
    engine.release("default/big")  # large demand seen, but the rule is off
    assert allocated(engine, "a", 4) is not None
    assert allocated(engine, "b", 4) is not None
    assert allocated(engine, "c", 1) is not None  # breaks the second node
    assert engine.placement.kinds.whole.get(GPU, 0) == 0


def test_on_the_last_whole_node_is_kept_for_the_large_claims_seen():
    engine = make_engine([("l40s-pcie", 2)], keep_whole=1.0)  # as the allocator builds it from DRALLOC_ALLOCATOR_KEEP_WHOLE
    assert allocated(engine, "big", 8) is not None  # a large placement: this group keeps one whole node
    engine.release("default/big")
    assert allocated(engine, "a", 4) is not None
    assert allocated(engine, "b", 4) is not None  # fills the node a broke
    outcome = engine.allocate([claim("c", 1)], explain=True)[0]
    assert outcome.status == "unsatisfiable"  # only the kept node is left
    kept = engine.placement.kept_whole([engine._plan(claim("c", 1))])
    assert kept.bit_count() == 1
    (node,) = (n for n in ("l40s-pcie-0", "l40s-pcie-1") if engine.placement.kinds.free[GPU][n] == 8)
    assert f"kept whole for large claims: node {node} (in proportion to the large claims placed on" in " ".join(outcome.explanation.notes)
    # a large claim is not held back: the kept node is for it
    assert allocated(engine, "big-2", 8) is not None
    assert engine.placement.kinds.whole.get(GPU, 0) == 0


def test_other_groups_are_not_kept_and_the_demand_fades():
    # H100 and L40S nodes have different shapes: an 8-GPU claim on L40S keeps nothing on H100
    engine = make_engine([("l40s-pcie", 1), ("h100-sxm", 1)])
    keep = engine.placement.keep_whole
    keep.factor = 1.0
    keep.horizon = 4
    assert allocated(engine, "big", 8, node="l40s-pcie-0") == "l40s-pcie-0"
    engine.release("default/big")
    # both whole: a one-GPU claim would take the node without NVLink (L40S) first, but that one
    # is kept for the large demand seen there
    assert allocated(engine, "small", 1) == "h100-sxm-0"
    engine.release("default/small")
    # as claims are placed, the demand fades (horizon 4 claims): after three, none is kept
    for i in range(3):
        assert allocated(engine, f"s{i}", 1, node="h100-sxm-0") == "h100-sxm-0"
        engine.release(f"default/s{i}")
    assert keep.groups(GPU) == []
    assert allocated(engine, "later", 1) == "l40s-pcie-0"
