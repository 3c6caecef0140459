"""Placement on each hardware profile, for each claim size: the expected domains were
worked out by hand from the profiles' topology (services/discovery/profiles):

- l40s-pcie (2-socket PCIe server): NUMA 0 = switch 0 (gpu-0, gpu-1, nic-0) + switch 1
  (gpu-2, gpu-3, nic-1); NUMA 1 = switch 2 (gpu-4, gpu-5, nic-2) + switch 3 (gpu-6, gpu-7, nic-3).
- h100-sxm (HGX): one NVSwitch domain; switch k holds gpu-2k, gpu-2k+1, nic-2k, nic-2k+1;
  switches 0-1 on NUMA 0, 2-3 on NUMA 1.
- a100-pcie: the L40S layout with NVLink-bridged pairs (gpu-0+1, 2+3, ...), MIG-capable.
- gb200-nvl72 tray: one switch per GPU (gpu-k with nic-k); gpu-0/1 on NUMA 0, gpu-2/3 on NUMA 1.
"""

from __future__ import annotations

import pytest
from conftest import claim, devices, make_engine


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, ["gpu-0"]),
        (2, ["gpu-0", "gpu-1"]),
        (4, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),
        (8, [f"gpu-{i}" for i in range(8)]),
    ],
)
def test_l40s_sizes_on_a_free_node(count, expected):
    engine = make_engine([("l40s-pcie", 1)])
    assert devices(engine.allocate([claim("c", count)])[0]) == expected


def test_l40s_pair_stays_under_one_switch_when_first_fit_would_cross():
    scored, plain = (
        make_engine([("l40s-pcie", 1)]),
        make_engine([("l40s-pcie", 1)], scoring=False),
    )
    for engine in (scored, plain):
        assert devices(engine.allocate([claim("one", 1)])[0]) == ["gpu-0"]
    # Kubernetes' order takes gpu-1 and gpu-2: two switches. Scored: switch 1, whole.
    assert devices(plain.allocate([claim("pair", 2)])[0]) == ["gpu-1", "gpu-2"]
    assert devices(scored.allocate([claim("pair", 2)])[0]) == ["gpu-2", "gpu-3"]
    # best fit: the next single GPU completes switch 0 instead of opening NUMA 1
    assert devices(scored.allocate([claim("single", 1)])[0]) == ["gpu-1"]
    # and the four-GPU claim gets a whole NUMA node
    assert devices(scored.allocate([claim("quad", 4)])[0]) == [
        "gpu-4",
        "gpu-5",
        "gpu-6",
        "gpu-7",
    ]


def test_l40s_four_gpus_prefer_the_numa_node_that_has_four_free():
    engine = make_engine([("l40s-pcie", 1)])
    devices(engine.allocate([claim("a", 1)])[0])  # gpu-0: NUMA 0 has 3 left
    assert devices(engine.allocate([claim("quad", 4)])[0]) == [
        "gpu-4",
        "gpu-5",
        "gpu-6",
        "gpu-7",
    ]


@pytest.mark.parametrize("profile", ["l40s-pcie", "h100-sxm"])
def test_gpu_and_nic_under_one_switch(profile):
    engine = make_engine([(profile, 1)])
    devices(engine.allocate([claim("a", 1)])[0])  # gpu-0
    got = devices(engine.allocate([claim("b", 1, nics=1)])[0])
    # gpu-1 and the NIC on its switch (switch 0), not nic-0-after-gpu-1 by accident of order
    assert got == ["gpu-1", "nic-0"]
    got = devices(engine.allocate([claim("c", 1, nics=1)])[0])
    assert got == (["gpu-2", "nic-1"] if profile == "l40s-pcie" else ["gpu-2", "nic-2"])


def test_gpu_and_nic_first_fit_baseline_splits_them():
    engine = make_engine([("l40s-pcie", 1)], scoring=False)
    devices(engine.allocate([claim("a", 1)])[0])
    devices(engine.allocate([claim("n", 0, nics=1)])[0])  # nic-0 taken
    # Kubernetes' order: gpu-1 (switch 0) with nic-1 (switch 1)
    assert devices(engine.allocate([claim("b", 1, nics=1)])[0]) == ["gpu-1", "nic-1"]
    scored = make_engine([("l40s-pcie", 1)])
    devices(scored.allocate([claim("a", 1)])[0])
    devices(scored.allocate([claim("n", 0, nics=1)])[0])
    assert devices(scored.allocate([claim("b", 1, nics=1)])[0]) == ["gpu-2", "nic-1"]


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (2, ["gpu-0", "gpu-1"]),
        (4, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),
        (8, [f"gpu-{i}" for i in range(8)]),
    ],
)
def test_hgx_sizes(count, expected):
    engine = make_engine([("h100-sxm", 1)])
    assert devices(engine.allocate([claim("c", count)])[0]) == expected


def test_hgx_pair_after_fragmentation_keeps_one_switch():
    engine = make_engine([("h100-sxm", 1)])
    for name in ("a", "b", "c"):
        devices(engine.allocate([claim(name, 1)])[0])  # gpu-0, gpu-1 (fills switch 0), gpu-2
    assert engine.release("default/b")  # gpu-1 free again: switch 0 has one, switch 1 has one
    assert devices(engine.allocate([claim("pair", 2)])[0]) == ["gpu-4", "gpu-5"]


def test_a100_pairs_stay_on_one_nvlink_bridge():
    engine = make_engine([("a100-pcie", 1)])
    devices(engine.allocate([claim("a", 1)])[0])  # gpu-0
    assert devices(engine.allocate([claim("pair", 2)])[0]) == ["gpu-2", "gpu-3"]
    assert devices(engine.allocate([claim("b", 1)])[0]) == ["gpu-1"]  # completes bridge 0


def test_a100_strict_pair_with_match_attribute_takes_the_best_fit_bridge():
    engine = make_engine([("a100-pcie", 1)])
    devices(engine.allocate([claim("a", 1)])[0])  # gpu-0; NUMA 1 untouched
    devices(engine.allocate([claim("b", 1)])[0])  # gpu-1
    # bridges 1 (NUMA 0), 2 and 3 (NUMA 1) are free: the fuller NUMA 0 first
    got = devices(engine.allocate([claim("pair", 2, match="dralloc.dev/nvlinkDomain")])[0])
    assert got == ["gpu-2", "gpu-3"]


@pytest.mark.parametrize(
    ("count", "expected"),
    [
        (1, ["gpu-0"]),
        (2, ["gpu-0", "gpu-1"]),
        (4, ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]),
    ],
)
def test_gb200_tray_sizes(count, expected):
    engine = make_engine([("gb200-nvl72", 2)])
    outcome = engine.allocate([claim("c", count)])[0]
    assert devices(outcome) == expected
    assert outcome.node == "gb200-nvl72-0"


def test_gb200_pair_after_fragmentation_stays_on_one_numa_node():
    engine = make_engine([("gb200-nvl72", 1)])
    devices(engine.allocate([claim("a", 1)])[0])  # gpu-0 (NUMA 0)
    assert devices(engine.allocate([claim("pair", 2)])[0]) == ["gpu-2", "gpu-3"]


def test_mig_slices_pack_onto_a_partitioned_gpu():
    engine = make_engine([("h100-sxm-mig", 1)])
    first = devices(engine.allocate([claim("m1", 1, mig="1g.10gb")])[0])
    second = devices(engine.allocate([claim("m2", 1, mig="1g.10gb")])[0])
    assert first[0].startswith("gpu-0-mig-") and second[0].startswith("gpu-0-mig-")
    # a whole GPU then skips the partitioned gpu-0, and the next 1g slice still packs onto gpu-0
    assert devices(engine.allocate([claim("whole", 1)])[0]) == ["gpu-1"]
    assert devices(engine.allocate([claim("m3", 1, mig="1g.10gb")])[0])[0].startswith("gpu-0-mig-")


def test_mig_packs_onto_the_gpu_already_partitioned_even_when_it_is_not_first():
    scored, plain = (
        make_engine([("h100-sxm-mig", 1)]),
        make_engine([("h100-sxm-mig", 1)], scoring=False),
    )
    for engine in (scored, plain):
        devices(engine.allocate([claim("w0", 1)])[0])  # whole gpu-0
        devices(engine.allocate([claim("m1", 1, mig="1g.10gb")])[0])  # a slice on gpu-1
        assert engine.release("default/w0")
    # Kubernetes' order opens gpu-0 again; scored packs gpu-1
    assert devices(plain.allocate([claim("m2", 1, mig="1g.10gb")])[0])[0].startswith("gpu-0-mig-")
    assert devices(scored.allocate([claim("m2", 1, mig="1g.10gb")])[0])[0].startswith("gpu-1-mig-")


def test_best_fit_node_keeps_a_whole_node_for_an_eight_gpu_claim():
    results = {}
    for scoring in (True, False):
        engine = make_engine([("h100-sxm", 2)], scoring=scoring)
        assert engine.allocate([claim("c1", 1)])[0].node == "h100-sxm-0"
        assert engine.allocate([claim("c2", 1)])[0].node == "h100-sxm-0"
        assert engine.allocate([claim("c3", 7)])[0].node == "h100-sxm-1"
        engine.release("default/c1")
        engine.release("default/c2")
        # node 0 is free again, node 1 has one GPU left
        single = engine.allocate([claim("c4", 1)])[0]
        big = engine.allocate([claim("big", 8)])[0]
        results[scoring] = (single.node, big.status)
    assert results[True] == ("h100-sxm-1", "allocated")
    assert results[False] == ("h100-sxm-0", "unsatisfiable")


def test_eight_gpu_claim_does_not_fit_a_tray_and_four_fill_one():
    engine = make_engine([("gb200-nvl72", 2)])
    assert engine.allocate([claim("big", 8)])[0].status == "unsatisfiable"
    assert engine.allocate([claim("a", 2)])[0].node == "gb200-nvl72-0"
    # best fit: the second pair completes tray 0 rather than opening tray 1
    assert engine.allocate([claim("b", 2)])[0].node == "gb200-nvl72-0"
    assert engine.allocate([claim("c", 4)])[0].node == "gb200-nvl72-1"


def test_single_gpu_claims_leave_nvlink_nodes_to_multi_gpu_claims():
    scored, plain = (
        make_engine([("h100-sxm", 1), ("l40s-pcie", 1)]),
        make_engine([("h100-sxm", 1), ("l40s-pcie", 1)], scoring=False),
    )
    for i in range(8):
        assert scored.allocate([claim(f"s{i}", 1)])[0].node == "l40s-pcie-0"  # any GPU will do: not NVLink
        assert plain.allocate([claim(f"s{i}", 1)])[0].node == "h100-sxm-0"  # Kubernetes' order: the first node
    assert scored.allocate([claim("nvlink8", 8, match="dralloc.dev/nvlinkDomain")])[0].status == "allocated"
    assert plain.allocate([claim("nvlink8", 8, match="dralloc.dev/nvlinkDomain")])[0].status == "unsatisfiable"


def test_strict_placement_fails_rather_than_cross_a_switch():
    engine = make_engine([("l40s-pcie", 1)])
    for i in range(8):
        devices(engine.allocate([claim(f"s{i}", 1)])[0])
    for i in (1, 3, 5, 7):
        engine.release(f"default/s{i}")  # one free GPU under each switch
    strict = engine.allocate([claim("strict", 2, match="dralloc.dev/pcieSwitch")])[0]
    assert strict.status == "unsatisfiable"
    assert devices(engine.allocate([claim("preferred", 2)])[0]) == ["gpu-1", "gpu-3"]  # same NUMA node: the best left
