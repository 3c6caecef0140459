"""Discovery's published GPUs next to `nvidia-smi -q -x`: the rows the GPU check prints and asserts.

Pure (XML text in, rows out), so the comparison itself is tested offline on the
real H200 capture (tests/discovery/test_smi_compare.py).
"""

from __future__ import annotations

import xml.etree.ElementTree as ET

from dralloc.discovery import attributes as A
from dralloc.schemas.resource import ResourceSlice

Row = tuple[str, str, object, object]
"""(gpu name, field, nvidia-smi's value, discovery's value)."""


def attr(device, name):
    value = device.attributes.get(name)
    return None if value is None else next(v for v in (value.string, value.version, value.int, value.bool) if v is not None)


def _mib(quantity: str) -> int:
    for suffix, shift in (("Ti", 20), ("Gi", 10), ("Mi", 0)):
        if quantity.endswith(suffix):
            return int(quantity[: -len(suffix)]) << shift
    return int(quantity) >> 20


def compare(slices: list[ResourceSlice], smi_xml: str, compute_caps: dict[str, str]) -> tuple[list[Row], list[str]]:
    """Rows per GPU nvidia-smi reports, and problems that are not a row (a GPU missing on either side).

    `compute_caps`: pci bus id -> `9.0` from `nvidia-smi --query-gpu=pci.bus_id,compute_cap`
    (not in `-q -x`); a GPU without one shows `n/a` and is not compared.
    """
    log = ET.fromstring(smi_xml)
    devices = [d for s in slices for d in s.spec.devices]
    gpus = {d.name: d for d in devices if attr(d, A.TYPE) == "gpu"}
    rows: list[Row] = []
    problems: list[str] = []
    smi_gpus = log.findall("gpu")
    for g in smi_gpus:
        bus = A.pci_bus_id(g.get("id", ""))
        name = f"gpu-{int(g.findtext('minor_number', '-1'))}"
        device = gpus.get(name)
        if device is None:
            problems.append(f"nvidia-smi shows {name} ({bus}); discovery published {sorted(gpus)}")
            continue
        current_mig = (g.findtext("mig_mode/current_mig") or "N/A").strip()
        migs = [d for d in devices if attr(d, "parentUUID") is not None and attr(d, "parentUUID") == attr(device, A.UUID)]
        cap = compute_caps.get(bus)
        memory = device.capacity.get("memory")
        rows += [
            (name, "name / productName", g.findtext("product_name"), attr(device, A.PRODUCT_NAME)),
            (name, "uuid", g.findtext("uuid"), attr(device, A.UUID)),
            (name, "memory MiB", int(g.findtext("fb_memory_usage/total", "0").split()[0]), _mib(str(memory.value)) if memory else None),
            (name, "driverVersion", A.semver(log.findtext("driver_version", "")), attr(device, A.DRIVER_VERSION)),
            (name, "cudaDriverVersion", A.semver(log.findtext("cuda_version", "")), attr(device, A.CUDA_DRIVER_VERSION)),
            (name, "cudaComputeCapability", A.semver(cap) if cap else "n/a", attr(device, A.CUDA_COMPUTE_CAPABILITY)),
            (name, "pciBusID", bus, attr(device, A.PCI_BUS_ID)),
            (name, "architecture", (g.findtext("product_architecture") or "").lower(), (attr(device, A.ARCHITECTURE) or "").lower()),
            (name, "brand", (g.findtext("product_brand") or "").lower().replace(" ", ""), (attr(device, A.BRAND) or "").lower()),
            (name, f"MIG capable (mode {current_mig})", current_mig not in ("N/A", ""), bool(migs)),
        ]
    if len(smi_gpus) != len(gpus):
        problems.append(f"nvidia-smi shows {len(smi_gpus)} GPU(s), discovery published {len(gpus)}")
    return rows, problems


def disagreements(rows: list[Row]) -> list[Row]:
    return [r for r in rows if r[2] != "n/a" and r[2] != r[3]]


def table(rows: list[Row]) -> str:
    width = max((len(r[1]) for r in rows), default=5)
    lines = [f"{'gpu':6} {'field':{width}}  {'nvidia-smi -q -x':42}  {'discovery (NVML)':42}  agree"]
    bad = set(map(id, disagreements(rows)))
    for row in rows:
        name, field, expected, got = row
        lines.append(f"{name:6} {field:{width}}  {expected!s:42}  {got!s:42}  {'NO' if id(row) in bad else 'yes'}")
    return "\n".join(lines)
