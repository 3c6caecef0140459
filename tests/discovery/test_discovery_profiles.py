"""Simulated nodes: every profile's slices are valid, consistent and carry the topology a placement needs."""

from __future__ import annotations

import itertools

import msgspec
import pytest
from discovery_checks import _amount, slice_problems

from dralloc.discovery import attributes as A
from dralloc.discovery.inventory import Gpu, NodeInventory, node_object
from dralloc.discovery.profiles import PROFILES, simulate
from dralloc.discovery.profiles.mig_tables import H200, parse_nvidia_smi
from dralloc.discovery.slices import build_slices


def devices(slices, driver=A.GPU_DRIVER):
    return [d for s in slices if s.spec.driver == driver for d in s.spec.devices]


def attr(device, name):
    value = device.attributes.get(name)
    if value is None:
        return None
    return next(v for v in (value.string, value.version, value.int, value.bool) if v is not None)


@pytest.mark.parametrize("layout", ["1.35", "1.34"])
@pytest.mark.parametrize("profile", sorted(PROFILES))
def test_every_profile_publishes_valid_consistent_slices(profile: str, layout: str) -> None:
    slices = build_slices(simulate(profile, "node-a"), layout=layout, generation=3)
    assert slice_problems(slices, layout) == []
    gpus = [d for d in devices(slices) if attr(d, A.TYPE) == "gpu"]
    assert len(gpus) == PROFILES[profile].gpu_count
    assert all(s.spec.node_name == "node-a" and s.spec.pool.generation == 3 for s in slices)


def test_slices_are_deterministic_and_unique_per_node() -> None:
    a = msgspec.json.encode(build_slices(simulate("h200-sxm-mig", "n1")))
    assert a == msgspec.json.encode(build_slices(simulate("h200-sxm-mig", "n1")))
    uuids = lambda node: {attr(d, A.UUID) for d in devices(build_slices(simulate("h100-sxm", node)))}  # noqa: E731
    assert not uuids("n1") & uuids("n2")


def test_h100_sxm_is_one_nvswitch_domain_with_nics_under_the_gpus_pcie_roots() -> None:
    slices = build_slices(simulate("h100-sxm", "n1"))
    gpus = devices(slices)
    nics = devices(slices, A.NIC_DRIVER)
    assert {attr(g, A.NVLINK_DOMAIN) for g in gpus} == {"n1/nvswitch"}
    assert {attr(g, A.PRODUCT_NAME) for g in gpus} == {"NVIDIA H100 80GB HBM3"}
    assert {attr(g, A.NUMA_NODE) for g in gpus} == {0, 1}
    assert len(nics) == 8
    for nic in nics:
        same_root = [g for g in gpus if attr(g, A.PCIE_ROOT) == attr(nic, A.PCIE_ROOT)]
        assert len(same_root) == 2 and all(attr(g, A.NUMA_NODE) == attr(nic, A.NUMA_NODE) for g in same_root)
    # NVIDIA's attribute types: versions are versions, memory is a capacity in bytes.
    g = gpus[0]
    assert g.attributes[A.CUDA_COMPUTE_CAPABILITY].version == "9.0.0"
    assert g.attributes[A.DRIVER_VERSION].version == "580.159.4"
    assert _amount(g.capacity[A.MEMORY].value) == 81559 * 2**20


def test_l40s_has_two_pcie_switches_per_numa_node_and_no_nvlink() -> None:
    gpus = devices(build_slices(simulate("l40s-pcie", "n1")))
    by_numa = {numa: {attr(g, A.PCIE_SWITCH) for g in gpus if attr(g, A.NUMA_NODE) == numa} for numa in (0, 1)}
    assert [len(v) for v in by_numa.values()] == [2, 2]
    assert not by_numa[0] & by_numa[1]
    assert all(attr(g, A.NVLINK) is False and attr(g, A.NVLINK_DOMAIN) is None for g in gpus)


def test_a100_pcie_is_nvlink_pairs() -> None:
    gpus = [d for d in devices(build_slices(simulate("a100-pcie", "n1"))) if attr(d, A.TYPE) == "gpu"]
    domains = [attr(g, A.NVLINK_DOMAIN) for g in gpus]
    assert len(set(domains)) == 4 and all(domains.count(d) == 2 for d in domains)


def test_gb200_trays_of_one_rack_share_clique_and_domain() -> None:
    a = simulate("gb200-nvl72", "t1", rack="rack-a")
    b = simulate("gb200-nvl72", "t2", rack="rack-a")
    c = simulate("gb200-nvl72", "t3", rack="rack-b")
    clique = lambda inv: {g.clique for g in inv.gpus}  # noqa: E731
    assert clique(a) == clique(b) != clique(c) and len(clique(a)) == 1
    assert {g.nvlink_domain for g in a.gpus} == {g.nvlink_domain for g in b.gpus}
    node = node_object(a)
    assert node.metadata.labels[A.LABEL_HOSTNAME] == "t1"
    assert node.metadata.labels[A.LABEL_RACK] == "rack-a"
    assert node.metadata.labels[A.LABEL_CLIQUE] == next(iter(clique(a)))
    gpu = devices(build_slices(a))[0]
    assert attr(gpu, A.NVLINK_CLIQUE) == next(iter(clique(a)))
    assert attr(gpu, A.ARCHITECTURE) == "Blackwell"


def test_h200_table_is_the_real_captured_table(shared_dir) -> None:
    text = (shared_dir / "fixtures/hardware/h200-vm/nvidia-smi-topo.txt").read_text()
    assert sorted(parse_nvidia_smi(text), key=lambda p: p.id) == sorted(H200, key=lambda p: p.id)


def test_mig_partitions_exclude_the_whole_gpu_and_overlapping_placements() -> None:
    slices = build_slices(simulate("h200-sxm-mig", "n1"))
    sets = {c.name: c for s in slices for c in s.spec.shared_counters}
    gpu0 = [d for d in devices(slices) if d.name == "gpu-0" or d.name.startswith("gpu-0-mig-")]
    names = {d.name for d in gpu0}
    # NVIDIA's naming: gpu-<minor>-mig-<profile without dots>-<GI profile id>-<placement start>
    assert {"gpu-0-mig-1g18gb-19-0", "gpu-0-mig-1g18gb-19-6", "gpu-0-mig-7g141gb-0-0", "gpu-0-mig-1g18gb-me-20-3"} <= names
    assert len(gpu0) == 1 + sum(len(p.placements) for p in H200)

    def fits(*chosen) -> bool:
        total: dict[str, int] = {}
        for d in chosen:
            for name, c in d.consumes_counters[0].counters.items():
                total[name] = total.get(name, 0) + _amount(c.value)
        have = sets[chosen[0].consumes_counters[0].counter_set].counters
        return all(total[n] <= _amount(have[n].value) for n in total)

    whole = next(d for d in gpu0 if d.name == "gpu-0")
    migs = [d for d in gpu0 if d is not whole]
    assert fits(whole)
    assert not any(fits(whole, m) for m in migs)
    slices_of = lambda d: {n for n in d.consumes_counters[0].counters if n.startswith("memory-slice-")}  # noqa: E731
    for a, b in itertools.combinations(migs, 2):
        if slices_of(a) & slices_of(b):
            assert not fits(a, b), (a.name, b.name)
    # The published table's maxima: seven 1g.18gb fit, an eighth memory slice is left for nothing else.
    sevens = [m for m in migs if m.name.startswith("gpu-0-mig-1g18gb-19-")]
    assert len(sevens) == 7 and fits(*sevens)
    assert fits(*[m for m in migs if m.name in ("gpu-0-mig-3g71gb-9-0", "gpu-0-mig-4g71gb-5-0")]) is False
    assert fits(*[m for m in migs if m.name in ("gpu-0-mig-3g71gb-9-4", "gpu-0-mig-4g71gb-5-0")])


def test_split_at_api_limits_keeps_resource_slice_count_right() -> None:
    many = NodeInventory(node="big", gpus=[Gpu(name=f"gpu-{i}", uuid=f"GPU-{i}") for i in range(300)])
    slices = build_slices(many)
    assert [len(s.spec.devices) for s in slices] == [128, 128, 44]
    assert slice_problems(slices, "1.35") == []
    for gpu in many.gpus[:70]:
        gpu.taints.append((A.TAINT_UNHEALTHY, "ecc-uncorrected-errors"))
    tainted = build_slices(many)
    assert slice_problems(tainted, "1.35") == []
    assert max(len(s.spec.devices) for s in tainted if any(d.taints for d in s.spec.devices)) <= 64
    assert {s.spec.pool.resource_slice_count for s in tainted} == {len(tainted)}
    # 20 MIG GPUs: 3 counter slices (8 sets each at most) and device slices of <= 64 in 1.35.
    mig = simulate("h200-sxm-mig", "m")
    mig.gpus = [Gpu(name=f"gpu-{i}", mig_profiles=H200) for i in range(20)]
    mig_slices = build_slices(mig)
    assert [len(s.spec.shared_counters) for s in mig_slices if s.spec.shared_counters] == [8, 8, 4]
    assert slice_problems(mig_slices, "1.35") == []
    assert slice_problems(build_slices(mig, layout="1.34"), "1.34") == []


def test_unknown_profile_and_layout_are_clear_errors() -> None:
    with pytest.raises(ValueError, match="unknown hardware profile 'h900'.*h100-sxm"):
        simulate("h900", "n")
    with pytest.raises(ValueError, match="layout '1.33'"):
        build_slices(simulate("h100-sxm", "n"), layout="1.33")  # type: ignore[arg-type]
