"""An inventory as ResourceSlices: what a node publishes.

`build_slices(inventory, *, layout, generation)` is pure and deterministic (same
inventory, same slices, byte for byte), so the publisher can compare two scans
by their slices and bump the generation only when something changed.

MIG as partitionable devices (KEP 4815, NVIDIA's naming): a MIG-capable GPU
has one counter set, `gpu-<minor>-counter-set`, holding its engines
(`multiprocessors`, `copy-engines`, ..., `memory` in bytes, the maximum over
its profiles) and one counter per memory slice (`memory-slice-0` ... `-7`,
value 1). Every profile placement is a device (`gpu-0-mig-1g18gb-19-0`:
profile `1g.18gb`, GI profile id 19, placement start 0) that consumes its
profile's engines and the memory slices of its placement; the whole GPU
(`gpu-0`) consumes all of them. So an allocator that honours counters can
never hand out a whole GPU and a slice of it, or two overlapping placements.
Every possible placement is published whether or not MIG mode is on now, as
NVIDIA's driver does with dynamic MIG: creating the instance is the node
side's job once a claim is allocated. The whole GPU's `memory` capacity is
what NVML reports; its `memory` counter is the largest profile's (what the
partitions' counters are measured against).

Layouts:
- `"1.35"` (Kubernetes 1.35+, the default): counter sets live in their own
  slices (at most 8 sets each) and no slice mixes devices and counters;
  devices reference counter sets anywhere in the pool.
- `"1.34"`: a slice holds the counter sets its devices consume, so each
  partitionable GPU gets its own slice (an H200's 15 counters and 26 devices
  stay under the limits of 32 counters and 64 devices).
Either way a slice has at most 128 devices, 64 when any device in it consumes
counters or has taints, and every slice of the pool carries the same
generation and the pool's `resourceSliceCount`.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from dralloc.discovery import attributes as A
from dralloc.discovery.inventory import Gpu, MigProfile, Nic, NodeInventory
from dralloc.schemas.quantity import NANO, format_quantity
from dralloc.schemas.resource import (
    Counter,
    CounterSet,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceCounterConsumption,
    DeviceTaint,
    ObjectMeta,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)

Layout = Literal["1.34", "1.35"]
LAYOUTS: tuple[Layout, ...] = ("1.35", "1.34")

MAX_DEVICES = 128
MAX_DEVICES_WITH_COUNTERS_OR_TAINTS = 64
MAX_COUNTER_SETS = 8

_COUNTER_NAMES = {
    "multiprocessors": "multiprocessors",
    "copyEngines": "copy-engines",
    "decoders": "decoders",
    "encoders": "encoders",
    "jpegEngines": "jpeg-engines",
    "ofaEngines": "ofa-engines",
    "memory": "memory",
}


@dataclass(slots=True)
class _Group:
    """Devices that belong together (a GPU and its partitions) and the counter set they consume."""

    devices: list[Device]
    counter_set: CounterSet | None = None

    @property
    def limited(self) -> bool:
        return any(d.consumes_counters or d.taints for d in self.devices)


def build_slices(inventory: NodeInventory, *, layout: str = "1.35", generation: int = 1) -> list[ResourceSlice]:
    """The ResourceSlices this node publishes: GPU pool (`gpu.nvidia.com`) then NIC pool (`dra.net`).
    `layout` is any string (often a user's): ValueError unless it is one of LAYOUTS."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown slice layout {layout!r}: use one of {', '.join(LAYOUTS)}")
    gpu_groups = [_gpu_group(gpu, inventory) for gpu in inventory.gpus]
    nic_groups = [_Group([_nic_device(nic)]) for nic in inventory.nics]
    slices = _pool(inventory.node, A.GPU_DRIVER, "gpu", gpu_groups, layout, generation)
    slices += _pool(inventory.node, A.NIC_DRIVER, "nic", nic_groups, layout, generation)
    return slices


def stamp_generation(slices: list[ResourceSlice], generation: int) -> list[ResourceSlice]:
    """Set the pool generation of freshly built slices (in place; cheaper than building again)."""
    pools: dict[tuple[str, str], ResourcePool] = {}
    for s in slices:
        key = (s.spec.driver, s.spec.pool.name)
        if key not in pools:
            pools[key] = ResourcePool(name=s.spec.pool.name, generation=generation, resource_slice_count=s.spec.pool.resource_slice_count)
        s.spec.pool = pools[key]
    return slices


def slice_key(slice_: ResourceSlice) -> tuple[str, str, str]:
    """(driver, pool, slice name): a slice's identity."""
    return slice_.spec.driver, slice_.spec.pool.name, slice_.metadata.name


# --- devices -----------------------------------------------------------------------


def _string(value: str) -> DeviceAttribute:
    return DeviceAttribute(string=value)


def _common_attributes(gpu: Gpu, inventory: NodeInventory) -> dict[str, DeviceAttribute]:
    """Attributes a GPU and its MIG partitions share; a value the source lacks is left out."""
    attrs: dict[str, DeviceAttribute] = {}
    for key, value in (
        (A.PRODUCT_NAME, gpu.product_name),
        (A.BRAND, gpu.brand),
        (A.ARCHITECTURE, gpu.architecture),
        (A.PCI_BUS_ID, gpu.pci_bus_id),
        (A.PCIE_ROOT, gpu.pcie_root),
        (A.PCIE_SWITCH, gpu.pcie_switch),
        (A.NVLINK_DOMAIN, gpu.nvlink_domain),
        (A.NVLINK_CLIQUE, gpu.clique),
    ):
        if value is not None:
            attrs[key] = _string(value)
    for key, value in (
        (A.CUDA_COMPUTE_CAPABILITY, gpu.cuda_compute_capability),
        (A.DRIVER_VERSION, inventory.driver_version),
        (A.CUDA_DRIVER_VERSION, inventory.cuda_driver_version),
    ):
        if value is not None:
            attrs[key] = DeviceAttribute(version=value)
    if gpu.numa_node is not None and gpu.numa_node >= 0:
        attrs[A.NUMA_NODE] = DeviceAttribute(int=gpu.numa_node)
    if gpu.nvlink is not None:
        attrs[A.NVLINK] = DeviceAttribute(bool=gpu.nvlink)
    return attrs


def _counter_set_name(gpu: Gpu) -> str:
    return A.dns_label(f"{gpu.name}-counter-set")


@functools.lru_cache(maxsize=64)
def _gpu_counters(profiles: tuple[MigProfile, ...], memory_slices: int) -> dict[str, Counter]:
    """Everything a whole GPU has, as counters: the most any profile uses, plus each memory slice.

    Cached per profile table (shared, never mutated)."""
    counters: dict[str, Counter] = {}
    for capacity, counter in _COUNTER_NAMES.items():
        most = max(p.capacities[capacity] for p in profiles)
        if most:
            counters[counter] = Counter(value=_value(capacity, most))
    for i in range(memory_slices):
        counters[f"memory-slice-{i}"] = Counter(value="1")
    return counters


def _value(capacity: str, amount: int) -> str:
    return _bytes(amount) if capacity == A.MEMORY else str(amount)


def _taints(gpu: Gpu) -> list[DeviceTaint]:
    return [DeviceTaint(key=key, value=value, effect="NoSchedule") for key, value in gpu.taints]


def _gpu_group(gpu: Gpu, inventory: NodeInventory) -> _Group:
    common = _common_attributes(gpu, inventory)
    attrs = {A.TYPE: _string("gpu"), **({A.UUID: _string(gpu.uuid)} if gpu.uuid else {}), **common}
    capacity: dict[str, DeviceCapacity] = {}
    if gpu.memory_bytes is not None:
        capacity[A.MEMORY] = DeviceCapacity(value=_bytes(gpu.memory_bytes))
    taints = _taints(gpu)
    if not gpu.mig_profiles:
        return _Group([Device(name=gpu.name, attributes=attrs, capacity=capacity, taints=taints)])

    set_name = _counter_set_name(gpu)
    counters = _gpu_counters(gpu.mig_profiles, gpu.memory_slices)
    for cap, counter in _COUNTER_NAMES.items():
        if cap != A.MEMORY and counter in counters:
            capacity[cap] = DeviceCapacity(value=counters[counter].value)
    whole = Device(
        name=gpu.name,
        attributes=attrs,
        capacity=capacity,
        consumes_counters=[DeviceCounterConsumption(counter_set=set_name, counters=counters)],
        taints=taints,
    )
    devices = [whole]
    mig_common = {A.TYPE: _string("mig"), **({A.PARENT_UUID: _string(gpu.uuid)} if gpu.uuid else {}), **common}
    for profile in gpu.mig_profiles:
        mig_attrs = {**mig_common, A.PROFILE: _string(profile.name)}
        for name, part_capacity, consumes in _partitions(gpu.name, set_name, profile):
            devices.append(
                Device(
                    name=name,
                    attributes=mig_attrs,
                    capacity=part_capacity,
                    consumes_counters=consumes,
                    taints=taints,
                )
            )
    return _Group(devices, CounterSet(name=set_name, counters=counters))


@functools.lru_cache(maxsize=4096)
def _partitions(gpu_name: str, set_name: str, profile: MigProfile) -> list[tuple[str, dict, list]]:
    """(device name, capacity, counter consumption) per placement of a profile on one GPU.

    Identical for the same GPU name on every node, so built once: this is what
    makes a fleet of thousands of MIG nodes quick to simulate. The results are
    shared between devices and must not be mutated.
    """
    caps = profile.capacities
    capacity = {name: DeviceCapacity(value=_value(name, amount)) for name, amount in caps.items()}
    base = {_COUNTER_NAMES[name]: Counter(value=_value(name, amount)) for name, amount in caps.items() if amount}
    prefix = A.dns_label(profile.name.replace(".", ""))
    parts = []
    for start, size in profile.placements:
        consumed = {**base, **{f"memory-slice-{i}": Counter(value="1") for i in range(start, start + size)}}
        consumes = [DeviceCounterConsumption(counter_set=set_name, counters=consumed)]
        parts.append((f"{gpu_name}-mig-{prefix}-{profile.id}-{start}", capacity, consumes))
    return parts


def _nic_device(nic: Nic) -> Device:
    attrs: dict[str, DeviceAttribute] = {}
    for key, value in (
        (A.NIC_IF_NAME, nic.if_name),
        (A.NIC_PCI_ADDRESS, nic.pci_bus_id),
        (A.PCI_BUS_ID, nic.pci_bus_id),
        (A.PCIE_ROOT, nic.pcie_root),
        (A.PCIE_SWITCH, nic.pcie_switch),
        (A.PRODUCT, nic.product_name),
    ):
        if value is not None:
            attrs[key] = _string(value)
    if nic.numa_node is not None and nic.numa_node >= 0:
        attrs[A.NIC_NUMA_NODE] = attrs[A.NUMA_NODE] = DeviceAttribute(int=nic.numa_node)
    if nic.rdma is not None:
        attrs[A.NIC_RDMA] = DeviceAttribute(bool=nic.rdma)
    if nic.link_speed_gbps is not None:
        attrs[A.NIC_LINK_SPEED] = DeviceAttribute(int=nic.link_speed_gbps)
    return Device(name=nic.name, attributes=attrs)


# --- packing into slices ---------------------------------------------------------------


def _pack(groups: Iterable[_Group]) -> list[list[Device]]:
    """Devices into chunks under the per-slice limit, keeping a group together where it fits."""
    chunks: list[list[Device]] = []
    current: list[Device] = []
    current_limited = False
    for group in groups:
        limited = current_limited or group.limited
        limit = MAX_DEVICES_WITH_COUNTERS_OR_TAINTS if limited else MAX_DEVICES
        if current and len(current) + len(group.devices) > limit:
            chunks.append(current)
            current, limited = [], group.limited
            limit = MAX_DEVICES_WITH_COUNTERS_OR_TAINTS if limited else MAX_DEVICES
        for device in group.devices:
            if len(current) == limit:  # only a group larger than a whole slice gets here
                chunks.append(current)
                current = []
            current.append(device)
        current_limited = limited
    if current:
        chunks.append(current)
    return chunks


def _pool(node: str, driver: str, short: str, groups: list[_Group], layout: str, generation: int) -> list[ResourceSlice]:
    specs: list[tuple[list[Device], list[CounterSet]]] = []
    if layout == "1.34":
        plain = [g for g in groups if g.counter_set is None]
        for group in groups:
            if group.counter_set is not None:
                specs.append((group.devices, [group.counter_set]))
        specs += [(chunk, []) for chunk in _pack(plain)]
    else:
        sets = [g.counter_set for g in groups if g.counter_set is not None]
        specs += [([], sets[i : i + MAX_COUNTER_SETS]) for i in range(0, len(sets), MAX_COUNTER_SETS)]
        specs += [(chunk, []) for chunk in _pack(groups)]
    pool = ResourcePool(name=node, generation=generation, resource_slice_count=len(specs))
    return [
        ResourceSlice(
            metadata=ObjectMeta(name=f"{node}-{short}-{i}"),
            spec=ResourceSliceSpec(driver=driver, pool=pool, node_name=node, devices=devices, shared_counters=sets),
        )
        for i, (devices, sets) in enumerate(specs)
    ]


def _bytes(value: int) -> str:
    """A byte count as Kubernetes spells it (BinarySI: `150754820096` -> `143771Mi`)."""
    return format_quantity(value * NANO, "BinarySI")
