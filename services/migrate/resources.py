"""Which extended resources ask for NVIDIA GPUs, and how many.

The device plugin's names: `nvidia.com/gpu` (whole GPUs), `nvidia.com/mig-<profile>`
(MIG partitions under the mixed strategy, e.g. `mig-1g.10gb`) and
`nvidia.com/gpu.shared` (time-slicing or MPS with renamed resources). Any other
`nvidia.com/` resource (`nvidia.com/gpumem`, HAMi's and others' extensions) is
unknown: migrating a container that asks for it would drop that constraint.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

GPU = "nvidia.com/gpu"
SHARED = "nvidia.com/gpu.shared"
MIG_PREFIX = "nvidia.com/mig-"
NVIDIA_PREFIX = "nvidia.com/"

# NVIDIA's DRA driver's DeviceClasses (github.com/NVIDIA/k8s-dra-driver-gpu, commit 22407113,
# deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml and deviceclass-mig.yaml):
# `device.attributes['gpu.nvidia.com'].type == 'gpu'` / `== 'mig'` on driver `gpu.nvidia.com`.
# (`vfio.gpu.nvidia.com`, type `vfio`, passes whole GPUs to VMs: no device-plugin resource maps to it.)
GPU_CLASS = "gpu.nvidia.com"
MIG_CLASS = "mig.nvidia.com"

# `mig-1g.10gb`, and the media-extension profiles `1g.10gb+me` (a resource name cannot
# hold `+`, so the device plugin spells it `.me`).
_MIG = re.compile(r"^nvidia\.com/mig-(\d+g\.\d+gb)(?:[.+](me))?\Z")
_OTHER_GPU = re.compile(r"^(amd\.com/gpu|gpu\.intel\.com/.+|[a-z0-9.-]+/gpu)\Z")
_INTEGER = re.compile(r"^[0-9]+\Z")

Kind = Literal["gpu", "mig", "shared"]


@dataclass(frozen=True, slots=True)
class GpuResource:
    """A GPU extended resource the migration understands."""

    name: str
    kind: Kind
    profile: str | None = None
    """The MIG profile (`1g.10gb`, `1g.10gb+me`) for kind `mig`."""

    @property
    def device_class(self) -> str:
        return MIG_CLASS if self.kind == "mig" else GPU_CLASS


def classify(name: str) -> GpuResource | Literal["unknown-nvidia", "other-gpu"] | None:
    """A known NVIDIA GPU resource, `unknown-nvidia` for another `nvidia.com/` name,
    `other-gpu` for another vendor's GPU (`amd.com/gpu`, ...), None for anything else."""
    if name == GPU:
        return GpuResource(name, "gpu")
    if name == SHARED:
        return GpuResource(name, "shared")
    mig = _MIG.match(name)
    if mig:
        return GpuResource(name, "mig", mig.group(1) + ("+me" if mig.group(2) else ""))
    if name.startswith(NVIDIA_PREFIX):
        return "unknown-nvidia"
    if _OTHER_GPU.match(name):
        return "other-gpu"
    return None


def count(value: Any) -> int | None:
    """An extended resource quantity as a device count; None when it is not a
    non-negative integer (Kubernetes only accepts whole numbers for extended resources)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if value >= 0 else None
    if isinstance(value, str) and _INTEGER.match(value.strip()):
        return int(value.strip())
    return None
