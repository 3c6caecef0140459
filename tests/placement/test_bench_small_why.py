"""`dralloc bench placement` says why each small claim was refused, as it happens
(benchmarks/placement.py `SMALL_WHY`): the family full, fragmentation, held nodes, or GPUs that
moved claims hold only because their move restarted them."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import placement as bench
from test_bench_moves import scattered


def filled(gpus: int, then: int) -> list:
    """Sixteen `gpus`-GPU jobs that never leave, one per HGX H100 node; then a `then`-GPU job."""
    jobs = [bench.Job(i, float(i), 1e9, "h100", gpus, 0, None, 0) for i in range(16)]
    jobs.append(bench.Job(16, 16.0, 5.0, "h100", then, 0, None, 0))
    return jobs


@pytest.mark.parametrize("policy", bench.POLICIES)
def test_a_full_family_and_scattered_holes_are_told_apart(policy: str):
    full = bench.run(filled(8, 1), policy, seed=1)
    assert full.small_claims_rejected == 1 and full.small_why["family_full"] == 1
    assert full.small_by_family == {"h100": {**dict.fromkeys(bench.SMALL_WHY, 0), "family_full": 1}}
    # 3 GPUs free on every node, 48 in all: a 4-GPU claim fits on none
    holes = bench.run(filled(5, 4), policy, seed=1)
    assert holes.small_claims_rejected == 1 and holes.small_why["fragmented"] == 1
    numbers = bench.summary(holes)
    assert numbers["small_claims_rejected_why"] == {**dict.fromkeys(bench.SMALL_WHY, 0), "fragmented": 1}
    assert numbers["small_claims_rejected_why_by_family"] == {"h100": numbers["small_claims_rejected_why"]}


def test_a_small_claim_kept_off_a_held_whole_node_is_held_and_the_probe_changes_nothing():
    engine = bench.fleet_engine(scoring=True)
    jobs = [bench.Job(i, 0.0, 1.0, "h100", 8, 0, None, 0) for i in range(16)]
    for job in jobs[:15]:
        assert engine.allocate(job.claims())[0].status == "allocated"
    node = next(n for n in engine.inventory.node_names if n.startswith("h100-sxm") and not engine.placement.kinds.claims.get(n))
    engine.reserve(engine.inventory.local.get(node))  # held for a unit that waits: whole, so kept from smaller claims
    small = bench.Job(99, 0.0, 1.0, "h100", 1, 0, None, 0)
    claims = small.claims()
    assert engine.allocate(claims)[0].status == "unsatisfiable"
    by_node: dict[str, list] = {}
    for rec in engine.inventory.devices:
        if rec is not None and rec.local_node is not None:
            by_node.setdefault(rec.local_node, []).append(rec)
    held, rules = engine.placement.reserved, engine.placement.held_rules
    assert bench._why_small(engine, small, claims, by_node, []) == "held"
    # the probe gave back what it took and put the reservation and the rules back
    assert claims[0].key not in engine.ledger.claims
    assert (engine.placement.reserved, engine.placement.held_rules) == (held, rules)
    assert engine.allocate(claims)[0].status == "unsatisfiable"
    engine.placement.held_rules = False  # as with moves on (when-refused): a held node is only tried last
    assert engine.allocate(claims)[0].node == node


def test_gpus_held_by_a_moved_claims_restart_are_the_moves_cost():
    # (scattered: at t=29.2 the 2-GPU claim, which would have left at t=123, moves beside the 3-GPU
    # claim and restarts, to t=129.2; the 8-GPU claim takes its node until t=39.2.) Then an 8-GPU job
    # and a 3-GPU job fill the fleet; at t=126 a 2-GPU job finds it full but for the restarted claim
    jobs = scattered()
    jobs += [bench.Job(20, 40.0, 1e9, "h100", 8, 0, None, 0), bench.Job(21, 41.0, 1e9, "h100", 3, 0, None, 0)]
    late = [*jobs, bench.Job(22, 126.0, 1.0, "h100", 2, 0, None, 0)]
    moved = bench.run(late, "dralloc_moves", seed=1)
    assert (moved.moves, moved.small_claims_rejected) == (1, 1)
    assert moved.small_why["restart_overhang"] == 1
    # after t=129.2 it has left: the same job is placed, and a 4-GPU one finds too few GPUs free
    after = bench.run([*jobs, bench.Job(22, 130.0, 1e9, "h100", 2, 0, None, 0), bench.Job(23, 131.0, 1.0, "h100", 4, 0, None, 0)], "dralloc_moves", seed=1)
    assert after.small_claims_rejected == 1 and after.small_why["family_full"] == 1
