"""Engine benchmark workloads, built in memory, and the loop that measures them.

`dralloc bench engine --workload NAME [--seed N]` runs `measure(NAME)`; every
random choice comes from the seed, which the JSON names (`seed`; null where a
workload draws nothing at random):

- kube-perf-500: the Kubernetes-comparable shape (scheduler_perf's DRA test).
  500 nodes x 10 devices (attributes model, family, driverVersion, numa;
  capacity memory 1Gi), one class selecting the driver, 1-device claims until
  every device is taken (5,000 claims). Its only selector, the class's
  `device.driver == "..."`, is decided by the engine's literal shortcut and
  never reaches CEL: compare it with Kubernetes, not with what users send.
- gpu-fleet-10k: 10,000 nodes x 8 GPUs (80,000 devices) with NVIDIA DRA
  driver attributes (productName, architecture, cudaComputeCapability,
  driverVersion, uuid, index, pcieRoot, memory) and dralloc's
  `dralloc.dev/nvlinkDomain`: HGX H100 / H200 nodes (one NVSwitch domain of
  8), A100 PCIe nodes (NVLink-bridged pairs: a domain of 2, smaller than the
  node) and L40S nodes (PCIe, no NVLink). Claims of 1/2/4/8 GPUs; every third
  claim has a selector, rotating memory quantity / productName /
  cudaComputeCapability semver; multi-GPU claims match the NVLink domain;
  claims until 90% of the GPUs have been asked for.
- churn-mixed: what users send, at steady utilisation. 200 nodes of five
  hardware profiles from `dralloc.discovery.profiles` (H100 SXM, H200 SXM with
  MIG, A100 PCIe with MIG and NVLink pairs, L40S shared by memory, GB200 NVL72
  racks; 1,456 GPUs, ~37,000 devices with the MIG partitions). 4,000
  arrivals: whole GPUs with selectors that reach CEL (productName `in`,
  memory quantity, compute capability semver, `cel.bind`), NVLink-matched
  multi-GPU claims, MIG slices, shares of an L40S's memory. The fleet is
  filled to ~85% of its GPUs (GPU equivalents asked: a MIG slice or share
  counts 1/4), then every arrival follows the release of a random running
  claim (churn); the release is inside the measured time.
- frontier-250k: 31,250 nodes of mixed shapes (H100 SXM, L40S, A100 PCIe pairs
  with MIG, 100 GB200 NVL72 racks of 18 four-GPU trays): 242,800 GPUs; claims
  as gpu-fleet-10k's until 90% of the GPUs are asked for. `frontier(gpus=N)`
  is the same mix at another size (`dralloc bench scale`). Its objects are
  built as the engine loads them (`LazyFleet`), as an allocator decodes them
  off the bus, so the peak RSS is what the engine keeps, not the builder's
  250,000 GPUs' worth of objects at once; the build's time is left out of
  the cold start (`build_s`).

Claims are allocated one at a time; the engine picks the node. Reported:
claims/s, p50/p99 latency per claim, peak RSS (and per GPU), cold start
(build the engine from the objects and answer the first claim); after the
run (all but frontier-250k), what its CEL selectors cost per device and what
refusing a cost bomb takes (`cel`, `cel_costs`).
"""

from __future__ import annotations

import gc
import itertools
import math
import random
import resource
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dralloc.allocator.engine import CelError, Engine, compile_selector, compiled, device_env
from dralloc.allocator.engine.memory import Collector
from dralloc.discovery.fleet import FleetSpec, build_fleet, fleet_nodes, load_fleet
from dralloc.schemas.resource import (
    CapacityRequestPolicy,
    CapacityRequestPolicyRange,
    CapacityRequirements,
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
from dralloc.stats import percentile


@dataclass(slots=True)
class Workload:
    name: str
    objects: Iterable  # Nodes, DeviceClasses, ResourceSlices (frontier: a LazyFleet, built as it is iterated)
    claims: list[ResourceClaim]
    devices: int
    """Physical devices (GPUs) the fleet has: what utilisation is measured against."""
    seed: int | None = None
    shape: str = ""
    """What the workload is comparable with, in words (the JSON's `shape`)."""
    churn_after: int | None = None
    """Churn: from this arrival on, each arrival follows the release of a random running claim."""
    extra: dict = field(default_factory=dict)
    consume: bool = False
    """`measure` drops each claim from `claims` once it is decided (the engine keeps what it needs of
    it), so the peak RSS does not count the bench's own copies of decided claims (frontier: 77,762
    claims, ~90 MB at 250,000 GPUs); the list is left holding None."""


def _class(name: str, driver: str, expression: str | None = None) -> DeviceClass:
    expression = expression or f'device.driver == "{driver}"'
    return DeviceClass(metadata=ObjectMeta(name=name), spec=DeviceClassSpec(selectors=[DeviceSelector(cel=CELDeviceSelector(expression=expression))]))


def _claim(name: str, cls: str, count: int, selectors: list[str] = (), match: str | None = None, capacity: dict[str, str] | None = None) -> ResourceClaim:
    request = DeviceRequest(
        name="gpus",
        exactly=ExactDeviceRequest(
            device_class_name=cls,
            count=count,
            selectors=[DeviceSelector(cel=CELDeviceSelector(expression=e)) for e in selectors],
            capacity=CapacityRequirements(requests=capacity) if capacity else None,
        ),
    )
    constraints = [DeviceConstraint(match_attribute=match)] if match else []
    return ResourceClaim(
        metadata=ObjectMeta(name=name, namespace="bench"), spec=ResourceClaimSpec(devices=DeviceClaim(requests=[request], constraints=constraints))
    )


KUBE_PERF_SHAPE = "Kubernetes-comparable: scheduler_perf's DRA shape; the class selector is decided by the literal shortcut, never by CEL"


def kube_perf_500(seed: int | None = None) -> Workload:
    """The Kubernetes-comparable shape; `seed` is accepted and unused (nothing is random)."""
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
    return Workload("kube-perf-500", objects, claims, 5000, seed=None, shape=KUBE_PERF_SHAPE)


GPU_DRIVER = "gpu.nvidia.com"
NVLINK_DOMAIN = "dralloc.dev/nvlinkDomain"
_GPU_TYPES = [  # (productName, architecture, cudaComputeCapability, memory, NVLink: nvswitch | pairs | none)
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi", "nvswitch"),
    ("NVIDIA H100 80GB HBM3", "Hopper", "9.0.0", "80Gi", "nvswitch"),
    ("NVIDIA H200", "Hopper", "9.0.0", "141Gi", "nvswitch"),
    ("NVIDIA A100 80GB PCIe", "Ampere", "8.0.0", "80Gi", "pairs"),
    ("NVIDIA L40S", "Ada Lovelace", "8.9.0", "48Gi", "none"),
]
SELECTORS = {
    "memory": f'device.capacity["{GPU_DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0',
    "productName": f'device.attributes["{GPU_DRIVER}"].productName == "NVIDIA H100 80GB HBM3"',
    "cudaComputeCapability": f'device.attributes["{GPU_DRIVER}"].cudaComputeCapability.isGreaterThan(semver("8.9.0"))',
}
_ROTATION = list(SELECTORS.values())


def _fleet_claims(rng: random.Random, gpus: int, fill: float) -> list[ResourceClaim]:
    """gpu-fleet-10k's claims: 1/2/4/8 GPUs; every third claim has a selector, the three kinds in
    turn; multi-GPU claims match the NVLink domain; until `fill` of the GPUs are asked for."""
    claims: list[ResourceClaim] = []
    wanted, target = 0, int(gpus * fill)
    while wanted < target:
        count = rng.choices([1, 2, 4, 8], weights=[40, 25, 20, 15])[0]
        i = len(claims)
        selectors = [_ROTATION[(i // 3) % len(_ROTATION)]] if i % 3 == 0 else []
        match = NVLINK_DOMAIN if count > 1 else None
        claims.append(_claim(f"job-{i:06d}", "gpu.nvidia.com", count, selectors, match))
        wanted += count
    return claims


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
            if nvlink == "nvswitch":
                attributes[NVLINK_DOMAIN] = DeviceAttribute(string=f"{node}/nvswitch-0")
            elif nvlink == "pairs":  # NVLink bridges join pairs: a domain smaller than the node
                attributes[NVLINK_DOMAIN] = DeviceAttribute(string=f"{node}/nvlink-pair-{g // 2}")
            devices.append(Device(name=f"gpu-{g}", attributes=attributes, capacity={"memory": DeviceCapacity(value=memory)}))
        objects.append(
            ResourceSlice(
                metadata=ObjectMeta(name=f"{node}-gpu"),
                spec=ResourceSliceSpec(driver=GPU_DRIVER, pool=ResourcePool(name=node, generation=1, resource_slice_count=1), node_name=node, devices=devices),
            )
        )
    claims = _fleet_claims(random.Random(seed), nodes * 8, fill)
    return Workload(
        "gpu-fleet-10k", objects, claims, nodes * 8, seed=seed, shape="dralloc's GPU fleet: NVIDIA driver attributes, NVLink domains, selectors in CEL"
    )


# --- fleets of hardware profiles (churn-mixed, frontier) ----------------------------------

GPU_CLASS = f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'gpu'"
MIG_CLASS = f"device.driver == '{GPU_DRIVER}' && device.attributes['{GPU_DRIVER}'].type == 'mig'"
SHARED_PRODUCT = "NVIDIA L40S"


def _profile_objects(pairs: list[tuple[str, int]], *, shared: str | None = None) -> tuple[list, int]:
    """Nodes and slices of a fleet of hardware profiles, the GPU and MIG classes; and its GPU count.

    `shared`: the product whose GPUs allow multiple allocations, their memory
    consumable in steps of 1Gi (a share), as a driver with KEP-5075 publishes it."""
    spec = load_fleet(pairs)
    objects: list = [_class("gpu.nvidia.com", GPU_DRIVER, GPU_CLASS), _class("mig.nvidia.com", GPU_DRIVER, MIG_CLASS)]
    objects += fleet_nodes(spec)
    gpus = 0
    for _, slices in build_fleet(spec):
        for slice_ in slices:
            if slice_.spec.driver != GPU_DRIVER:
                objects.append(slice_)
                continue
            devices = slice_.spec.devices or []
            gpus += sum(1 for d in devices if d.attributes["type"].string == "gpu")
            if shared is not None and any(d.attributes["productName"].string == shared for d in devices):
                devices = [_shareable(d) for d in devices]
                slice_ = msgspec.structs.replace(slice_, spec=msgspec.structs.replace(slice_.spec, devices=devices))
            objects.append(slice_)
    return objects, gpus


def _shareable(device: Device) -> Device:
    memory = device.capacity["memory"].value
    policy = CapacityRequestPolicy(default=memory, valid_range=CapacityRequestPolicyRange(min="1Gi", step="1Gi"))
    capacity = {**device.capacity, "memory": DeviceCapacity(value=memory, request_policy=policy)}
    return msgspec.structs.replace(device, capacity=capacity, allow_multiple_allocations=True)


CHURN_BLOCK = [("h100-sxm", 30), ("h200-sxm-mig", 20), ("a100-pcie", 20), ("l40s-pcie", 12), ("gb200-nvl72", 18)]
"""100 nodes, 728 GPUs, one NVL72 rack; churn-mixed has 2 blocks (200 nodes, 1,456 GPUs): its MIG
slices (~50 devices per GPU) make the engine's cold start ~80 ms per node today, so more blocks
take minutes to load."""

CHURN_SELECTORS = {
    "productName": f'device.attributes["{GPU_DRIVER}"].productName in ["NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA GB200"]',
    "memory": f'device.capacity["{GPU_DRIVER}"].memory.compareTo(quantity("80Gi")) >= 0',
    "cudaComputeCapability": f'device.attributes["{GPU_DRIVER}"].cudaComputeCapability.isGreaterThan(semver("8.9.0"))',
    "cel.bind": f'cel.bind(a, device.attributes["{GPU_DRIVER}"], a.architecture == "Hopper" || (a.architecture == "Blackwell" && a.cudaComputeCapability.isGreaterThan(semver("9.0.0"))))',
}
MIG_SELECTORS = {
    "mig-small": f'device.capacity["{GPU_DRIVER}"].memory.compareTo(quantity("10Gi")) >= 0 && device.capacity["{GPU_DRIVER}"].memory.compareTo(quantity("20Gi")) <= 0',
    "mig-half": f'device.attributes["{GPU_DRIVER}"].profile in ["3g.40gb", "3g.71gb"]',
}
CHURN_KINDS = ("whole", "nvlink", "mig", "share")


def churn_kind(claim: ResourceClaim) -> str:
    """Which of CHURN_KINDS a churn-mixed claim is (read from the claim, for tests and the JSON)."""
    request = claim.spec.devices.requests[0].exactly
    if request.device_class_name == "mig.nvidia.com":
        return "mig"
    if request.capacity is not None:
        return "share"
    return "nvlink" if claim.spec.devices.constraints else "whole"


def churn_mixed(seed: int = 7, arrivals: int = 4_000, fill: float = 0.85, blocks: int = 2) -> Workload:
    """Five node shapes (`blocks` x CHURN_BLOCK); whole, NVLink-matched, MIG and shared claims;
    churn after the fill."""
    rng = random.Random(seed)
    objects, gpus = _profile_objects([(profile, count * blocks) for profile, count in CHURN_BLOCK], shared=SHARED_PRODUCT)
    selectors = list(CHURN_SELECTORS.values())
    mig = list(MIG_SELECTORS.values())
    claims: list[ResourceClaim] = []
    asked, churn_after = 0.0, None
    for i in range(arrivals):
        name = f"churn-{i:06d}"
        kind = rng.choices(CHURN_KINDS, weights=[40, 25, 20, 15])[0]
        if kind == "whole":
            claims.append(_claim(name, "gpu.nvidia.com", 1, [rng.choice(selectors)] if rng.random() < 0.5 else []))
            size = 1.0
        elif kind == "nvlink":
            count = rng.choice([2, 2, 4, 8])
            claims.append(_claim(name, "gpu.nvidia.com", count, [rng.choice(selectors)] if rng.random() < 0.25 else [], NVLINK_DOMAIN))
            size = float(count)
        elif kind == "mig":
            claims.append(_claim(name, "mig.nvidia.com", 1, [rng.choice(mig)]))
            size = 0.25
        else:
            memory = rng.choice(["8Gi", "12Gi", "24Gi"])
            claims.append(
                _claim(name, "gpu.nvidia.com", 1, [f'device.attributes["{GPU_DRIVER}"].productName == "{SHARED_PRODUCT}"'], capacity={"memory": memory})
            )
            size = 0.25
        asked += size
        if churn_after is None and asked >= gpus * fill:
            churn_after = i + 1
    return Workload(
        "churn-mixed",
        objects,
        claims,
        gpus,
        seed=seed,
        shape="what users send: CEL selectors, NVLink pairs and racks, MIG, shares, churn at steady utilisation",
        churn_after=churn_after if churn_after is not None else len(claims),
    )


FRONTIER_NODES = 31_250
FRONTIER_RACKS = 100


def frontier_fleet(nodes: int) -> list[tuple[str, int]]:
    """The frontier mix for `nodes` nodes: GB200 NVL72 trays in whole racks of 18 (100 racks at
    31,250 nodes), then H100 SXM 68%, L40S 30%, A100 PCIe 2% (NVLink pairs, MIG partitions
    published: ~52 devices per GPU, so a few percent keeps the fleet's device count honest
    without making MIG its bulk). Profiles as `dralloc.discovery.profiles` has them."""
    racks = max(1, round(nodes * FRONTIER_RACKS / FRONTIER_NODES))
    rest = nodes - racks * 18
    h100, l40s = int(rest * 0.68), int(rest * 0.30)
    return [("h100-sxm", h100), ("l40s-pcie", l40s), ("a100-pcie", rest - h100 - l40s), ("gb200-nvl72", racks * 18)]


FRONTIER_GPUS = 242_800
"""GPUs of the 31,250-node frontier fleet (GB200 trays have 4)."""


def frontier_nodes_for(gpus: int) -> int:
    """Nodes of the frontier mix that hold about `gpus` GPUs."""
    return max(19, round(gpus * FRONTIER_NODES / FRONTIER_GPUS))


class LazyFleet:
    """`_profile_objects`' objects, in the same order, built as they are iterated (each pass builds
    them again): the allocator decodes a fleet off the bus slice by slice and the engine keeps each
    slice as it is applied (shared with its namesakes: engine/repeats.py), so building all 250,000
    GPUs' objects first made the bench's peak RSS the builder's, not the engine's. The time spent
    building is counted apart (`build_s`, `build_cpu_s`: `measure` takes it out of the cold start)."""

    def __init__(self, pairs: list[tuple[str, int]]) -> None:
        self.spec = load_fleet(pairs)
        self.build_s = self.build_cpu_s = 0.0
        per_profile: dict[str, int] = {}
        for node in self.spec.nodes:  # GPUs of one node of each profile
            if node.profile not in per_profile:
                per_profile[node.profile] = sum(_gpus_of(slice_) for _, slices in build_fleet(FleetSpec((node,), self.spec.layout)) for slice_ in slices)
        self.gpus = sum(per_profile[node.profile] for node in self.spec.nodes)

    def __iter__(self):  # noqa: ANN204 - a generator of DeviceClasses, Nodes and ResourceSlices
        wall, cpu = time.perf_counter(), time.process_time()
        batch: list = [_class("gpu.nvidia.com", GPU_DRIVER, GPU_CLASS), _class("mig.nvidia.com", GPU_DRIVER, MIG_CLASS)]
        batch += fleet_nodes(self.spec)
        nodes = iter(self.spec.nodes)
        while True:
            self.build_s += time.perf_counter() - wall
            self.build_cpu_s += time.process_time() - cpu
            yield from batch  # (the consumer's time, applying them, is not counted here)
            wall, cpu = time.perf_counter(), time.process_time()
            node = next(nodes, None)
            if node is None:
                return
            batch = [s for _, slices in build_fleet(FleetSpec((node,), self.spec.layout)) for s in slices]


def _gpus_of(slice_: ResourceSlice) -> int:
    """Whole GPUs a slice publishes (MIG partitions and NICs are not GPUs)."""
    if slice_.spec.driver != GPU_DRIVER:
        return 0
    return sum(1 for d in slice_.spec.devices or [] if d.attributes["type"].string == "gpu")


def frontier(nodes: int = FRONTIER_NODES, fill: float = 0.9, seed: int = 7) -> Workload:
    objects = LazyFleet(frontier_fleet(nodes))
    gpus = objects.gpus
    claims = _fleet_claims(random.Random(seed), gpus, fill)
    name = "frontier-250k" if nodes == FRONTIER_NODES else f"frontier-{nodes}-nodes"
    shape = "frontier scale: mixed shapes, GB200 NVL72 racks"
    return Workload(name, objects, claims, gpus, seed=seed, shape=shape, extra={"nodes": nodes}, consume=True)


PROGRESS_EVERY = 5_000
"""Claims between progress lines on stderr, for workloads of at least four times as many."""

WORKLOADS = {"kube-perf-500": kube_perf_500, "gpu-fleet-10k": gpu_fleet_10k, "churn-mixed": churn_mixed, "frontier-250k": frontier}
DEFAULT_SEED = 7


def _peak_rss_mb() -> float:
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak / (1024 * 1024) if sys.platform == "darwin" else peak / 1024


def _busy_gpus(engine: Engine) -> int:
    """Physical devices holding anything (whole, a MIG partition of it, a share of it)."""
    busy = set()
    for record in engine.ledger.claims.values():
        for result in record.allocation.devices.results:
            busy.add((result.driver, result.pool, result.device.split("-mig-")[0]))
    return len(busy)


def _collections() -> int:
    """The cyclic collector's runs so far, every generation."""
    return sum(generation["collections"] for generation in gc.get_stats())


def measure(name: str, *, scoring: bool = True, seed: int | None = None, workload: Workload | None = None) -> dict:
    """Build the workload, load an engine, allocate every claim (releasing one running claim before
    each arrival once a churn workload is full); the numbers as a dict.

    `scoring`: the engine's topology/best-fit placement (the default), or
    Kubernetes' first-fit order. `seed`: the workload's (DEFAULT_SEED when
    None). `workload`: one built already (its build time is then not counted)."""
    if workload is None and name not in WORKLOADS:
        raise KeyError(f"unknown workload {name!r}; known: {', '.join(WORKLOADS)}")
    seed = DEFAULT_SEED if seed is None else seed
    rss_before = _peak_rss_mb()
    started = time.perf_counter()
    if workload is None:
        workload = WORKLOADS[name](seed=seed)
    built, built_cpu = time.perf_counter(), time.process_time()
    engine = Engine(scoring=scoring)
    gc.disable()  # as the allocator does while it loads: collections meanwhile only walk the new objects again
    try:
        for obj in workload.objects:
            engine.apply(obj)
    finally:
        gc.enable()
    # the allocator's collector policy: the loaded engine frozen, and what each piece of engine work
    # leaves alive frozen after it once it has grown (`Collector.settle`), so young collections do
    # not walk the claims' long-lived state; counted in the CPU time, not in a claim's latency
    collector = Collector()
    collector.loaded()
    lazy = workload.objects if isinstance(workload.objects, LazyFleet) else None
    building, building_cpu = (lazy.build_s, lazy.build_cpu_s) if lazy is not None else (0.0, 0.0)  # (built while loading: not the engine's time)
    latencies: list[float] = []
    statuses = {"allocated": 0, "unsatisfiable": 0, "error": 0}
    cold_start = cold_start_cpu = 0.0
    churn_rng = random.Random(seed + 1)
    running: list[str] = []
    releases = 0
    busy_at_fill = None
    collections_before = _collections()
    run_started, run_cpu = time.perf_counter(), time.process_time()
    claims = workload.claims
    count = len(claims)
    for i, claim in enumerate(claims):
        if workload.consume:
            claims[i] = None  # (this loop's `claim` holds it until the next one)
        if workload.churn_after is not None and i >= workload.churn_after and running:
            if busy_at_fill is None:
                busy_at_fill = _busy_gpus(engine)
            j = churn_rng.randrange(len(running))
            running[j], running[-1] = running[-1], running[j]
            engine.release(running.pop())
            collector.settle()
            releases += 1
        t0 = time.perf_counter()
        (outcome,) = engine.allocate([claim])
        t1 = time.perf_counter()
        collector.settle()
        if i == 0:
            cold_start, cold_start_cpu = t1 - built - building, time.process_time() - built_cpu - building_cpu
        latencies.append(t1 - t0)
        statuses[outcome.status] += 1
        if i % PROGRESS_EVERY == 0 and count >= PROGRESS_EVERY * 4:
            # a long run (frontier-250k: tens of minutes on a busy machine) shows it is moving;
            # stderr, so the JSON on stdout stays one object
            print(f"{workload.name}: claim {i:,} of {count:,}, {time.perf_counter() - started:.0f} s", file=sys.stderr, flush=True)
        if outcome.allocation is not None:
            running.append(claim.key)
    finished, finished_cpu = time.perf_counter(), time.process_time()
    collections = _collections() - collections_before
    ordered = sorted(latencies)
    peak = _peak_rss_mb()
    result = {
        "workload": workload.name,
        "shape": workload.shape,
        "seed": workload.seed,
        "scoring": scoring,
        "native": compiled(),
        "claims": count,
        "releases": releases,
        "allocated": statuses["allocated"],
        "unsatisfiable": statuses["unsatisfiable"],
        "errors": statuses["error"],
        "devices": workload.devices,
        "utilization": round(_busy_gpus(engine) / workload.devices, 4),
        "claims_per_second": round(len(latencies) / (finished - run_started), 1),
        # CPU time beside wall time: on a shared machine the wall clock counts other people's work
        "claims_per_cpu_second": round(len(latencies) / max(finished_cpu - run_cpu, 1e-9), 1),
        "p50_ms": round((percentile(ordered, 50) or 0.0) * 1000, 3),
        "p99_ms": round((percentile(ordered, 99) or 0.0) * 1000, 3),
        "max_ms": round(ordered[-1] * 1000, 3) if ordered else 0.0,
        "gc_collections": collections,  # the cyclic collector's runs during the claims (the policy freezes ahead of them)
        "cold_start_s": round(cold_start, 3),
        "cold_start_cpu_s": round(cold_start_cpu, 3),
        "build_s": round(built - started + building, 3),
        "peak_rss_mb": round(peak, 1),
        "rss_kb_per_device": round((peak - rss_before) * 1024 / workload.devices, 2),
    }
    if workload.churn_after is not None:
        result["churn_after"] = workload.churn_after
        result["utilization_at_fill"] = round((busy_at_fill or _busy_gpus(engine)) / workload.devices, 4)
    result.update(workload.extra)
    if lazy is None and not workload.consume:  # (frontier's fleet and claims are gone by now)
        result["cel"] = cel_costs(workload)
    return result


CEL_SCAN = 5_000
"""Devices `cel_costs` looks at, spread over the workload's slices (the CEL view of every one of
gpu-fleet-10k's 80,000 devices would add seconds to the bench)."""
CEL_SAMPLE = 1_000
"""At most this many of them each selector is timed on."""
CEL_PASSES = 3
_bombs = itertools.count()


def cost_bomb(n: int) -> str:
    """Three nested `all`s over a 90-element list and a lookup that fails on every device: cel-go
    estimates 2,227,977, over Kubernetes' limit of 1,000,000 (tests/engine/test_cel_cost.py). `n`
    names the lookup, so each call is a new expression: the compile cache answers a repeat without
    compiling, an attacker sends new ones."""
    items = ", ".join(str(i) for i in range(90))
    return f'cel.bind(l, [{items}], l.all(a, l.all(b, l.all(c, true)))) && device.attributes["gpu.example.com"].missing{n} == 1'


def _selects(selectors: list, env: Any) -> bool:
    """Does every selector accept the device (a CEL error: no)?"""
    try:
        return all(selector.matches(env) for selector in selectors)
    except CelError:
        return False


def _spread(items: list, count: int) -> list:
    """At most `count` of `items`, evenly spaced."""
    return items[:: max(1, len(items) // count)][:count]


def _cpu_us(evaluate: Callable[[Any], object], envs: list) -> float:
    """CPU microseconds per device of `evaluate` over `envs` (a CEL error is a verdict too): the
    fastest of CEL_PASSES passes, the least disturbed by a busy machine."""
    best = math.inf
    for _ in range(CEL_PASSES):
        started = time.thread_time()
        for env in envs:
            try:
                evaluate(env)
            except CelError:
                pass
        best = min(best, time.thread_time() - started)
    return round(best / len(envs) * 1e6, 2)


def _bomb_refused_ms() -> float:
    """CPU milliseconds to refuse `cost_bomb` at compile time (parse, type check, cost estimate): the
    fastest of CEL_PASSES new expressions. RuntimeError if one compiles."""
    best = math.inf
    for _ in range(CEL_PASSES):
        started = time.thread_time()
        try:
            compile_selector(cost_bomb(next(_bombs)))
        except CelError:
            best = min(best, time.thread_time() - started)
        else:
            raise RuntimeError("the cost bomb compiled: the cost limit is not enforced")
    return round(best * 1000, 2)


def cel_costs(workload: Workload) -> dict:
    """What the workload's CEL costs, outside the measured run (the JSON's `cel`): each distinct
    selector of its classes and claims that reaches CEL (not decided by the driver literal), timed on
    up to CEL_SAMPLE of CEL_SCAN devices spread over its slices (a claim's selector: those its class
    selects; a class's: all), in CPU microseconds per device as the engine evaluates it (`us`:
    `matches`, literal tests, then the Rust core, the interpreter where that errs) and by the
    reference interpreter alone (`interpreter_us`); `us_per_device` and
    `interpreter_us_per_device` are their [min, max] over the selectors (null without any); and
    `cost_bomb_refused_ms`, what refusing a cost bomb at compile time takes."""
    devices = [(s.spec.driver, d) for s in workload.objects if isinstance(s, ResourceSlice) for d in s.spec.devices or ()]
    envs = [device_env(driver, device) for driver, device in _spread(devices, CEL_SCAN)]
    classes = {o.metadata.name: [compile_selector(s.cel.expression) for s in o.spec.selectors or ()] for o in workload.objects if isinstance(o, DeviceClass)}
    timed: dict[str, tuple[Any, list]] = {s.expression: (s, envs) for selectors in classes.values() for s in selectors}
    selected = {name: [env for env in envs if _selects(selectors, env)] for name, selectors in classes.items()}
    for claim in workload.claims:
        for request in claim.spec.devices.requests:
            if request.exactly is not None:
                for s in request.exactly.selectors or ():
                    timed.setdefault(s.cel.expression, (compile_selector(s.cel.expression), selected[request.exactly.device_class_name]))
    rows = []
    for expression, (selector, on) in timed.items():
        sample = _spread(on, CEL_SAMPLE)
        if selector.driver is None and sample:
            rows.append(
                {
                    "expression": expression,
                    "devices": len(sample),
                    "us": _cpu_us(selector.matches, sample),
                    "interpreter_us": _cpu_us(selector.evaluate, sample),
                }
            )
    return {
        "selectors": rows,
        "us_per_device": [min(r["us"] for r in rows), max(r["us"] for r in rows)] if rows else None,
        "interpreter_us_per_device": [min(r["interpreter_us"] for r in rows), max(r["interpreter_us"] for r in rows)] if rows else None,
        "cost_bomb_refused_ms": _bomb_refused_ms(),
    }


def parse_sizes(text: str) -> list[int]:
    """`10k,50k,250k` -> [10000, 50000, 250000]; ValueError naming the bad item."""
    sizes = []
    for item in text.split(","):
        raw = item.strip().lower()
        factor = 1000 if raw.endswith("k") else 1
        digits = raw[:-1] if raw.endswith("k") else raw
        if not digits.isdigit() or not 100 <= int(digits) * factor <= 1_000_000:
            raise ValueError(f"{item!r}: a GPU count from 100 to 1000k (e.g. 10k)")
        sizes.append(int(digits) * factor)
    return sizes


def scale(sizes: list[int], *, seed: int = DEFAULT_SEED) -> dict:
    """The frontier mix at each size, each in a fresh process (its peak RSS its own): one row per size."""
    import json
    import subprocess

    rows = []
    for gpus in sizes:
        command = [
            sys.executable,
            "-m",
            "dralloc.cli",
            "bench",
            "engine",
            "--workload",
            "frontier-250k",
            "--nodes",
            str(frontier_nodes_for(gpus)),
            "--seed",
            str(seed),
            "--json",
        ]
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{gpus} GPUs: {done.stderr.strip()[-500:]}")
        rows.append(json.loads(done.stdout))
    keys = (
        "nodes",
        "devices",
        "claims",
        "cold_start_s",
        "cold_start_cpu_s",
        "claims_per_second",
        "claims_per_cpu_second",
        "p99_ms",
        "peak_rss_mb",
        "rss_kb_per_device",
    )
    return {"workload": "frontier mix", "seed": seed, "points": [{k: row[k] for k in keys} for row in rows]}
