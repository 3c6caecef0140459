"""The NVML reader on the real H200 capture (NotSupported answers included), through the replay source."""

from __future__ import annotations

import copy
import json

import pytest
from discovery_checks import slice_problems

from dralloc.discovery import attributes as A
from dralloc.discovery.nvml import read_inventory
from dralloc.discovery.replay import ReplayError, ReplaySource
from dralloc.discovery.slices import build_slices


@pytest.fixture
def capture(shared_dir) -> dict:
    return json.loads((shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json").read_text())


def attrs(device) -> dict:
    return {k: next(x for x in (v.string, v.version, v.int, v.bool) if x is not None) for k, v in device.attributes.items()}


def test_real_h200_capture_gives_the_expected_slices(capture) -> None:
    slices = build_slices(read_inventory(ReplaySource(capture), "h200-vm"))
    assert slice_problems(slices, "1.35") == []
    assert [(s.metadata.name, len(s.spec.devices), [c.name for c in s.spec.shared_counters]) for s in slices] == [
        ("h200-vm-gpu-0", 0, ["gpu-0-counter-set"]),
        ("h200-vm-gpu-1", 26, []),
    ]
    gpu = slices[1].spec.devices[0]
    assert gpu.name == "gpu-0"
    # Exactly NVIDIA's names and types, and nothing NVML answered NotSupported for:
    # NUMA (sysfs -1), NVLink (every link NotSupported), fabric (state 0: no clique).
    assert attrs(gpu) == {
        "type": "gpu",
        "uuid": "GPU-292be603-ad89-3843-4b02-5c4ef53d13ec",
        "productName": "NVIDIA H200",
        "brand": "Nvidia",
        "architecture": "Hopper",
        "cudaComputeCapability": "9.0.0",
        "driverVersion": "580.159.4",  # NVML says 580.159.04: not semver, normalised as NVIDIA does
        "cudaDriverVersion": "13.0.0",
        "resource.kubernetes.io/pciBusID": "0000:00:06.0",
        "resource.kubernetes.io/pcieRoot": "pci0000:00",
    }
    assert gpu.attributes[A.DRIVER_VERSION].version == "580.159.4"
    assert gpu.capacity["memory"].value == "143771Mi"  # 150754820096 bytes
    assert gpu.capacity["multiprocessors"].value == "132"
    mig = next(d for d in slices[1].spec.devices if d.name == "gpu-0-mig-1g35gb-15-6")
    assert attrs(mig)["parentUUID"] == "GPU-292be603-ad89-3843-4b02-5c4ef53d13ec"
    assert attrs(mig)["profile"] == "1g.35gb" and attrs(mig)["type"] == "mig"
    assert mig.capacity["memory"].value == "33280Mi"
    assert set(mig.consumes_counters[0].counters) >= {"memory-slice-6", "memory-slice-7", "multiprocessors"}


def test_capture_in_1_34_layout_is_one_slice(capture) -> None:
    slices = build_slices(read_inventory(ReplaySource(capture), "h200-vm"), layout="1.34")
    assert len(slices) == 1 and len(slices[0].spec.devices) == 26 and len(slices[0].spec.shared_counters) == 1
    assert slice_problems(slices, "1.34") == []


def test_without_mig_the_gpu_is_a_plain_device(capture) -> None:
    slices = build_slices(read_inventory(ReplaySource(capture), "h200-vm", mig=False))
    assert [d.name for s in slices for d in s.spec.devices] == ["gpu-0"]
    assert not slices[0].spec.devices[0].consumes_counters


def test_every_query_failing_is_no_attribute_not_a_crash(capture) -> None:
    broken = copy.deepcopy(capture)
    device = broken["devices"][0]
    for key in list(device):
        if key != "index":
            device[key] = {"error": "NVMLError_Unknown: Unknown Error"}
    broken["driverVersion"] = {"error": "NVMLError_NotSupported: Not Supported"}
    del broken["cudaDriverVersion"]  # not captured: the same as not answered
    slices = build_slices(read_inventory(ReplaySource(broken), "n"))
    [gpu] = [d for s in slices for d in s.spec.devices]
    assert gpu.name == "gpu-nvml-index-0" and attrs(gpu) == {"type": "gpu"}
    assert slice_problems(slices, "1.35") == []


def test_minor_number_names_the_gpu_not_the_index(capture) -> None:
    moved = copy.deepcopy(capture)
    moved["devices"][0]["index"] = 3
    moved["devices"][0]["minor"] = 5
    inv = read_inventory(ReplaySource(moved), "n", mig=False)
    assert [g.name for g in inv.gpus] == ["gpu-5"]


def test_unhealthy_and_lost_gpus_are_tainted(capture) -> None:
    sick = copy.deepcopy(capture)
    sick["devices"][0]["remappedRows"] = [0, 1, 1, 0]
    second = copy.deepcopy(sick["devices"][0])
    second.update(minor=1, uuid="GPU-lost", name={"error": "NVMLError_GpuIsLost: GPU is lost"})
    sick["devices"].append(second)
    inv = read_inventory(ReplaySource(sick), "n", mig=False)
    assert [g.taints for g in inv.gpus] == [[(A.TAINT_UNHEALTHY, "row-remap-pending")], [(A.TAINT_UNHEALTHY, "gpu-lost")]]
    slices = build_slices(inv)
    assert [(t.key, t.value, t.effect) for d in slices[0].spec.devices for t in d.taints] == [
        ("gpu.nvidia.com/unhealthy", "row-remap-pending", "NoSchedule"),
        ("gpu.nvidia.com/unhealthy", "gpu-lost", "NoSchedule"),
    ]


def test_nvlink_and_fabric_answers_become_domain_and_clique(capture) -> None:
    """Two GPUs with P2P over NVLink and a completed fabric: one domain, the NVL72 clique."""
    two = copy.deepcopy(capture)
    a = two["devices"][0]
    a["nvlinks"] = [{"link": 0, "state": 1, "remoteBusId": "00000000:00:07.0"}]
    a["gpuFabricInfo"] = {"clusterUuid": "5b0f6a8e-1c0d-4d55-9a57-6a3f1f0d5d2a", "status": 0, "cliqueId": 7, "state": 3}
    b = copy.deepcopy(a)
    b.update(minor=1, uuid="GPU-b", pciInfo={"busId": "00000000:00:07.0"})
    b["nvlinks"] = [{"link": 0, "state": 1, "remoteBusId": "00000000:00:06.0"}]
    two["devices"].append(b)
    inv = read_inventory(ReplaySource(two), "n", mig=False)
    assert [g.nvlink for g in inv.gpus] == [True, True]
    assert {g.nvlink_domain for g in inv.gpus} == {"n/nvlink-gpu-0"}
    assert {g.clique for g in inv.gpus} == {"5b0f6a8e-1c0d-4d55-9a57-6a3f1f0d5d2a.7"}
    assert inv.labels[A.LABEL_CLIQUE] == "5b0f6a8e-1c0d-4d55-9a57-6a3f1f0d5d2a.7"
    # P2P status alone (NVSwitch systems, where remote links are switches) also joins a domain.
    for d in two["devices"]:
        d["nvlinks"] = [{"link": 0, "state": 1, "remoteBusId": "00000000:ff:00.0"}]
    two["pairs"] = [{"a": 0, "b": 1, "p2pNvlink": 0}]
    assert {g.nvlink_domain for g in read_inventory(ReplaySource(two), "n").gpus} == {"n/nvlink-gpu-0"}
    two["pairs"] = [{"a": 0, "b": 1, "p2pNvlink": 5}]
    # No P2P: the multi-node clique is the domain (GB200: GPUs meet through NVSwitch trays) ...
    assert [g.nvlink_domain for g in read_inventory(ReplaySource(two), "n").gpus] == [inv.gpus[0].clique] * 2
    # ... and without a fabric, links to switches alone make no domain.
    for d in two["devices"]:
        d["gpuFabricInfo"]["state"] = 1
    assert [(g.nvlink, g.nvlink_domain) for g in read_inventory(ReplaySource(two), "n").gpus] == [(True, None)] * 2


def test_bad_capture_files_are_clear_errors(tmp_path) -> None:
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(ReplayError, match="x.json: not JSON"):
        ReplaySource.from_file(tmp_path / "x.json")
    (tmp_path / "y.json").write_text("[1, 2]")
    with pytest.raises(ReplayError, match="y.json: not an NVML inventory"):
        ReplaySource.from_file(tmp_path / "y.json")
    with pytest.raises(ReplayError, match="cannot read"):
        ReplaySource.from_file(tmp_path / "missing.json")
    with pytest.raises(ReplayError, match="/dev/zero: cannot read: larger than 16 MiB"):  # (stat says 0 bytes; it never ends)
        ReplaySource.from_file("/dev/zero")
    (tmp_path / "latin.json").write_bytes(b'{"devices": [], "name": "\xe9"}')
    with pytest.raises(ReplayError, match="latin.json: cannot read: 'utf-8' codec"):
        ReplaySource.from_file(tmp_path / "latin.json")
    (tmp_path / "deep.json").write_text('{"devices": [' + "[" * 5000 + "]" * 5000 + "]}")  # json would recurse
    with pytest.raises(ReplayError, match="deep.json: nested more than 100 levels deep"):
        ReplaySource.from_file(tmp_path / "deep.json")


def test_a_gpu_lost_during_link_queries_does_not_stop_the_scan(capture) -> None:
    lost = copy.deepcopy(capture)
    lost["devices"][0]["nvlinks"] = [{"link": 0, "state": {"error": "NVMLError_GpuIsLost: GPU is lost"}}]
    lost["cudaDriverVersion"] = {"error": "NVMLError_GpuIsLost: GPU is lost"}
    inv = read_inventory(ReplaySource(lost), "n")
    assert [g.name for g in inv.gpus] == ["gpu-0"] and inv.gpus[0].nvlink is None and inv.cuda_driver_version is None
