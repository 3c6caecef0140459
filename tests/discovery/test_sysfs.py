"""NICs and PCIe switches from sysfs: a sysfs tree laid out in a temp dir as the kernel does it."""

from __future__ import annotations

import os
from pathlib import Path

from dralloc.discovery import attributes as A
from dralloc.discovery.inventory import NodeInventory
from dralloc.discovery.slices import build_slices
from dralloc.discovery.sysfs import pcie_switch, read_nics


def pci_device(sys: Path, *path: str, numa: str = "0") -> Path:
    device = sys.joinpath("devices", *path)
    device.mkdir(parents=True)
    (device / "numa_node").write_text(f"{numa}\n")
    return device


def interface(sys: Path, name: str, device: Path | None, speed: str | None = None) -> None:
    iface = sys / "class" / "net" / name
    iface.mkdir(parents=True)
    if device is not None:
        os.symlink(device, iface / "device")
    if speed is not None:
        (iface / "speed").write_text(f"{speed}\n")


def test_physical_nics_with_topology(tmp_path: Path) -> None:
    sys = tmp_path / "sys"
    # A ConnectX behind a PCIe switch (root port, upstream, downstream, device), with RDMA.
    cx = pci_device(sys, "pci0000:15", "0000:15:01.0", "0000:16:00.0", "0000:17:00.0", "0000:18:00.0", numa="1")
    (cx / "infiniband" / "mlx5_0").mkdir(parents=True)
    interface(sys, "ibp24s0", cx, speed="400000")
    # A NIC on a root port, link down (reading speed fails: no file here), no NUMA information.
    plain = pci_device(sys, "pci0000:00", "0000:00:03.0", numa="-1")
    interface(sys, "eth0", plain)
    interface(sys, "lo", None)  # virtual: no PCI device
    nics = read_nics("n1", sys)
    assert [(n.name, n.if_name, n.pci_bus_id, n.pcie_root, n.pcie_switch, n.numa_node, n.rdma, n.link_speed_gbps) for n in nics] == [
        ("nic-eth0", "eth0", "0000:00:03.0", "pci0000:00", None, None, False, None),
        ("nic-ibp24s0", "ibp24s0", "0000:18:00.0", "pci0000:15", "n1/0000:16:00.0", 1, True, 400),
    ]
    [s] = build_slices(NodeInventory(node="n1", nics=nics))
    cx_device = s.spec.devices[1]
    assert s.spec.driver == A.NIC_DRIVER
    assert cx_device.attributes["rdma"].bool is True and cx_device.attributes["numaNode"].int == 1
    assert cx_device.attributes[A.NUMA_NODE].int == 1 and cx_device.attributes[A.PCIE_ROOT].string == "pci0000:15"
    assert cx_device.attributes["ifName"].string == "ibp24s0"


def test_no_sysfs_no_nics(tmp_path: Path) -> None:
    assert read_nics("n", tmp_path / "missing") == []


def test_pcie_switch_from_path() -> None:
    assert pcie_switch("/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0") == "0000:16:00.0"
    assert pcie_switch("/sys/devices/pci0000:00/0000:00:06.0") is None  # the H200 VM: on the root
    assert pcie_switch("/sys/devices/virtual/net/lo") is None
