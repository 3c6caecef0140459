"""What one node has: the plain data every discovery source produces.

NVML (`nvml.py`), a replayed capture (`replay.py`) and the simulated hardware
profiles (`profiles/`) all produce a `NodeInventory`; `slices.build_slices`
is the only reader. A field that the source could not answer is None, and
becomes "no attribute", never a guess.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dralloc.discovery.attributes import LABEL_HOSTNAME
from dralloc.schemas.resource import Node, ObjectMeta


@dataclass(frozen=True, slots=True)
class MigProfile:
    """One MIG GPU-instance profile of a GPU model, with its possible placements.

    `placements` are (start, size) over the GPU's memory slices, as NVML's
    `nvmlDeviceGetGpuInstancePossiblePlacements` and `nvidia-smi mig -lgipp`
    report them.
    """

    id: int
    name: str
    """Without the `MIG ` prefix: `1g.18gb`, `1g.18gb+me`."""
    multiprocessors: int
    copy_engines: int
    decoders: int
    encoders: int
    jpeg_engines: int
    ofa_engines: int
    memory_mib: int
    placements: tuple[tuple[int, int], ...]

    @property
    def capacities(self) -> dict[str, int]:
        """NVIDIA's capacity names and values for a partition of this profile (memory in bytes)."""
        return {
            "multiprocessors": self.multiprocessors,
            "copyEngines": self.copy_engines,
            "decoders": self.decoders,
            "encoders": self.encoders,
            "jpegEngines": self.jpeg_engines,
            "ofaEngines": self.ofa_engines,
            # NVML's memorySizeMB is MiB (nvml.h), as NVIDIA's driver reads it.
            "memory": self.memory_mib * 1024 * 1024,
        }


@dataclass(slots=True)
class Gpu:
    """One physical GPU. `name` is the published device name, stable across restarts."""

    name: str
    uuid: str | None = None
    minor: int | None = None
    product_name: str | None = None
    brand: str | None = None
    architecture: str | None = None
    cuda_compute_capability: str | None = None
    """Semver, `9.0.0`."""
    memory_bytes: int | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    pcie_switch: str | None = None
    nvlink: bool | None = None
    nvlink_domain: str | None = None
    clique: str | None = None
    mig_profiles: tuple[MigProfile, ...] = ()
    """Non-empty only when this GPU is published as partitionable (MIG capable and enabled for it)."""
    memory_slices: int = 8
    taints: list[tuple[str, str]] = field(default_factory=list)
    """(key, value) device taints, e.g. from the health check."""


@dataclass(slots=True)
class Nic:
    """A network interface, published by the NIC driver under the same PCIe root as its GPUs."""

    name: str
    if_name: str | None = None
    product_name: str | None = None
    pci_bus_id: str | None = None
    pcie_root: str | None = None
    numa_node: int | None = None
    pcie_switch: str | None = None
    rdma: bool | None = None
    link_speed_gbps: int | None = None


@dataclass(slots=True)
class NodeInventory:
    node: str
    gpus: list[Gpu] = field(default_factory=list)
    nics: list[Nic] = field(default_factory=list)
    driver_version: str | None = None
    """Semver, `580.159.4`."""
    cuda_driver_version: str | None = None
    """Semver, `13.0.0`."""
    labels: dict[str, str] = field(default_factory=dict)
    """Node labels beyond the hostname (rack, clique, profile)."""


def node_object(inventory: NodeInventory) -> Node:
    """The core/v1 Node the demo and benchmarks apply next to the node's slices."""
    labels = {LABEL_HOSTNAME: inventory.node, **inventory.labels}
    return Node(metadata=ObjectMeta(name=inventory.node, labels=labels))
