"""`dralloc bench placement` measures fairly: the three policies run the same trace under the
same waiting rules (benchmarks/placement.py)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import placement as bench


def full_then_big(max_wait: float) -> list:
    """Sixteen 8-GPU jobs fill the 16 HGX H100 nodes (the first leaves at t=20, the others never);
    an 8-GPU job arrives at t=16 and may wait `max_wait` minutes."""
    jobs = [bench.Job(i, float(i), 20.0 if i == 0 else 1e9, "h100", 8, 0, None, 0) for i in range(16)]
    jobs.append(bench.Job(16, 16.0, 5.0, "h100", 8, 0, None, 0, max_wait))
    return jobs


@pytest.mark.parametrize("policy", bench.POLICIES)
def test_every_policy_lets_a_claim_wait_as_the_trace_says(policy: str):
    waited = bench.run(full_then_big(30.0), policy, seed=1)
    assert (waited.large_claims_rejected, waited.large_waits[-1]) == (0, 4.0)  # placed when job 0 left
    refused = bench.run(full_then_big(2.0), policy, seed=1)
    assert (refused.large_claims_rejected, refused.large_rejected_with_enough_free_gpus) == (1, 0)  # no room in time
    assert refused.gpu_minutes == waited.gpu_minutes - 8 * 5.0


def test_the_trace_lets_only_large_claims_wait():
    jobs = bench.trace(seed=2, jobs=400, load=1.0, max_wait=45.0)
    assert {j.max_wait for j in jobs if j.large} == {45.0}
    assert {j.max_wait for j in jobs if not j.large} == {0.0}


def test_each_run_gives_the_three_policies_the_same_trace(monkeypatch):
    seen: dict[str, list] = {}
    real = bench.run

    def spy(jobs, policy="dralloc", **options):
        seen[policy] = [(j.index, j.at, j.duration, j.family, j.gpus, j.members, j.max_wait) for j in jobs]
        return real(jobs, policy, **options)

    monkeypatch.setattr(bench, "run", spy)
    result = bench.measure([3], [1.1], jobs=150, max_wait=20.0)
    assert set(seen) == set(bench.POLICIES)
    assert seen["dralloc"] == seen["kubernetes"] == seen["first_fit"]
    (one,) = result["runs"]
    assert (one["seed"], one["load"], one["units"]) == (3, 1.1, 150)
    for policy in bench.POLICIES:
        assert result["totals"][policy]["large_claims_rejected"] == one[policy]["large_claims_rejected"]


def test_seeds_and_loads_are_read_or_refused_by_name():
    assert bench.parse_seeds("1-3,7") == [1, 2, 3, 7]
    assert bench.parse_loads("0.9,1.1") == [0.9, 1.1]
    with pytest.raises(ValueError, match="seeds: 'x' is not a number"):
        bench.parse_seeds("x")
    with pytest.raises(ValueError, match="runs backwards"):
        bench.parse_seeds("5-1")
    with pytest.raises(ValueError, match="loads: 0 is not in"):
        bench.parse_loads("0")


def test_a_refusal_with_enough_free_gpus_is_described():
    """Sixteen 7-GPU jobs that never leave: one GPU free on every HGX node, 16 in all; an 8-GPU
    job waits 5 minutes and is refused with enough GPUs free, only not on one node."""
    jobs = [bench.Job(i, float(i), 1e9, "h100", 7, 0, None, 0) for i in range(16)]
    jobs.append(bench.Job(16, 16.0, 5.0, "h100", 8, 0, None, 0, 5.0))
    ours = bench.run(jobs, "dralloc", seed=1)
    (why,) = ours.fragmented
    assert (why["job"], why["free_total"], why["free_per_node"]) == (16, 16, [1] * 16)
    # dralloc held one node for it; the claim there came before the wait and never left
    ((node, there),) = why["held_at_the_end"].items()
    assert node.startswith("h100-sxm-")
    assert there == {"free": 1, "claims_there_before_the_wait": 1, "claims_placed_during_the_wait": 0}
    assert why["nodes_held_during_the_wait"] == 1 and why["placed_on_held_nodes_during_the_wait"] == []
    assert bench.summary(ours)["large_rejected_with_enough_free_gpus_why"] == [why]
    # first fit holds nothing for what waits
    (theirs,) = bench.run(jobs, "first_fit", seed=1).fragmented
    assert theirs["held_at_the_end"] == {} and theirs["nodes_held_during_the_wait"] == 0
