"""Simulated nodes: hardware profiles that produce a `NodeInventory` without a GPU.

    from dralloc.discovery.profiles import PROFILES, simulate
    inventory = simulate("h100-sxm", "node-1")   # -> NodeInventory

`PROFILES` maps a profile name to its `HardwareProfile` (the data: GPU model,
how many, PCIe switches and roots, NUMA nodes, NVLink grouping, NICs). The
topology is modelled on the real systems: DGX/HGX H100 and H200 (8 SXM GPUs
on one NVSwitch fabric; each pair of GPUs shares a PCIe switch with two
ConnectX-7 NICs; two NUMA nodes), an 8x A100 PCIe server with NVLink bridges
between pairs, an 8x L40S PCIe server (two PCIe switches per NUMA node, two
GPUs and one NIC per switch, no NVLink) and a GB200 NVL72 compute tray (four
GPUs, one NIC per GPU, all 72 GPUs of a rack in one NVLink domain and one
fabric clique). Simulated values use the same names and formats as NVML
would give, so the same slice builder serves real and simulated nodes.

UUIDs are derived from the node name, so a simulated node publishes the same
slices every time (and two nodes never share a UUID).
"""

from __future__ import annotations

import uuid as _uuid
from dataclasses import dataclass

from dralloc.discovery import attributes as A
from dralloc.discovery.inventory import Gpu, MigProfile, Nic, NodeInventory
from dralloc.discovery.profiles import mig_tables

_UUID_NAMESPACE = _uuid.UUID("5b0f6a8e-1c0d-4d55-9a57-6a3f1f0d5d2a")


@dataclass(frozen=True, slots=True)
class GpuModel:
    product_name: str
    architecture: str
    compute_capability: str
    memory_bytes: int
    mig_profiles: tuple[MigProfile, ...] = ()


@dataclass(frozen=True, slots=True)
class Switch:
    """One PCIe switch: its root complex, NUMA node, and how many GPUs and NICs hang off it."""

    root_bus: int
    numa: int
    gpus: int
    nics: int


@dataclass(frozen=True, slots=True)
class HardwareProfile:
    name: str
    description: str
    gpu: GpuModel
    switches: tuple[Switch, ...]
    nvlink: str
    """`nvswitch` (all GPUs one domain), `pairs` (bridged pairs), `rack` (multi-node NVL72), `none`."""
    nic_product: str = "ConnectX-7"
    nic_speed_gbps: int = 400
    mig: bool = False
    """Publish MIG partitions (partitionable devices) for every GPU."""
    rack_size: int = 0
    """Nodes per NVLink rack (GB200 NVL72: 18 trays); 0 when NVLink stays in the node."""
    driver_version: str = "580.159.4"
    cuda_driver_version: str = "13.0.0"

    @property
    def gpu_count(self) -> int:
        return sum(s.gpus for s in self.switches)


H100 = GpuModel("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", 81559 * 2**20, mig_tables.H100_80GB)
H200 = GpuModel("NVIDIA H200", "Hopper", "9.0.0", 150754820096, mig_tables.H200)  # bytes: the real capture
A100 = GpuModel("NVIDIA A100 80GB PCIe", "Ampere", "8.0.0", 81920 * 2**20, mig_tables.A100_80GB)
L40S = GpuModel("NVIDIA L40S", "Ada Lovelace", "8.9.0", 46068 * 2**20)
GB200 = GpuModel("NVIDIA GB200", "Blackwell", "10.0.0", 189471 * 2**20)

# DGX/HGX: 4 PCIe switches, 2 per CPU socket, each with 2 GPUs and 2 NICs.
_HGX = (Switch(0x15, 0, 2, 2), Switch(0x37, 0, 2, 2), Switch(0x9A, 1, 2, 2), Switch(0xBC, 1, 2, 2))
# Generic PCIe server: 2 switches per NUMA node, 2 GPUs and 1 NIC each.
_PCIE = (Switch(0x16, 0, 2, 1), Switch(0x38, 0, 2, 1), Switch(0x98, 1, 2, 1), Switch(0xB8, 1, 2, 1))
# GB200 compute tray: 2 Grace CPUs, each with 2 GPUs and 2 NICs on its own root.
_GB200_TRAY = (Switch(0x00, 0, 1, 1), Switch(0x01, 0, 1, 1), Switch(0x08, 1, 1, 1), Switch(0x09, 1, 1, 1))

PROFILES: dict[str, HardwareProfile] = {
    p.name: p
    for p in (
        HardwareProfile("h100-sxm", "8x H100 SXM 80GB on NVSwitch, 8x 400G NICs, 2 NUMA nodes", H100, _HGX, "nvswitch"),
        HardwareProfile("h100-sxm-mig", "8x H100 SXM 80GB on NVSwitch with MIG partitions", H100, _HGX, "nvswitch", mig=True),
        HardwareProfile("h200-sxm-mig", "8x H200 SXM 141GB on NVSwitch with MIG partitions (real H200 MIG table)", H200, _HGX, "nvswitch", mig=True),
        HardwareProfile("a100-pcie", "8x A100 80GB PCIe in NVLink-bridged pairs with MIG partitions", A100, _PCIE, "pairs", nic_speed_gbps=200, mig=True),
        HardwareProfile("l40s-pcie", "8x L40S PCIe, 2 PCIe switches per NUMA node, 4x 200G NICs, no NVLink", L40S, _PCIE, "none", nic_speed_gbps=200),
        HardwareProfile("gb200-nvl72", "GB200 NVL72 compute tray: 4 GPUs, 4x 400G NICs; 18 trays per NVLink rack", GB200, _GB200_TRAY, "rack", rack_size=18),
    )
}


def simulate(profile: str, node: str, *, rack: str | None = None) -> NodeInventory:
    """The inventory of a simulated node of `profile` named `node`.

    `rack` names the NVLink rack for multi-node NVLink profiles (GB200): the
    nodes given the same rack share one NVLink domain and fabric clique.
    Default: `<node>-rack`, a rack of its own.
    """
    try:
        hw = PROFILES[profile]
    except KeyError:
        raise ValueError(f"unknown hardware profile {profile!r}; known: {', '.join(sorted(PROFILES))}") from None
    labels = {A.LABEL_PROFILE: hw.name, A.LABEL_PRODUCT: A.label_value(hw.gpu.product_name)}
    clique = None
    if hw.nvlink == "rack":
        rack = rack or f"{node}-rack"
        cluster = _uuid.uuid5(_UUID_NAMESPACE, f"rack/{rack}")
        clique = f"{cluster}.1"
        labels[A.LABEL_RACK] = rack
        labels[A.LABEL_CLIQUE] = clique

    inventory = NodeInventory(
        node=node,
        driver_version=hw.driver_version,
        cuda_driver_version=hw.cuda_driver_version,
        labels=labels,
    )
    minor = 0
    nic_index = 0
    for s, switch in enumerate(hw.switches):
        root = f"pci0000:{switch.root_bus:02x}"
        switch_id = f"{node}/pcie-switch-{s}"
        for g in range(switch.gpus):
            bus = switch.root_bus + 1 + g
            inventory.gpus.append(
                Gpu(
                    name=f"gpu-{minor}",
                    uuid=f"GPU-{_uuid.uuid5(_UUID_NAMESPACE, f'{node}/gpu/{minor}')}",
                    minor=minor,
                    product_name=hw.gpu.product_name,
                    brand="Nvidia",
                    architecture=hw.gpu.architecture,
                    cuda_compute_capability=hw.gpu.compute_capability,
                    memory_bytes=hw.gpu.memory_bytes,
                    pci_bus_id=f"0000:{bus:02x}:00.0",
                    pcie_root=root,
                    numa_node=switch.numa,
                    pcie_switch=switch_id,
                    nvlink=hw.nvlink != "none",
                    nvlink_domain=_nvlink_domain(hw.nvlink, node, minor, rack),
                    clique=clique,
                    mig_profiles=hw.gpu.mig_profiles if hw.mig else (),
                )
            )
            minor += 1
        for n in range(switch.nics):
            bus = switch.root_bus + 1 + switch.gpus + n
            inventory.nics.append(
                Nic(
                    name=f"nic-{nic_index}",
                    if_name=f"ibp{bus}s0",
                    product_name=hw.nic_product,
                    pci_bus_id=f"0000:{bus:02x}:00.0",
                    pcie_root=root,
                    numa_node=switch.numa,
                    pcie_switch=switch_id,
                    rdma=True,
                    link_speed_gbps=hw.nic_speed_gbps,
                )
            )
            nic_index += 1
    return inventory


def _nvlink_domain(kind: str, node: str, minor: int, rack: str | None) -> str | None:
    if kind == "nvswitch":
        return f"{node}/nvswitch"
    if kind == "pairs":
        return f"{node}/nvlink-pair-{minor // 2}"
    if kind == "rack":
        return f"{rack}/nvl72"
    return None
