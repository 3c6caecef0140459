"""What Linux's sysfs says about PCI topology and network interfaces.

`pcie_switch` finds the PCIe switch above a device from its resolved sysfs
path; `read_nics` lists the node's physical network interfaces (those backed
by a PCI function) with their PCIe root, switch, NUMA node, RDMA capability
and link speed, so a real node can publish its NICs next to its GPUs as
DraNet would. Virtual interfaces (loopback, veth, bridges) have no PCI
device and are skipped.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

from dralloc.discovery import attributes as A
from dralloc.discovery.inventory import Nic

_PCI_ADDRESS = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")


def pcie_switch(realpath: str) -> str | None:
    """The upstream port of the PCIe switch above a device, from its sysfs path.

    `/sys/devices/pci0000:15/0000:15:01.0/0000:16:00.0/0000:17:00.0/0000:18:00.0`:
    root port 15:01.0, switch upstream port 16:00.0, downstream port 17:00.0,
    device 18:00.0. A device directly on a root port (as in a VM) has none.
    """
    parts = realpath.rstrip("/").split("/")
    roots = [i for i, p in enumerate(parts) if p.startswith("pci") and ":" in p]
    if not roots:
        return None
    below = parts[roots[0] + 1 :]
    return below[1] if len(below) >= 4 else None


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:  # absent, or EINVAL (the speed of a link that is down)
        return None


def read_nics(node: str, root: str | Path = "/sys") -> list[Nic]:
    """The physical network interfaces, named `nic-<ifname>` (stable as long as the interface name is)."""
    net = Path(root) / "class" / "net"
    nics: list[Nic] = []
    try:
        interfaces = sorted(os.listdir(net))
    except OSError:
        return nics
    for ifname in interfaces:
        device = net / ifname / "device"
        if not device.exists():
            continue
        real = os.path.realpath(device)
        pci = [p for p in real.split("/") if _PCI_ADDRESS.match(p)]
        if not pci:
            continue
        numa = _read(Path(real) / "numa_node")
        speed = _read(net / ifname / "speed")
        switch = pcie_switch(real)
        nics.append(
            Nic(
                name=f"nic-{A.dns_label(ifname)}",
                if_name=ifname,
                pci_bus_id=pci[-1],
                pcie_root=A.pcie_root(real),
                numa_node=int(numa) if numa and numa.lstrip("-").isdigit() and int(numa) >= 0 else None,
                pcie_switch=f"{node}/{switch}" if switch else None,
                rdma=(device / "infiniband").is_dir(),
                link_speed_gbps=int(speed) // 1000 if speed and speed.isdigit() and int(speed) > 0 else None,
            )
        )
    return nics
