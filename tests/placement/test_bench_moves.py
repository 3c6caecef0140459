"""`dralloc bench placement --moves` (benchmarks/placement.py): dralloc with moves runs beside the three
policies on the same trace; a move happens only where a large claim would be refused with enough GPUs
free, restarts the moved claim and counts the GPU time it had served as lost."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from dralloc.allocator.moving import MOVE_AT
from dralloc.cli import app

sys.path.insert(0, str(Path(__file__).parents[2] / "benchmarks"))
import placement as bench


def scattered() -> list:
    """16 HGX H100 nodes full of 8-GPU jobs; jobs 0 and 1 leave at t=20. Then a 4-GPU job (t=21,
    leaves at t=24) and a 3-GPU job (t=22) share one freed node, a 2-GPU job (t=23, runs 100 minutes)
    takes the other: 5 and 6 GPUs free, one claim on each node. At t=25 an 8-GPU job may wait 5 minutes:
    no node drains in time, though 11 GPUs are free."""
    jobs = [bench.Job(i, i / 100, 20.0 - i / 100 if i < 2 else 1e9, "h100", 8, 0, None, 0) for i in range(16)]
    jobs.append(bench.Job(16, 21.0, 3.0, "h100", 4, 0, None, 0))
    jobs.append(bench.Job(17, 22.0, 1e9, "h100", 3, 0, None, 0))
    jobs.append(bench.Job(18, 23.0, 100.0, "h100", 2, 0, None, 0))
    jobs.append(bench.Job(19, 25.0, 10.0, "h100", 8, 0, None, 0, 5.0))
    return jobs


def test_without_moves_the_large_claim_is_refused_with_enough_free():
    plain = bench.run(scattered(), "dralloc", seed=1)
    assert (plain.large_claims_rejected, plain.large_rejected_with_enough_free_gpus) == (1, 1)
    assert "moves" not in bench.summary(plain)  # the three policies report as before


def test_at_move_at_of_its_wait_the_small_claim_in_the_way_moves_and_restarts():
    moved = bench.run(scattered(), "dralloc_moves", seed=1)
    assert (moved.large_claims_rejected, moved.moves, moved.claims_moved) == (0, 1, 1)
    at = 5.0 * MOVE_AT  # as the allocator's when-refused: 5/6 into its 5-minute wait
    assert moved.large_waits[-1] == pytest.approx(at)
    # the 2-GPU claim (the cheapest to move: one claim, fewest GPUs) had served from t=23: lost
    assert moved.gpu_minutes_lost == pytest.approx(2 * (2.0 + at))
    numbers = bench.summary(moved)
    assert (numbers["moves"], numbers["claims_moved"], numbers["gpu_hours_lost_to_moves"]) == (1, 1, round(2 * (2.0 + at) / 60, 1))


def gang_scattered() -> list:
    """As `scattered`, with a third HGX node freed at t=20 (whole again) and, at t=25, a gang of two
    8-GPU members that may wait 5 minutes: one node is whole, the nodes beside it hold one claim each."""
    jobs = [bench.Job(i, i / 100, 20.0 - i / 100 if i < 3 else 1e9, "h100", 8, 0, None, 0) for i in range(16)]
    jobs += scattered()[16:19]
    jobs.append(bench.Job(19, 25.0, 10.0, "h100", 8, 0, None, 2, 5.0))
    return jobs


def test_a_gangs_moves_come_only_when_its_wait_is_over():
    # when-refused (moving.moves_from): a gang is not moved for at MOVE_AT, only at its wait's end; the
    # 2-GPU claim (from t=23) moves then, having served 7 minutes
    moved = bench.run(gang_scattered(), "dralloc_moves", seed=1)
    assert (moved.large_claims_rejected, moved.moves, moved.claims_moved) == (0, 1, 1)
    assert moved.large_waits[-1] == pytest.approx(5.0)
    assert moved.gpu_minutes_lost == pytest.approx(2 * 7.0)
    # at MOVE_AT, as for a single claim, the same move would have come at 5 x 5/6 minutes
    sooner = bench.run(gang_scattered(), "dralloc_moves", seed=1, move_after=5.0 * MOVE_AT)
    assert (sooner.moves, sooner.large_waits[-1]) == (1, pytest.approx(5.0 * MOVE_AT))
    assert bench.run(gang_scattered(), "dralloc", seed=1).large_rejected_with_enough_free_gpus == 1


def test_early_moves_place_the_claim_as_it_starts_waiting():
    early = bench.run(scattered(), "dralloc_moves_early", seed=1)
    assert (early.large_claims_rejected, early.moves, early.large_waits[-1]) == (0, 1, 0.0)
    assert early.gpu_minutes_lost == pytest.approx(2 * 2.0)


def test_a_moved_claim_restarts_its_whole_duration():
    # the 2-GPU claim, moved at t=29.2, runs 100 minutes from then (to t=129.2, not t=123): a 1-GPU job
    # at t=126 finds it still running, one at t=131 does not (utilization is sampled at each arrival)
    jobs = scattered() + [bench.Job(20, 126.0, 0.1, "h100", 1, 0, None, 0), bench.Job(21, 131.0, 0.1, "h100", 1, 0, None, 0)]
    moved = bench.run(jobs, "dralloc_moves", seed=1)
    plain = bench.run(jobs, "dralloc", seed=1)
    gpus = round(8 / plain.utilization_samples[0])  # the fleet's GPUs, from the first 8-GPU job's share
    held = 14 * 8 + 3 + 1  # the 8-GPU jobs that stay, the 3-GPU job, the new 1-GPU job
    assert [round(s * gpus) for s in plain.utilization_samples[-2:]] == [held, held]
    assert [round(s * gpus) for s in moved.utilization_samples[-2:]] == [held + 2, held]
    # GPU time served counts each job's work once: the same, plus the 8-GPU claim's 10 minutes
    assert moved.gpu_minutes == pytest.approx(plain.gpu_minutes + 8 * 10.0)


def test_moves_are_only_for_refusals_with_enough_free():
    # the fleet stays full: the 8-GPU claim is refused for want of GPUs, and nothing is moved
    jobs = [bench.Job(i, float(i), 1e9, "h100", 8, 0, None, 0) for i in range(16)]
    jobs.append(bench.Job(16, 16.0, 5.0, "h100", 8, 0, None, 0, 5.0))
    for policy in bench.MOVE_POLICIES:
        run = bench.run(jobs, policy, seed=1)
        assert (run.large_claims_rejected, run.large_rejected_with_enough_free_gpus, run.moves) == (1, 0, 0)


def test_measure_with_moves_reports_both_move_policies_and_their_comparisons():
    result = bench.measure([3], [1.1], jobs=120, max_wait=20.0, moves=True)
    totals = result["totals"]
    assert set(bench.policies(True)) <= set(totals) and bench.policies(False) == bench.POLICIES
    for policy in bench.MOVE_POLICIES:
        assert {"moves", "claims_moved", "gpu_hours_lost_to_moves"} <= set(totals[policy])
        assert totals[f"{policy}_vs_first_fit"]["runs_with_more_large_rejected"] in (0, 1)
    assert "moves" not in totals["dralloc"]


def test_move_after_tries_moves_that_many_minutes_into_the_wait():
    # the lever `move_after` (README "Levers measured"): the 8-GPU job waits from t=25; moves at t=27,
    # the 2-GPU claim in the way had served 4 minutes (t=23 to 27)
    moved = bench.run(scattered(), "dralloc_moves", seed=1, move_after=2.0)
    assert (moved.large_claims_rejected, moved.moves, moved.claims_moved) == (0, 1, 1)
    assert moved.large_waits[-1] == pytest.approx(2.0)
    assert moved.gpu_minutes_lost == pytest.approx(2 * 4.0)
    # a move time past the wait's end changes nothing: moves at the end, as without it
    late = bench.run(scattered(), "dralloc_moves", seed=1, move_after=9.0)
    assert (late.large_waits[-1], late.gpu_minutes_lost) == (pytest.approx(5.0), pytest.approx(2 * 7.0))


def test_without_reservations_a_small_claim_takes_the_node_the_wait_would_hold():
    # a 2-GPU job at t=26: with the reservation it avoids the node held (the 2-GPU claim's, 6 free) and
    # the move there is of that one claim (2 GPUs x 7 minutes); without, it lands there (a 4-GPU hole
    # is worth more than a 3), so the move is of the 3-GPU claim on the other node (3 x 8 minutes)
    jobs = scattered() + [bench.Job(20, 26.0, 100.0, "h100", 2, 0, None, 0)]
    held = bench.run(jobs, "dralloc_moves", seed=1, move_after=9.0)  # (moves at the wait's end only)
    loose = bench.run(jobs, "dralloc_moves", seed=1, reserve=False, move_after=9.0)
    assert (held.moves, held.large_claims_rejected, held.gpu_minutes_lost) == (1, 0, pytest.approx(2 * 7.0))
    assert (loose.moves, loose.large_claims_rejected, loose.gpu_minutes_lost) == (1, 0, pytest.approx(3 * 8.0))
    # the three policies do not take the move levers' reserve: plain dralloc still reserves
    assert bench.run(jobs, "dralloc", seed=1, reserve=False).large_rejected_with_enough_free_gpus == 1


def test_measure_passes_move_levers_to_the_move_policies_only():
    plain = bench.measure([3], [1.1], jobs=120, max_wait=20.0, moves=True)
    levered = bench.measure([3], [1.1], jobs=120, max_wait=20.0, moves=True, levers={"reserve": False})
    assert levered["move_levers"] == {"reserve": False} and "move_levers" not in plain
    for policy in bench.POLICIES:
        assert levered["totals"][policy] == plain["totals"][policy]


def test_the_cli_passes_the_move_levers_and_refuses_a_negative_move_time():
    args = ["bench", "placement", "--seeds", "3", "--loads", "1.1", "--jobs", "60", "--max-wait", "20", "--moves", "--json"]
    result = CliRunner().invoke(app, [*args, "--move-no-reserve", "--move-after", "5", "--move-by-lost"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.output)["move_levers"] == {"move_after": 5.0, "reserve": False, "by_lost": True}
    plain = CliRunner().invoke(app, args)
    assert plain.exit_code == 0 and "move_levers" not in json.loads(plain.output)
    bad = CliRunner().invoke(app, [*args, "--move-after", "-1"])
    assert bad.exit_code != 0 and "--move-after" in bad.output and "Traceback" not in bad.output
