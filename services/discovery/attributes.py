"""Every name discovery publishes, and the conversions of NVML values into DRA values.

GPU attributes follow NVIDIA's DRA driver (`gpu.nvidia.com`, unqualified in the
slice, so a selector reads `device.attributes['gpu.nvidia.com'].productName`),
plus the standard `resource.kubernetes.io/pciBusID` and `.../pcieRoot`.

NVIDIA's driver publishes no topology beyond `pcieRoot`, so the relations a
placement needs are published under dralloc's own domain, `dralloc.dev`, on
GPUs and NICs alike (one domain, so `matchAttribute` works across drivers):

- `dralloc.dev/numaNode` (int): the NUMA node from sysfs; absent when the
  kernel reports -1 (no NUMA information, as in the H200 VM capture).
- `dralloc.dev/pcieSwitch` (string): the PCIe switch the device hangs off,
  unique within the node (`<node>/<switch>`); absent when directly on a root.
- `dralloc.dev/nvlink` (bool): whether the GPU has active NVLink to another
  GPU (direct or through NVSwitch); absent when NVML cannot tell.
- `dralloc.dev/nvlinkDomain` (string): GPUs with the same value reach each
  other over NVLink (one NVSwitch fabric, or an NVLink-bridged pair). Node
  local domains are unique across nodes (`<node>/...`); a multi-node NVLink
  domain (a GB200 NVL72 rack) is shared by its nodes' GPUs (the rack, or from
  NVML the fabric clique). Absent for a GPU without NVLink.
- `dralloc.dev/linkSpeedGbps` (int), `dralloc.dev/productName` (string): a
  NIC's speed and model (DraNet has no attribute for either).
- `dralloc.dev/nvlinkClique` (string): the multi-node NVLink clique of GB200
  NVL72 racks, NVML's fabric info as `<clusterUuid>.<cliqueId>` (the form
  NVIDIA's ComputeDomains use); absent unless the fabric is up.
"""

from __future__ import annotations

import re

GPU_DRIVER = "gpu.nvidia.com"
NIC_DRIVER = "dra.net"
"""The NIC devices' driver: the Kubernetes DraNet driver, whose attribute names NICs follow
(`dra.net/ifName`, `pciAddress`, `numaNode`, `rdma`)."""

DRALLOC = "dralloc.dev"
STANDARD = "resource.kubernetes.io"

# NVIDIA's names (unqualified: the driver's own domain).
TYPE = "type"
UUID = "uuid"
PARENT_UUID = "parentUUID"
PROFILE = "profile"
PRODUCT_NAME = "productName"
BRAND = "brand"
ARCHITECTURE = "architecture"
CUDA_COMPUTE_CAPABILITY = "cudaComputeCapability"
DRIVER_VERSION = "driverVersion"
CUDA_DRIVER_VERSION = "cudaDriverVersion"

PCI_BUS_ID = f"{STANDARD}/pciBusID"
PCIE_ROOT = f"{STANDARD}/pcieRoot"

NUMA_NODE = f"{DRALLOC}/numaNode"
PCIE_SWITCH = f"{DRALLOC}/pcieSwitch"
NVLINK = f"{DRALLOC}/nvlink"
NVLINK_DOMAIN = f"{DRALLOC}/nvlinkDomain"
NVLINK_CLIQUE = f"{DRALLOC}/nvlinkClique"

# NIC attributes: DraNet's names in its own domain (unqualified), plus the shared ones above.
NIC_IF_NAME = "ifName"
NIC_PCI_ADDRESS = "pciAddress"
NIC_NUMA_NODE = "numaNode"
NIC_RDMA = "rdma"
NIC_LINK_SPEED = f"{DRALLOC}/linkSpeedGbps"
PRODUCT = f"{DRALLOC}/productName"

# Capacities. MIG capacities use NVIDIA's camelCase names; counters are DNS
# labels, so they carry the same names in kebab case (as NVIDIA derives them).
MEMORY = "memory"
MIG_CAPACITIES = ("multiprocessors", "copyEngines", "decoders", "encoders", "jpegEngines", "ofaEngines", "memory")

TAINT_UNHEALTHY = f"{GPU_DRIVER}/unhealthy"
"""Device taint key for a GPU the health check finds unhealthy; the value says why."""

# Node labels.
LABEL_HOSTNAME = "kubernetes.io/hostname"
LABEL_PRODUCT = "nvidia.com/gpu.product"
LABEL_CLIQUE = "nvidia.com/gpu.clique"
"""NVIDIA GPU feature discovery's label for the NVLink clique of a multi-node NVLink node."""
LABEL_RACK = f"{DRALLOC}/rack"
LABEL_PROFILE = f"{DRALLOC}/hardware-profile"

# NVML enums to the strings NVIDIA's driver publishes (go-nvlib's names).
BRANDS = {
    0: "Unknown",
    1: "Quadro",
    2: "Tesla",
    3: "NVS",
    4: "Grid",
    5: "GeForce",
    6: "Titan",
    7: "NvidiaVApps",
    8: "NvidiaVPC",
    9: "NvidiaVCS",
    10: "NvidiaVWS",
    11: "NvidiaCloudGaming",
    12: "QuadroRTX",
    13: "NvidiaRTX",
    14: "Nvidia",
    15: "GeForceRTX",
    16: "TitanRTX",
}
ARCHITECTURES = {
    2: "Kepler",
    3: "Maxwell",
    4: "Pascal",
    5: "Volta",
    6: "Turing",
    7: "Ampere",
    8: "Ada Lovelace",
    9: "Hopper",
    10: "Blackwell",
}

_LEADING_ZEROS = re.compile(r"^0+(?=\d)")


def semver(version: str) -> str | None:
    """A dotted version as a semantic version (`580.159.04` -> `580.159.4`, `9.0` -> `9.0.0`).

    DRA `version` attributes must be semver 2.0, which forbids leading zeros;
    the API server rejects `580.159.04` and CEL's `semver()` fails on it, so
    NVIDIA's driver normalises it the same way. None when not numeric.
    """
    parts = version.strip().split(".")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts):
        return None
    parts = [_LEADING_ZEROS.sub("", p) for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts)


def cuda_version(value: int) -> str:
    """NVML's CUDA driver version integer (13000, 12040) as semver (`13.0.0`, `12.4.0`)."""
    return f"{value // 1000}.{value % 1000 // 10}.0"


def pci_bus_id(nvml_bus_id: str) -> str:
    """NVML's `00000000:00:06.0` as the kernel's `0000:00:06.0` (what pciBusID holds)."""
    domain, _, rest = nvml_bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"


def pcie_root(sysfs_realpath: str) -> str | None:
    """The PCIe root complex (`pci0000:00`) from a device's resolved sysfs path.

    The same answer as Kubernetes' `deviceattribute` library: the first path
    element under `/sys/devices` that names a root complex.
    """
    for part in sysfs_realpath.split("/"):
        if part.startswith("pci") and ":" in part:
            return part
    return None


def label_value(value: str) -> str:
    """A string as a Kubernetes label value (`NVIDIA H200` -> `NVIDIA-H200`)."""
    return re.sub(r"[^A-Za-z0-9._-]+", "-", value).strip("-._")[:63]


def dns_label(value: str) -> str:
    """A string as a DNS label (lower case, `-` for anything else), for device and counter names."""
    return re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")[:63]
