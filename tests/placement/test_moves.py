"""Moves (engine/moves.py through `Engine.plan_moves` / `Engine.apply_moves`): a large claim or gang
refused while its GPUs are free gets room by re-placing the claims in the way, each where its own
spec allows and never onto the target; plans change nothing, and apply all or nothing."""

from __future__ import annotations

from dataclasses import replace

import msgspec
import pytest
from conftest import EXAMPLES, claim, make_engine

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.ledger import Record
from dralloc.allocator.engine.moves import StalePlan
from dralloc.discovery.fleet import build_fleet, fleet_nodes
from dralloc.manifests import load_paths
from dralloc.schemas.resource import ResourceClaim

H100 = "NVIDIA H100 80GB HBM3"
ON_H100 = f"device.attributes['gpu.nvidia.com'].productName == '{H100}'"


def on(engine, name: str, gpus: int, node: str, selector: str | None = None) -> ResourceClaim:
    c = claim(name, gpus)
    if selector:
        c.spec.devices.requests[0].exactly.selectors = msgspec.convert([{"cel": {"expression": selector}}], list)  # type: ignore[union-attr]
        c = msgspec.convert(msgspec.to_builtins(c), ResourceClaim)
    (outcome,) = engine.allocate([c], node=node)
    assert outcome.status == "allocated", outcome.message
    return c


def ledger_state(engine) -> tuple:
    """What a plan must leave as it was: who holds which device, and the derived counts."""
    ledger = engine.ledger
    return (
        dict(ledger.exclusive),
        ledger.used_bits,
        dict(ledger.free_local),
        dict(ledger.counter_used),
        {n: dict(c) for n, c in engine.placement.kinds.claims.items() if c},
        {k: msgspec.to_builtins(r.allocation) for k, r in ledger.claims.items()},
    )


def assert_ledger_sound(engine, claims: dict[str, ResourceClaim]) -> None:
    """Every device held by at most one claim, the ledger's index agreeing with its records, and
    every claim's devices matching its own requests (class and selectors)."""
    held: dict[tuple[str, str, str], str] = {}
    for key, record in engine.ledger.claims.items():
        for entry in record.entries:
            if entry.kind == "exclusive":
                assert entry.device not in held, f"{entry.device} given to {held[entry.device]} and {key}"
                held[entry.device] = key
    assert held == engine.ledger.exclusive
    for key, c in claims.items():
        record = engine.ledger.claims.get(key)
        if record is None:
            continue
        plan = engine._plan(c)
        alts = {alt.result_name: alt for request in plan.requests for alt in request.alts}
        for result in record.allocation.devices.results:
            rec = engine.inventory.by_key[(result.driver, result.pool, result.device)]
            assert engine.verdicts.get(alts[result.request], 1 << rec.id).matched >> rec.id & 1, f"{key}: {result.device} fails its selectors"
            assert rec.local_node == record.node


def three_busy_nodes():
    """h100-sxm-0: one 1-GPU claim; -1: one 3-GPU claim; -2: a 2-GPU and a 4-GPU claim. 16 of 24 free,
    no node whole: an 8-GPU claim does not fit."""
    engine = make_engine([("h100-sxm", 3)])
    claims = {
        c.key: c
        for c in (
            on(engine, "a", 1, "h100-sxm-0"),
            on(engine, "b", 3, "h100-sxm-1"),
            on(engine, "c", 2, "h100-sxm-2"),
            on(engine, "d", 4, "h100-sxm-2"),
        )
    }
    return engine, claims


def test_a_large_claim_gets_the_node_whose_claims_are_cheapest_to_move():
    engine, claims = three_busy_nodes()
    big = claim("big", 8)
    assert engine.allocate([big])[0].status == "unsatisfiable"
    before = ledger_state(engine)
    plan = engine.plan_moves([big], claims)
    assert plan is not None
    assert ledger_state(engine) == before  # planning changed nothing
    assert plan.target == ("h100-sxm-0",) and [m.claim for m in plan.moves] == ["default/a"] and plan.devices_moved == 1
    outcomes = engine.apply_moves(plan)
    by = {o.claim: o for o in outcomes}
    assert by["default/big"].node == "h100-sxm-0" and len(by["default/big"].allocation.devices.results) == 8
    assert by["default/a"].node != "h100-sxm-0" and "to make room for claim default/big" in by["default/a"].message
    assert_ledger_sound(engine, {**claims, big.key: big})
    assert engine.allocation_of("default/a") == by["default/a"].allocation


def test_fewest_claims_first_then_fewest_devices():
    engine = make_engine([("h100-sxm", 3)])
    claims = {
        c.key: c
        for c in (
            on(engine, "x1", 1, "h100-sxm-0"),
            on(engine, "x2", 1, "h100-sxm-0"),  # two claims, two GPUs
            on(engine, "y", 3, "h100-sxm-1"),  # one claim, three GPUs
            on(engine, "z", 4, "h100-sxm-2"),  # one claim, four GPUs
        )
    }
    plan = engine.plan_moves([claim("big", 8)], claims)
    assert plan is not None and plan.target == ("h100-sxm-1",) and [m.claim for m in plan.moves] == ["default/y"]


def test_a_claim_not_movable_is_never_moved():
    engine, claims = three_busy_nodes()
    pinned = {k: c for k, c in claims.items() if k != "default/a"}
    plan = engine.plan_moves([claim("big", 8)], pinned)
    assert plan is not None and plan.target == ("h100-sxm-1",) and [m.claim for m in plan.moves] == ["default/b"]
    assert engine.plan_moves([claim("big", 8)], {}) is None


def test_a_moved_claim_goes_only_where_its_own_selector_holds():
    # (the full node's claim wants an H100 too: it cannot move either)
    # the H100 node's one claim could go to the L40S node's free GPUs, unless its selector wants an H100
    def fleet(selector: str | None):
        engine = make_engine([("h100-sxm", 2), ("l40s-pcie", 1)])
        claims = {c.key: c for c in (on(engine, "small", 1, "h100-sxm-0", selector), on(engine, "full", 8, "h100-sxm-1", ON_H100))}
        return engine, claims

    big = claim("big", 8)
    big.spec.devices.requests[0].exactly.selectors = msgspec.convert([{"cel": {"expression": ON_H100}}], list)  # type: ignore[union-attr]
    big = msgspec.convert(msgspec.to_builtins(big), ResourceClaim)
    engine, claims = fleet(None)
    plan = engine.plan_moves([big], claims)
    assert plan is not None and plan.moves[0].after.node == "l40s-pcie-0"
    engine.apply_moves(plan)
    assert_ledger_sound(engine, {**claims, big.key: big})

    engine, claims = fleet(ON_H100)
    before = ledger_state(engine)
    assert engine.plan_moves([big], claims) is None  # no other H100 has room for it
    assert ledger_state(engine) == before


def test_a_plan_made_in_another_state_is_refused_whole():
    engine, claims = three_busy_nodes()
    plan = engine.plan_moves([claim("big", 8)], claims)
    assert plan is not None
    assert engine.allocate([claim("late", 1)])[0].status == "allocated"
    before = ledger_state(engine)
    with pytest.raises(StalePlan):
        engine.apply_moves(plan)
    assert ledger_state(engine) == before


def test_a_plan_that_would_give_a_device_twice_applies_nothing():
    engine, claims = three_busy_nodes()
    plan = engine.plan_moves([claim("big", 8)], claims)
    assert plan is not None
    # the moved claim's new record forged onto a device claim d holds: apply must refuse the whole plan
    taken = next(e for e in engine.ledger.claims["default/d"].entries if e.kind == "exclusive")
    move = plan.moves[0]
    forged_after = Record(claim=move.claim, allocation=move.after.allocation, node=move.after.node, entries=[taken])
    forged = replace(plan, moves=(replace(move, after=forged_after),))
    before = ledger_state(engine)
    with pytest.raises(StalePlan, match="given twice"):
        engine.apply_moves(forged)
    assert ledger_state(engine) == before  # the moved claim still holds its old devices; big holds none
    assert "default/big" not in engine.ledger.claims


def test_a_gang_gets_the_nodes_whose_claims_move_least():
    engine = make_engine([("h100-sxm", 3)])
    claims = {
        c.key: c
        for c in (
            on(engine, "a", 1, "h100-sxm-0"),
            on(engine, "b", 2, "h100-sxm-1"),
            on(engine, "c", 4, "h100-sxm-2"),
        )
    }
    gang = [claim(f"m-{i}", 8) for i in range(2)]
    plan = engine.plan_moves(gang, claims, domain_label="")
    assert plan is not None
    assert plan.target == ("h100-sxm-0", "h100-sxm-1") and sorted(m.claim for m in plan.moves) == ["default/a", "default/b"]
    assert all(m.after.node == "h100-sxm-2" for m in plan.moves)
    outcomes = engine.apply_moves(plan)
    assert sorted(o.node for o in outcomes if o.claim.startswith("default/m-")) == ["h100-sxm-0", "h100-sxm-1"]
    assert_ledger_sound(engine, {**claims, **{c.key: c for c in gang}})


def test_plans_are_deterministic_and_nothing_is_planned_for_a_claim_that_fits():
    one, claims = three_busy_nodes()
    two, _ = three_busy_nodes()
    a, b = one.plan_moves([claim("big", 8)], claims), two.plan_moves([claim("big", 8)], claims)
    assert a is not None and b is not None
    assert (a.target, [msgspec.to_builtins(m.after.allocation) for m in a.moves]) == (b.target, [msgspec.to_builtins(m.after.allocation) for m in b.moves])
    assert one.plan_moves([claim("small", 2)], claims) is None  # it fits as it is: nothing in its way is worth moving


def test_a_gang_target_skips_a_node_whose_claims_have_nowhere_to_go():
    # the two cheapest nodes (one 4-GPU claim each) cannot both be emptied: only one 4-GPU hole is
    # left elsewhere; the 6-GPU claim of h100-sxm-3 can go to h100-sxm-2's six free GPUs instead
    engine = make_engine([("h100-sxm", 4)])
    claims = {
        c.key: c
        for c in (
            on(engine, "a", 4, "h100-sxm-0"),
            on(engine, "b", 4, "h100-sxm-1"),
            on(engine, "c1", 1, "h100-sxm-2"),
            on(engine, "c2", 1, "h100-sxm-2"),
            on(engine, "d", 6, "h100-sxm-3"),
        )
    }
    gang = [claim(f"m-{i}", 8) for i in range(2)]
    plan = engine.plan_moves(gang, claims, domain_label="")
    assert plan is not None
    assert plan.target == ("h100-sxm-0", "h100-sxm-3")
    assert {m.claim: m.after.node for m in plan.moves} == {"default/a": "h100-sxm-1", "default/d": "h100-sxm-2"}
    engine.apply_moves(plan)
    assert_ledger_sound(engine, {**claims, **{c.key: c for c in gang}})


def test_a_gang_plan_chosen_among_domains_applies():
    # two racks of two nodes, a small claim on every node: each rack can be emptied into the other;
    # rack a (1-GPU claims) is cheaper than rack b (2-GPU claims), whichever is tried last
    engine = Engine()
    for node in fleet_nodes([("h100-sxm", 4)]):
        node.metadata.labels["dralloc.dev/rack"] = "a" if node.metadata.name in ("h100-sxm-0", "h100-sxm-1") else "b"
        engine.apply(node)
    for item in load_paths([EXAMPLES / "deviceclasses.yaml"]).objects:
        engine.apply(item.obj)
    for _, slices in build_fleet([("h100-sxm", 4)]):
        for s in slices:
            engine.apply(s)
    claims = {
        c.key: c
        for c in (
            on(engine, "a0", 1, "h100-sxm-0"),
            on(engine, "a1", 1, "h100-sxm-1"),
            on(engine, "b2", 2, "h100-sxm-2"),
            on(engine, "b3", 2, "h100-sxm-3"),
        )
    }
    gang = [claim(f"m-{i}", 8) for i in range(2)]
    plan = engine.plan_moves(gang, claims, domain_label="dralloc.dev/rack")
    assert plan is not None and plan.target == ("h100-sxm-0", "h100-sxm-1")
    engine.apply_moves(plan)  # not refused as stale: trying rack b after rack a changed nothing
    assert_ledger_sound(engine, {**claims, **{c.key: c for c in gang}})


def test_a_claim_moved_for_a_gang_says_so():
    engine = make_engine([("h100-sxm", 3)])
    claims = {c.key: c for c in (on(engine, "a", 1, "h100-sxm-0"), on(engine, "b", 2, "h100-sxm-1"), on(engine, "c", 4, "h100-sxm-2"))}
    plan = engine.plan_moves([claim("m-0", 8), claim("m-1", 8)], claims, domain_label="")
    assert plan is not None
    messages = {o.claim: o.message for o in engine.apply_moves(plan)}
    assert messages["default/a"].endswith("to make room for the gang of claims default/m-0, default/m-1 (dralloc moves)")
    assert messages["default/m-0"].startswith("placed on node h100-sxm-")


def test_with_lost_the_target_whose_claims_cost_least_among_as_many_claims():
    engine = make_engine([("h100-sxm", 3)])
    claims = {
        c.key: c
        for c in (
            on(engine, "x1", 1, "h100-sxm-0"),
            on(engine, "x2", 1, "h100-sxm-0"),
            on(engine, "y", 3, "h100-sxm-1"),
            on(engine, "z", 4, "h100-sxm-2"),
        )
    }
    big = claim("big", 8)
    # y has served the most: z (one claim as well, more devices) is moved instead; the two claims of
    # node 0 cost nothing but are two moves: never before a node of one claim
    plan = engine.plan_moves([big], claims, lost={"default/y": 90.0, "default/z": 40.0})
    assert plan is not None and plan.target == ("h100-sxm-2",) and [m.claim for m in plan.moves] == ["default/z"]
    # a key not given costs nothing: y, then fewest devices as without `lost`
    plan = engine.plan_moves([big], claims, lost={"default/z": 40.0})
    assert plan is not None and plan.target == ("h100-sxm-1",)


def test_with_lost_a_gang_leaves_the_claim_that_served_longest_in_place():
    engine = make_engine([("h100-sxm", 3)])
    claims = {
        c.key: c
        for c in (
            on(engine, "a", 1, "h100-sxm-0"),
            on(engine, "b", 2, "h100-sxm-1"),
            on(engine, "c", 4, "h100-sxm-2"),
        )
    }
    gang = [claim(f"m-{i}", 8) for i in range(2)]
    # without `lost` a and b move (fewest devices, the test above); a has served the most: b and c
    # move onto a's node instead
    plan = engine.plan_moves(gang, claims, domain_label="", lost={"default/a": 100.0})
    assert plan is not None
    assert plan.target == ("h100-sxm-1", "h100-sxm-2") and sorted(m.claim for m in plan.moves) == ["default/b", "default/c"]
    assert all(m.after.node == "h100-sxm-0" for m in plan.moves)
    engine.apply_moves(plan)
    assert_ledger_sound(engine, {**claims, **{c.key: c for c in gang}})
