"""The real NVML path on a real NVIDIA GPU, checked against `nvidia-smi -q -x`.

Skipped (never passed) where no NVIDIA GPU is usable: NVML does not
initialise, or `nvidia-smi` is missing. Run it on a GPU machine with

    python -m pytest -q tests/gpu -s

It prints, per GPU, what discovery publishes next to what nvidia-smi reports
(name, UUID, memory, driver and CUDA versions, compute capability, PCI bus
id, MIG mode), and fails on any disagreement. It also records every NVML
answer and checks that replaying the recording publishes identical slices;
with ``DRALLOC_GPU_CAPTURE=PATH`` the recording is kept there (a new fixture).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from dralloc.discovery import attributes as A
from dralloc.discovery.nvml import NvmlUnavailable, PynvmlSource, read_inventory
from dralloc.discovery.record import RecordingSource
from dralloc.discovery.replay import ReplaySource
from dralloc.discovery.slices import build_slices

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "discovery"))
from discovery_checks import slice_problems  # noqa: E402
from smi_compare import compare, disagreements, table  # noqa: E402


@pytest.fixture(scope="module")
def nvml():
    if shutil.which("nvidia-smi") is None:
        pytest.skip("no nvidia-smi on PATH: no NVIDIA GPU here")
    try:
        source = RecordingSource(PynvmlSource())
    except NvmlUnavailable as exc:
        pytest.skip(f"NVML unavailable: {exc}")
    yield source
    source.close()


def smi(*args: str) -> str:
    return subprocess.run(["nvidia-smi", *args], capture_output=True, text=True, check=True, timeout=60).stdout


def test_nvml_inventory_matches_nvidia_smi(nvml) -> None:
    started = time.perf_counter()
    inventory = read_inventory(nvml, "gpu-check")
    scan_s = time.perf_counter() - started
    slices = build_slices(inventory)
    assert slice_problems(slices, "1.35") == []
    assert slice_problems(build_slices(inventory, layout="1.34"), "1.34") == []

    caps: dict[str, str] = {}
    try:
        for line in smi("--query-gpu=pci.bus_id,compute_cap", "--format=csv,noheader").splitlines():
            bus, cap = (x.strip() for x in line.split(","))
            caps[A.pci_bus_id(bus)] = cap
    except subprocess.CalledProcessError:
        pass  # an old nvidia-smi without compute_cap: that row shows n/a and is not compared
    rows, problems = compare(slices, smi("-q", "-x"), caps)

    for gpu in inventory.gpus:
        print(
            f"\n{gpu.name}: pcieRoot={gpu.pcie_root} numaNode={gpu.numa_node} pcieSwitch={gpu.pcie_switch} "
            f"nvlink={gpu.nvlink} nvlinkDomain={gpu.nvlink_domain} clique={gpu.clique} "
            f"MIG profiles={[p.name for p in gpu.mig_profiles]} taints={gpu.taints}"
        )
    print("\n" + table(rows))
    print(
        f"\nNVML scan: {scan_s * 1000:.1f} ms; {len(slices)} slice(s), "
        f"{sum(len(s.spec.devices) for s in slices)} device(s); driver {inventory.driver_version}, "
        f"CUDA {inventory.cuda_driver_version}"
    )
    assert problems == []
    assert rows and disagreements(rows) == []

    # The recording of this very scan replays to the same slices.
    recording = json.loads(json.dumps(nvml.capture))
    replayed = build_slices(read_inventory(ReplaySource(recording), "gpu-check"))
    assert msgspec.json.encode(replayed) == msgspec.json.encode(slices)
    keep = os.environ.get("DRALLOC_GPU_CAPTURE")
    if keep:
        nvml.save(keep)
        print(f"NVML answers recorded to {keep}")


def test_discover_command_uses_the_real_gpu(nvml) -> None:
    run = subprocess.run(
        [sys.executable, "-c", "from dralloc.cli import main; main()", "discover", "--node", "gpu-check", "-o", "json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert run.returncode == 0, run.stderr
    items = json.loads(run.stdout)["items"]
    names = [d["name"] for item in items for d in item["spec"].get("devices", [])]
    print(f"\ndralloc discover: {len(items)} slice(s): {names[:6]}{' ...' if len(names) > 6 else ''}")
    assert any(n.startswith("gpu-") for n in names)
