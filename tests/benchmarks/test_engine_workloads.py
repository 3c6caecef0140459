"""The engine benchmark's workloads build what they promise: the selector mix, NVLink domains
smaller than a node, the Kubernetes-comparable label, churn-mixed's kinds of claims (each one
allocatable on its fleet) and churn at steady utilisation, seeds named in the output."""

from __future__ import annotations

import gc
import os
from collections import Counter

import pytest

from dralloc.allocator.engine import CelError, Engine, compile_selector
from dralloc.cli import _benchmarks_module
from dralloc.discovery.attributes import LABEL_PROFILE

W = _benchmarks_module("engine_workloads")


def _selectors(claim) -> list[str]:
    return [s.cel.expression for s in claim.spec.devices.requests[0].exactly.selectors]


def _domains_per_node(objects) -> dict[str, set[str]]:
    domains: dict[str, set[str]] = {}
    for obj in objects:
        spec = getattr(obj, "spec", None)
        if getattr(spec, "driver", None) != W.GPU_DRIVER:
            continue
        for device in spec.devices or []:
            if W.NVLINK_DOMAIN in device.attributes:
                domains.setdefault(spec.node_name, set()).add(device.attributes[W.NVLINK_DOMAIN].string)
    return domains


def test_gpu_fleet_rotates_its_three_selectors():
    fleet = W.gpu_fleet_10k(nodes=30)
    kinds = Counter(next(k for k, e in W.SELECTORS.items() if e in _selectors(c)) for c in fleet.claims if _selectors(c))
    assert set(kinds) == set(W.SELECTORS)  # productName and cudaComputeCapability, not only memory
    assert max(kinds.values()) - min(kinds.values()) <= 1
    with_selector = sum(kinds.values())
    assert with_selector == (len(fleet.claims) + 2) // 3  # every third claim
    assert fleet.seed == 7 and W.gpu_fleet_10k(nodes=30, seed=8).claims != fleet.claims


def test_gpu_fleet_has_nvlink_domains_smaller_than_a_node():
    fleet = W.gpu_fleet_10k(nodes=10)
    domains = _domains_per_node(fleet.objects)
    assert any(len(d) == 4 for d in domains.values())  # A100 PCIe: four bridged pairs
    assert any(len(d) == 1 for d in domains.values())  # HGX: one NVSwitch domain of 8
    assert all(c.spec.devices.constraints for c in fleet.claims if c.spec.devices.requests[0].exactly.count > 1)


def test_kube_perf_is_labelled_the_kubernetes_comparable_shape():
    perf = W.kube_perf_500()
    assert perf.shape.startswith("Kubernetes-comparable") and "literal shortcut" in perf.shape
    assert perf.devices == 5000 and len(perf.claims) == 5000 and perf.seed is None
    assert "Kubernetes-comparable" not in W.gpu_fleet_10k(nodes=5).shape


@pytest.fixture(scope="module")
def churn():
    return W.churn_mixed(seed=3, arrivals=1500, blocks=1)


def test_churn_mixed_has_every_kind_of_claim_and_selector(churn):
    kinds = Counter(W.churn_kind(c) for c in churn.claims)
    assert set(kinds) == set(W.CHURN_KINDS) and min(kinds.values()) > 100
    used = Counter(e for c in churn.claims for e in _selectors(c))
    for expression in (*W.CHURN_SELECTORS.values(), *W.MIG_SELECTORS.values()):
        assert used[expression] > 10, expression
    assert any("cel.bind(" in e for e in used)
    profiles = {o.metadata.labels.get(LABEL_PROFILE) for o in churn.objects if o.__class__.__name__ == "Node"}
    assert len(profiles) == 5
    domains = _domains_per_node(churn.objects)
    assert any(len(d) == 4 for d in domains.values())  # NVLink pairs: domains smaller than a node
    racks = Counter(next(iter(d)) for d in domains.values() if any(x.endswith("/nvl72") for x in d))
    assert racks and set(racks.values()) == {18}  # GB200 racks: 18 trays share one domain
    assert 0 < churn.churn_after < len(churn.claims)


def test_every_churn_claim_shape_can_be_allocated(churn):
    """Each selector and kind selects devices on its fleet (no benchmark of claims that never fit)."""
    samples = {}
    for claim in churn.claims:
        key = (W.churn_kind(claim), tuple(_selectors(claim)), claim.spec.devices.requests[0].exactly.count)
        samples.setdefault(key, claim)
    engine = Engine()
    for obj in churn.objects:
        engine.apply(obj)
    outcomes = {key: engine.allocate([claim])[0] for key, claim in samples.items()}
    assert {key: o.status for key, o in outcomes.items() if o.status != "allocated"} == {}
    share = next(o for (kind, *_), o in outcomes.items() if kind == "share")
    assert share.allocation.devices.results[0].share_id is not None
    mig = next(o for (kind, *_), o in outcomes.items() if kind == "mig")
    assert "-mig-" in mig.allocation.devices.results[0].device


def test_measure_churns_at_steady_utilisation_and_names_the_seed(churn):
    result = W.measure("churn-mixed", seed=3, workload=churn)
    assert result["seed"] == 3 and result["workload"] == "churn-mixed"
    assert result["releases"] == len(churn.claims) - churn.churn_after
    assert result["errors"] == 0 and result["allocated"] > result["releases"]
    assert abs(result["utilization"] - result["utilization_at_fill"]) < 0.15
    assert result["utilization_at_fill"] > 0.6
    assert "cel" in result  # (cel_costs, tested below)
    # which engine ran: compiled on the native run (DRALLOC_NATIVE=1, .ci/run), else the sources
    assert result["native"] is (os.environ.get("DRALLOC_NATIVE") == "1")


def test_cel_costs_time_each_selector_that_reaches_cel_on_the_devices_its_class_selects(churn):
    cel = W.cel_costs(churn)
    rows = {row["expression"]: row for row in cel["selectors"]}
    claims = {s for claim in churn.claims for s in _selectors(claim)}
    assert set(rows) == claims | {W.GPU_CLASS, W.MIG_CLASS}
    mig = set(W.MIG_SELECTORS.values())
    # a claim's selector sees its class's devices only: MIG selectors the MIG partitions, the others the
    # whole GPUs, fewer in this fleet than its partitions; the classes see every device looked at
    assert len({rows[e]["devices"] for e in mig}) == 1 and len({rows[e]["devices"] for e in claims - mig}) == 1
    assert rows[next(iter(claims - mig))]["devices"] < rows[next(iter(mig))]["devices"] <= rows[W.MIG_CLASS]["devices"]
    assert all(row["us"] > 0 and row["interpreter_us"] > 0 for row in rows.values())
    assert cel["us_per_device"] == [min(r["us"] for r in rows.values()), max(r["us"] for r in rows.values())]
    assert cel["cost_bomb_refused_ms"] > 0


def test_cel_costs_leave_out_the_driver_literal_and_the_cost_bomb_stays_over_the_limit():
    cel = W.cel_costs(W.kube_perf_500())  # its only selector: the class's `device.driver == ...`
    assert cel["selectors"] == [] and cel["us_per_device"] is None and cel["interpreter_us_per_device"] is None
    assert cel["cost_bomb_refused_ms"] > 0
    with pytest.raises(CelError, match="estimated cost 2,227,977 is over the limit"):
        compile_selector(W.cost_bomb(10**9))  # (a number the bench has not used: not in the compile cache)


def test_frontier_fleet_is_31250_nodes_with_nvl72_racks():
    fleet = dict(W.frontier_fleet(W.FRONTIER_NODES))
    assert sum(fleet.values()) == W.FRONTIER_NODES and fleet["gb200-nvl72"] == 100 * 18
    gpus = sum(count * (4 if profile == "gb200-nvl72" else 8) for profile, count in fleet.items())
    assert gpus == W.FRONTIER_GPUS
    small = W.frontier(nodes=40)
    assert small.devices == sum(count * (4 if p == "gb200-nvl72" else 8) for p, count in W.frontier_fleet(40))
    assert small.extra == {"nodes": 40} and small.seed == 7


def test_the_frontier_fleet_is_built_as_it_is_loaded_the_same_objects_in_the_same_order():
    import msgspec

    pairs = W.frontier_fleet(40)
    eager, gpus = W._profile_objects(pairs)
    lazy = W.frontier(nodes=40).objects
    assert isinstance(lazy, W.LazyFleet) and lazy.gpus == gpus
    first = list(lazy)
    assert [msgspec.json.encode(o) for o in first] == [msgspec.json.encode(o) for o in eager]
    assert lazy.build_s > 0 and lazy.build_cpu_s > 0  # (taken out of the cold start by `measure`)
    again = list(lazy)  # each pass builds afresh: the engine owns (and rewrites) what it was given
    assert len(again) == len(first) and all(a is not b for a, b in zip(again, first))


def test_measure_drops_the_frontier_claims_it_has_decided_and_still_counts_them():
    small = W.frontier(nodes=19, seed=5)
    count = len(small.claims)
    result = W.measure("frontier-250k", seed=5, workload=small)
    assert result["claims"] == count == result["allocated"] + result["unsatisfiable"] + result["errors"]
    assert small.claims == [None] * count  # the bench keeps no decided claim (the peak RSS is the engine's)
    assert "cel" not in result  # (nothing left to time the selectors on)
    churn = W.churn_mixed(arrivals=50, seed=3)
    W.measure("churn-mixed", seed=3, workload=churn)
    assert all(c is not None for c in churn.claims)  # other workloads keep theirs


def test_scale_sizes_parse_and_refuse_nonsense():
    assert W.parse_sizes("10k, 50k,250000") == [10_000, 50_000, 250_000]
    for bad in ("10x", "", "5", "2000k"):
        with pytest.raises(ValueError, match="GPU count"):
            W.parse_sizes(bad)
    assert 31_000 <= W.frontier_nodes_for(250_000) <= 33_000


def test_bench_engine_frontier_at_a_small_size_through_the_cli():
    import json

    from typer.testing import CliRunner

    from dralloc.cli import app

    result = CliRunner().invoke(app, ["bench", "engine", "--workload", "frontier-250k", "--nodes", "19", "--seed", "5", "--json"])
    assert result.exit_code == 0, result.output
    report = json.loads(result.stdout)
    assert report["nodes"] == 19 and report["seed"] == 5 and report["workload"] == "frontier-19-nodes"
    assert report["devices"] == 18 * 4 + 8 and report["allocated"] + report["unsatisfiable"] == report["claims"]
    refused = CliRunner().invoke(app, ["bench", "engine", "--workload", "kube-perf-500", "--nodes", "50"])
    assert refused.exit_code == 2 and "--nodes goes with --workload frontier-250k" in refused.stderr


def test_measure_runs_the_allocators_collector_policy_no_collection_walks_the_claims():
    """`measure` freezes what the claims leave alive as the allocator does (`Collector.settle`):
    kube-perf-500's 5,000 claims keep ~30 objects each alive, which under a freeze alone made
    young collections during the claims (five, each walking every claim's state since the last)."""
    threshold = gc.get_threshold()
    try:
        result = W.measure("kube-perf-500")
    finally:
        gc.unfreeze()
        gc.set_threshold(*threshold)
    assert result["allocated"] == 5_000
    assert result["gc_collections"] == 0
