"""GPU Feature Discovery node labels as CEL selectors on NVIDIA's DRA attributes.

Under the device plugin a pod picks its GPU model by node labels that GFD sets;
under DRA the claim's request picks devices by their attributes. Each label is
translated so that a claim lands exactly on the GPUs the labels selected:

| label | attribute | label value |
|---|---|---|
| `nvidia.com/gpu.product` | `productName` | the name with spaces as dashes (`NVIDIA-H100-80GB-HBM3`); GFD appends `-SHARED` under time-slicing |
| `nvidia.com/gpu.memory` | capacity `memory` | MiB, whole GPU (not expressible on a MIG device) |
| `nvidia.com/gpu.family` | `architecture` | lower case, dashes for spaces (`hopper`, `ada-lovelace`) |
| `nvidia.com/gpu.compute.major` | `cudaComputeCapability` | the major version (`9`) |
| `nvidia.com/cuda.driver.major` | `driverVersion` | the driver's major version (`580`) |

The attribute names and values are those NVIDIA's DRA driver publishes, checked
against github.com/NVIDIA/k8s-dra-driver-gpu (main, commit 22407113):
`cmd/gpu-kubelet-plugin/deviceinfo.go` (`GpuInfo.Attributes`: `type` `gpu`,
`uuid`, `productName` = NVML's device name, `brand`, `architecture`,
`cudaComputeCapability`, `driverVersion` and `cudaDriverVersion` as versions),
`partitions.go` (`fullGpuCapacity`: capacity `memory` in bytes, NVML's total),
`mig.go` (`CommonAttributesMig`: `type` `mig`, `parentUUID`, `profile` such as
`1g.10gb`, the parent's product, architecture and versions; `CommonCapacitiesMig`:
`multiprocessors`, `copyEngines`, ..., `memory` of the slice, not the GPU's) and
go-nvlib's `GetArchitectureAsString` (`Hopper`, `Ampere`, `Ada Lovelace`,
`Blackwell`: GFD's family label is the same in lower case with dashes).

Operators: `In`, `NotIn`, `Gt`, `Lt` (integers), `Exists` (every GPU has the
label: nothing to select). A requirement that cannot be expressed (an invalid
value, `DoesNotExist`, `Gt` on a name, memory for a MIG request) is left on the
pod, with a warning. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

PRODUCT = "nvidia.com/gpu.product"
MEMORY = "nvidia.com/gpu.memory"
FAMILY = "nvidia.com/gpu.family"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
DRIVER_MAJOR = "nvidia.com/cuda.driver.major"
LABELS = (PRODUCT, MEMORY, FAMILY, COMPUTE_MAJOR, DRIVER_MAJOR)

_ATTR = "device.attributes['gpu.nvidia.com']"
_MEMORY = "device.capacity['gpu.nvidia.com'].memory"
_LABEL_VALUE = re.compile(r"^[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?\Z")
_INT = re.compile(r"^[0-9]{1,9}\Z")
SHARED_SUFFIX = "-SHARED"


class Untranslatable(ValueError):
    """A requirement that has no CEL equivalent; the message says why."""


@dataclass(frozen=True, slots=True)
class Requirement:
    """One node-label requirement (a nodeSelector entry is `In [value]`)."""

    key: str
    operator: str
    values: tuple[str, ...] = ()

    def __str__(self) -> str:
        values = ", ".join(self.values)
        return f"{self.key} {self.operator} ({values})" if values else f"{self.key} {self.operator}"


def is_gfd(key: object) -> bool:
    return key in LABELS


def to_cel(req: Requirement, *, mig: bool) -> str | None:
    """The CEL expression selecting the devices whose node the requirement selected;
    None when every GPU passes (`Exists`). Raises Untranslatable."""
    op = req.operator
    if op == "Exists":
        return None
    if op == "DoesNotExist":
        raise Untranslatable("DoesNotExist on a GPU label selects nodes without such GPUs; no device attribute says that")
    if op in ("In", "NotIn"):
        if not req.values:
            raise Untranslatable(f"{op} needs at least one value")
        terms = [_equals(req.key, v, mig=mig) for v in req.values]
        joined = terms[0] if len(terms) == 1 else " || ".join(f"({t})" for t in terms)
        return joined if op == "In" else f"!({joined})"
    if op in ("Gt", "Lt"):
        if len(req.values) != 1 or not _INT.match(req.values[0]):
            raise Untranslatable(f"{op} needs one integer value")
        return _compare(req.key, op, int(req.values[0]), mig=mig)
    raise Untranslatable(f"unknown operator {op!r}")


def _value(value: str) -> str:
    if not isinstance(value, str) or not _LABEL_VALUE.match(value):
        raise Untranslatable(f"{value!r} is not a valid label value")
    return value


def _integer(key: str, value: str) -> int:
    if not _INT.match(_value(value)):
        raise Untranslatable(f"{key} holds an integer, not {value!r}")
    return int(value)


def _equals(key: str, value: str, *, mig: bool) -> str:
    if key == PRODUCT:
        name = _value(value)
        if name.endswith(SHARED_SUFFIX):  # GFD marks time-sliced GPUs; the product is the same
            name = name[: -len(SHARED_SUFFIX)]
        if "-MIG-" in name:
            raise Untranslatable("a single-strategy MIG product label names a partition layout, not a GPU model")
        return f"{_ATTR}.productName.replace(' ', '-') == '{name}'"
    if key == FAMILY:
        return f"{_ATTR}.architecture.lowerAscii().replace(' ', '-') == '{_value(value).lower()}'"
    if key == MEMORY:
        mib = _integer(key, value)
        _whole_gpu_only(mig)
        # GFD writes whole MiB (rounded down): the label is X exactly when X Mi <= memory < X+1 Mi
        return f"{_MEMORY}.compareTo(quantity('{mib}Mi')) >= 0 && {_MEMORY}.compareTo(quantity('{mib + 1}Mi')) < 0"
    attribute = {COMPUTE_MAJOR: "cudaComputeCapability", DRIVER_MAJOR: "driverVersion"}[key]
    return f"{_ATTR}.{attribute}.major() == {_integer(key, value)}"


def _compare(key: str, op: str, number: int, *, mig: bool) -> str:
    if key == MEMORY:
        _whole_gpu_only(mig)
        if op == "Gt":  # floor(MiB) > X  <=>  memory >= X+1 Mi
            return f"{_MEMORY}.compareTo(quantity('{number + 1}Mi')) >= 0"
        return f"{_MEMORY}.compareTo(quantity('{number}Mi')) < 0"
    if key in (COMPUTE_MAJOR, DRIVER_MAJOR):
        attribute = "cudaComputeCapability" if key == COMPUTE_MAJOR else "driverVersion"
        return f"{_ATTR}.{attribute}.major() {'>' if op == 'Gt' else '<'} {number}"
    raise Untranslatable(f"{op} compares numbers; {key} is a name")


def _whole_gpu_only(mig: bool) -> None:
    if mig:
        raise Untranslatable("a MIG device does not publish its GPU's total memory")


def conjunction(expressions: Sequence[str]) -> str:
    """Several expressions as one (for OR-ing node selector terms)."""
    return " && ".join(f"({e})" for e in expressions) if len(expressions) > 1 else expressions[0]


def admits(req: Requirement, *, product: str, architecture: str, compute_major: int) -> bool:
    """Whether a GPU model passes the requirement (for choosing MIG models when right-sizing);
    True for labels that do not name the model (memory, driver)."""
    values = tuple(req.values)
    if req.key == PRODUCT:
        actual = product.replace(" ", "-")
        values = tuple(v[: -len(SHARED_SUFFIX)] if v.endswith(SHARED_SUFFIX) else v for v in values)
    elif req.key == FAMILY:
        actual = architecture.lower().replace(" ", "-")
        values = tuple(v.lower() for v in values)
    elif req.key == COMPUTE_MAJOR:
        actual = str(compute_major)
    else:
        return True
    if req.operator == "In":
        return actual in values
    if req.operator == "NotIn":
        return actual not in values
    if req.operator in ("Gt", "Lt") and req.key == COMPUTE_MAJOR and len(values) == 1 and _INT.match(values[0]):
        return compute_major > int(values[0]) if req.operator == "Gt" else compute_major < int(values[0])
    return req.operator == "Exists"
