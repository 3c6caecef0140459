"""Engine benchmark workloads, built in memory, and the loop that measures them.

`dralloc bench engine --workload NAME` runs `measure(NAME)`:

- kube-perf-500: Kubernetes' scheduler_perf DRA shape. 500 nodes x 10 devices
  (attributes model, family, driverVersion, numa; capacity memory 1Gi), one
  class selecting the driver, 1-device claims until every device is taken
  (5,000 claims).
- gpu-fleet-10k: 10,000 nodes x 8 GPUs (80,000 devices) with NVIDIA DRA
  driver attributes (productName, architecture, cudaComputeCapability,
  driverVersion, uuid, index, pcieRoot, memory) and dralloc's
  `dralloc.dev/nvlinkDomain`: HGX H100 / H200 / A100 nodes (one NVSwitch
  domain of 8) and L40S nodes (PCIe, no NVLink). Claims of 1/2/4/8 GPUs, a
  third with selectors on memory / productName / cudaComputeCapability,
  multi-GPU claims with matchAttribute on the NVLink domain; claims until 90%
  of the GPUs have been asked for.

Claims are allocated one at a time; the engine picks the node. Reported:
claims/s, p50/p99 latency per claim, peak RSS, cold start (build the engine
from the objects and answer the first claim).
"""

from __future__ import annotations

import random
import resource
import sys
import time
from dataclasses import dataclass

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.memory import freeze_long_lived
from dralloc.schemas.resource import (
    CELDeviceSelector,
    Device,
    DeviceAttribute,
    DeviceCapacity,
    DeviceClaim,
    DeviceClass,
    DeviceClassSpec,
    DeviceConstraint,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    Node,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimSpec,
    ResourcePool,
    ResourceSlice,
    ResourceSliceSpec,
)


@dataclass(slots=True)
class Workload:
    name: str
    objects: list  # Nodes, DeviceClasses, ResourceSlices
    claims: list[ResourceClaim]
    devices: int


def _class(name: str, driver: str) -> DeviceClass:
    return DeviceClass(metadata=ObjectMeta(name=name), spec=DeviceClassSpec(selectors=[DeviceSelector(cel=CELDeviceSelector(expression=f'device.driver == "{driver}"'))]))


def _claim(name: str, cls: str, count: int, selectors: list[str] = (), match: str | None = None) -> ResourceClaim:
    request = DeviceRequest(
        name="gpus",
        exactly=ExactDeviceRequest(device_class_name=cls, count=count, selectors=[DeviceSelector(cel=CELDeviceSelector(expression=e)) for e in selectors]),
    )
    constraints = [DeviceConstraint(match_attribute=match)] if match else []
    return ResourceClaim(metadata=ObjectMeta(name=name, namespace="bench"), spec=ResourceClaimSpec(devices=DeviceClaim(requests=[request], constraints=constraints)))


def kube_perf_500() -> Workload:
    driver = "dra.example.com"
    objects: list = [_class("example", driver)]
    for n in range(500):
        node = f"node-{n:04d}"
        objects.append(Node(metadata=ObjectMeta(name=node, labels={"kubernetes.io/hostname": node})))
        devices = [
            Device(
                name=f"device-{d}",
                attributes={
                    "model": DeviceAttribute(string="model-a" if d % 2 else "model-b"),
                    "family": DeviceAttribute(string="family-x"),
                    "driverVersion": DeviceAttribute(version="1.2.3"),
                    "numa": DeviceAttribute(int=d % 2),
                },
                capacity={"memory": DeviceCapacity(value="1Gi")},
            )
            for d in range(10)
        ]
        objects.append(
            ResourceSlice(
                metadata=ObjectMeta(name=f"{node}-{driver}"),
                spec=ResourceSliceSpec(driver=driver, pool=ResourcePool(name=node, generation=1, resource_slice_count=1), node_name=node, devices=devices),
            )
        )
    claims = [_claim(f"claim-{i:05d}", "example", 1) for i in range(5000)]
    return Workload("kube-perf-500", objects, claims, 5000)


GPU_DRIVER = "gpu.nvidia.com"
NVLINK_DOMAIN = "dralloc.dev/nvlinkDomain"
_GPU_TYPES = [  # (productName, architecture, cudaComputeCapability, memory, NVLink)
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi", True),
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi", True),
    ("NVIDIA H200", "Hopper", "9.0.0", "141Gi", True),
    ("NVIDIA A100-SXM4-80GB", "Ampere", "8.0.0", "80Gi", True),
    ("NVIDIA L40S", "Ada Lovelace", "8.9.0", "48Gi", False),
]
_SELECTORS = [
    f'device.capacity["{GPU_DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0',
    f'device.attributes["{GPU_DRIVER}"].productName == "NVIDIA H100 80GB HBM3"',
    f'device.attributes["{GPU_DRIVER}"].cudaComputeCapability.isGreaterThan(semver("8.9.0"))',
]


def gpu_fleet_10k(nodes: int = 10_000, fill: float = 0.9, seed: int = 7) -> Workload:
    objects: list = [_class("gpu.nvidia.com", GPU_DRIVER)]
    for n in range(nodes):
        node = f"gpu-node-{n:05d}"
        product, arch, cc, memory, nvlink = _GPU_TYPES[n % len(_GPU_TYPES)]
        objects.append(Node(metadata=ObjectMeta(name=node, labels={"kubernetes.io/hostname": node, "nvidia.com/gpu.product": product.replace(" ", "-")})))
        devices = []
        for g in range(8):
            attributes = {
                "productName": DeviceAttribute(string=product),
                "architecture": DeviceAttribute(string=arch),
                "cudaComputeCapability": DeviceAttribute(version=cc),
                "driverVersion": DeviceAttribute(version="550.54.15"),
                "uuid": DeviceAttribute(string=f"GPU-{n:05d}{g:02d}-0000-0000-0000-000000000000"),
                "index": DeviceAttribute(int=g),
                "resource.kubernetes.io/pcieRoot": DeviceAttribute(string=f"pci0000:{0x10 * (g // 2):02x}"),
            }
            if nvlink:
                attributes[NVLINK_DOMAIN] = DeviceAttribute(string=f"{node}/nvswitch-0")
            devices.append(Device(name=f"gpu-{g}", attributes=attributes, capacity={"memory": DeviceCapacity(value=memory)}))
        objects.append(
            ResourceSlice(
                metadata=ObjectMeta(name=f"{node}-gpu"),
                spec=ResourceSliceSpec(driver=GPU_DRIVER, pool=ResourcePool(name=node, generation=1, resource_slice_count=1), node_name=node, devices=devices),
            )
        )
    rng = random.Random(seed)
    claims: list[ResourceClaim] = []
    wanted, target = 0, int(nodes * 8 * fill)
    while wanted < target:
        count = rng.choices([1, 2, 4, 8], weights=[40, 25, 20, 15])[0]
        selectors = [_SELECTORS[len(claims) % 3]] if len(claims) % 3 == 0 else []
        match = NVLINK_DOMAIN if count > 1 else None
        claims.append(_claim(f"job-{len(claims):05d}", "gpu.nvidia.com", count, selectors, match))
        wanted += count
    return Workload("gpu-fleet-10k", objects, claims, nodes * 8)


WORKLOADS = {"kube-perf-500": kube_perf_500, "gpu-fleet-10k": gpu_fleet_10k}


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _percentile(sorted_values: list[float], q: float) -> float:
    if not sorted_values:
        return 0.0
    index = min(len(sorted_values) - 1, max(0, round(q * (len(sorted_values) - 1))))
    return sorted_values[index]


def measure(name: str, *, scoring: bool = True) -> dict:
    """Build the workload, load an engine, allocate every claim; the numbers as a dict.

    `scoring`: the engine's topology/best-fit placement (the default), or
    Kubernetes' first-fit order."""
    if name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    started = time.perf_counter()
    workload = WORKLOADS[name]()
    built = time.perf_counter()
    engine = Engine(scoring=scoring)
    for obj in workload.objects:
        engine.apply(obj)
    freeze_long_lived()  # as the allocator does once its engine is loaded
    latencies: list[float] = []
    statuses = {"allocated": 0, "unsatisfiable": 0, "error": 0}
    devices_taken = 0
    cold_start = 0.0
    run_started = time.perf_counter()
    for i, claim in enumerate(workload.claims):
        t0 = time.perf_counter()
        (outcome,) = engine.allocate([claim])
        t1 = time.perf_counter()
        if i == 0:
            cold_start = t1 - built
        latencies.append(t1 - t0)
        statuses[outcome.status] += 1
        if outcome.allocation is not None:
            devices_taken += len(outcome.allocation.devices.results)
    finished = time.perf_counter()
    ordered = sorted(latencies)
    return {
        "workload": name,
        "scoring": scoring,
        "claims": len(workload.claims),
        "allocated": statuses["allocated"],
        "unsatisfiable": statuses["unsatisfiable"],
        "errors": statuses["error"],
        "devices": workload.devices,
        "utilization": round(devices_taken / workload.devices, 4),
        "claims_per_second": round(len(latencies) / (finished - run_started), 1),
        "p50_ms": round(_percentile(ordered, 0.50) * 1000, 3),
        "p99_ms": round(_percentile(ordered, 0.99) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3) if ordered else 0.0,
        "cold_start_s": round(cold_start, 3),
        "build_s": round(built - started, 3),
        "peak_rss_mb": round(_peak_rss_mb(), 1),
    }
