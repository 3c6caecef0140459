"""`dralloc bench placement`: topology- and fragmentation-aware placement against first fit.

A seeded churn trace (claims arrive and leave) over a mixed fleet of 68
simulated nodes (discovery's hardware profiles), run twice through the same
engine: with scoring (dralloc) and with scoring off (first fit in Kubernetes'
order: nodes by rank, devices by name). Gangs go through the same gang
allocator both times (all-or-nothing inside one NVLink clique or rack); only
the order of domains, nodes and devices differs.

A third run models what a Kubernetes cluster does today beyond the DRA
allocator: kube-scheduler filters the nodes that fit and picks one by its
CPU/memory scores, in effect at random for devices (`random_node_*` keys;
devices in Kubernetes' order, gangs as in the first-fit run).

Fleet: 36 GB200 NVL72 trays (two racks of 18, one NVLink clique each),
16 HGX H100 (two racks of 8, `dralloc.dev/rack`), 8 L40S PCIe servers (two
sockets, PCIe switches, NICs), 4 A100 PCIe servers (NVLink-bridged pairs,
MIG-capable) and 4 H200 servers with MIG partitions.

Claims: 1/2/4/8 whole GPUs, GPU+NIC pairs (no constraint: a preference),
MIG slices, and gangs (GB200: 4-12 trays of 4 GPUs in one clique; H100: 2-4
nodes of 8 GPUs in one rack). A claim that does not fit is rejected (it
leaves). Large claims: 8-GPU claims and gangs. Small claims leave at random
times and scatter holes, so some large claims are rejected while enough GPUs
of their family are free in total, only not on one node (or in one domain):
`large_rejected_with_enough_free_gpus` counts those (fragmentation); the rest
of `large_claims_rejected` found fewer free GPUs of their family than they
asked for, in total. Both runs see the same trace, so the same offered load.

Locality: for every multi-device claim (not gang members) an independent
oracle (device attributes only, not the scorer's topology code) finds the
tightest level - one NVLink domain, PCIe switch, PCIe root, NUMA node, node -
at which any node had enough free matching devices just before the claim,
and the level its allocated devices share. Placed optimally: shared level no
looser than the oracle's.
"""

from __future__ import annotations

import heapq
import random
import time
from dataclasses import dataclass, field

import msgspec
from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.gang import allocate_gang
from dralloc.discovery.fleet import build_fleet, fleet_nodes
from dralloc.schemas.resource import (
    CELDeviceSelector,
    DeviceClass,
    DeviceClassSpec,
    DeviceSelector,
    ObjectMeta,
    ResourceClaim,
)

FLEET = [
    ("gb200-nvl72", 36),
    ("h100-sxm", 16),
    ("l40s-pcie", 8),
    ("a100-pcie", 4),
    ("h200-sxm-mig", 4),
]
H100_RACK = 8
PRODUCTS = {
    "gb200": "NVIDIA GB200",
    "h100": "NVIDIA H100 80GB HBM3",
    "l40s": "NVIDIA L40S",
    "a100": "NVIDIA A100 80GB PCIe",
    "h200": "NVIDIA H200",
}

# (family, gpus, nics, mig profile, gang members, weight, mean duration)
SHAPES = [
    ("h100", 1, 0, None, 0, 14, 40),
    ("h100", 2, 0, None, 0, 8, 40),
    ("h100", 4, 0, None, 0, 5, 40),
    ("h100", 8, 0, None, 0, 3, 60),
    ("h100", 1, 1, None, 0, 4, 40),
    ("h100", 2, 2, None, 0, 2, 40),
    ("h100", 8, 0, None, 3, 1, 60),
    ("l40s", 1, 0, None, 0, 8, 40),
    ("l40s", 2, 0, None, 0, 4, 40),
    ("l40s", 4, 0, None, 0, 2, 40),
    ("l40s", 8, 0, None, 0, 1, 60),
    ("l40s", 1, 1, None, 0, 2, 40),
    ("gb200", 1, 0, None, 0, 12, 40),
    ("gb200", 2, 0, None, 0, 6, 40),
    ("gb200", 4, 0, None, 0, 4, 40),
    ("gb200", 1, 1, None, 0, 2, 40),
    ("gb200", 4, 0, None, 8, 2, 60),
    ("a100", 1, 0, None, 0, 3, 40),
    ("a100", 2, 0, None, 0, 2, 40),
    ("a100", 4, 0, None, 0, 1, 40),
    ("a100", 1, 0, "1g.10gb", 0, 3, 30),
    ("h200", 1, 0, "1g.18gb", 0, 8, 30),
    ("h200", 1, 0, "2g.35gb", 0, 4, 30),
    ("h200", 1, 0, "3g.71gb", 0, 2, 30),
]

CLASSES = {
    "gpu.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'",
    "mig.nvidia.com": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'",
    "nic.dra.net": "device.driver == 'dra.net'",
}

LEVELS = (
    ("NVLink domain", "dralloc.dev/nvlinkDomain"),
    ("PCIe switch", "dralloc.dev/pcieSwitch"),
    ("PCIe root", "resource.kubernetes.io/pcieRoot"),
    ("NUMA node", "dralloc.dev/numaNode"),
    ("node", None),
)


@dataclass(slots=True)
class Job:
    index: int
    at: float
    duration: float
    family: str
    gpus: int
    nics: int
    mig: str | None
    members: int  # 0: a single claim; n: a gang of n claims

    @property
    def large(self) -> bool:
        return self.members > 0 or self.gpus >= 8

    def claims(self) -> list[ResourceClaim]:
        count = max(1, self.members)
        return [_claim(f"job-{self.index:05d}-{m}", self) for m in range(count)]


def _claim(name: str, job: Job) -> ResourceClaim:
    product = PRODUCTS[job.family]
    requests = []
    if job.mig:
        selectors = [
            f"device.attributes['gpu.nvidia.com'].profile == '{job.mig}'",
            f"device.attributes['gpu.nvidia.com'].productName == '{product}'",
        ]
        requests.append(
            {
                "name": "mig",
                "exactly": {
                    "deviceClassName": "mig.nvidia.com",
                    "count": job.gpus,
                    "selectors": [{"cel": {"expression": e}} for e in selectors],
                },
            }
        )
    else:
        selector = f"device.attributes['gpu.nvidia.com'].productName == '{product}'"
        requests.append(
            {
                "name": "gpus",
                "exactly": {
                    "deviceClassName": "gpu.nvidia.com",
                    "count": job.gpus,
                    "selectors": [{"cel": {"expression": selector}}],
                },
            }
        )
    if job.nics:
        requests.append(
            {
                "name": "nics",
                "exactly": {"deviceClassName": "nic.dra.net", "count": job.nics},
            }
        )
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "bench", "uid": name},
            "spec": {"devices": {"requests": requests}},
        },
        ResourceClaim,
    )


GANG_SIZES = {"gb200": (2, 4, 6, 8), "h100": (2, 3)}
"""Members of a gang (trays of 4 GPUs in one NVL72 clique of 18; HGX nodes in one rack of 8)."""
CAPACITY = {
    "gb200": 36 * 4,
    "h100": 16 * 8,
    "l40s": 8 * 8,
    "a100": 4 * 8,
    "h200": 4 * 8,
}
MIG_SHARE = {"1g.10gb": 1 / 8, "1g.18gb": 1 / 8, "2g.35gb": 2 / 8, "3g.71gb": 4 / 8}


def trace(seed: int = 42, jobs: int = 3000, load: float = 0.9) -> list[Job]:
    """Poisson arrivals with exponential durations. Every GPU family is offered the same
    load: `load` x its GPUs, on average (1.0: as much GPU time as it has)."""
    rng = random.Random(seed)
    families = sorted(CAPACITY)
    shapes = {f: [s for s in SHAPES if s[0] == f] for f in families}
    rates = {}
    for f in families:
        weights = [s[5] for s in shapes[f]]
        gpu_time = sum(
            w * (MIG_SHARE[s[3]] if s[3] else s[1] * (sum(GANG_SIZES[f]) / len(GANG_SIZES[f]) if s[4] else 1)) * s[6] for s, w in zip(shapes[f], weights)
        ) / sum(weights)
        rates[f] = load * CAPACITY[f] / gpu_time
    total = sum(rates.values())
    out: list[Job] = []
    now = 0.0
    for i in range(jobs):
        now += rng.expovariate(total)
        family = rng.choices(families, weights=[rates[f] for f in families])[0]
        _, count, nics, mig, members, _, mean = rng.choices(shapes[family], weights=[s[5] for s in shapes[family]])[0]
        if members:
            members = rng.choice(GANG_SIZES[family])
        out.append(Job(i, now, rng.expovariate(1 / mean), family, count, nics, mig, members))
    return out


def fleet_engine(scoring: bool) -> Engine:
    engine = Engine(scoring=scoring)
    h100 = 0
    for node in fleet_nodes(FLEET):
        if node.metadata.labels.get("dralloc.dev/hardware-profile") == "h100-sxm":
            node.metadata.labels["dralloc.dev/rack"] = f"h100-rack-{h100 // H100_RACK}"
            h100 += 1
        engine.apply(node)
    for name, expression in CLASSES.items():
        engine.apply(
            DeviceClass(
                metadata=ObjectMeta(name=name),
                spec=DeviceClassSpec(selectors=[DeviceSelector(cel=CELDeviceSelector(expression=expression))]),
            )
        )
    for _, slices in build_fleet(FLEET):
        for s in slices:
            engine.apply(s)
    return engine


# --- the oracle: device attributes only --------------------------------------------------


def _free(engine: Engine, rec) -> bool:
    ledger = engine.ledger
    return not (ledger.used_bits >> rec.id) & 1 and (not rec.consumes or ledger.active(rec) or ledger.counter_room(rec))


def _wants(job: Job) -> list[tuple[int, object]]:
    """(count, predicate over a device) per request of one of the job's claims."""
    product = PRODUCTS[job.family]

    def gpu(rec) -> bool:
        attrs = rec.spec.attributes
        return rec.driver == "gpu.nvidia.com" and attrs["type"].string == "gpu" and attrs["productName"].string == product

    def nic(rec) -> bool:
        return rec.driver == "dra.net"

    return [(job.gpus, gpu)] + ([(job.nics, nic)] if job.nics else [])


def _value(rec, attribute: str | None, node: str):
    if attribute is None:
        return node
    value = rec.attribute(attribute)
    return None if value is None else (node, value[1])


def best_level(engine: Engine, job: Job, by_node: dict[str, list]) -> int | None:
    """The tightest level at which some node has enough free matching devices now."""
    wants = _wants(job)
    best = None
    for node, recs in by_node.items():
        free = [[r for r in recs if pred(r) and _free(engine, r)] for _, pred in wants]
        if any(len(f) < n for f, (n, _) in zip(free, wants)):
            continue
        for level, (_, attribute) in enumerate(LEVELS):
            if best is not None and level >= best:
                break
            counts: list[dict] = []
            for f in free:
                c: dict = {}
                for r in f:
                    v = _value(r, attribute, node)
                    if v is not None:
                        c[v] = c.get(v, 0) + 1
                counts.append(c)
            values = set(counts[0])
            for c, (n, _) in zip(counts, wants):
                values &= {v for v, k in c.items() if k >= n}
            if values:
                best = level
                break
    return best


def shared_level(engine: Engine, outcome) -> int:
    recs = [engine.inventory.by_key[(r.driver, r.pool, r.device)] for r in outcome.allocation.devices.results]
    for level, (_, attribute) in enumerate(LEVELS):
        values = {_value(r, attribute, outcome.node) for r in recs}
        if len(values) == 1 and None not in values:
            return level
    return len(LEVELS)


# --- one run -------------------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    claims: int = 0
    units: int = 0
    rejected: int = 0
    large_claims: int = 0
    large_claims_rejected: int = 0
    large_rejected_with_enough_free_gpus: int = 0
    multi_device: int = 0
    locality_optimal: int = 0
    utilization_at_first_large_rejection: float | None = None
    utilization_samples: list[float] = field(default_factory=list)
    seconds: float = 0.0
    engine_seconds: float = 0.0


def _weight(rec) -> float:
    """GPUs a device is worth: a whole GPU 1, a MIG slice its memory slices / 8, a NIC 0."""
    if rec.driver != "gpu.nvidia.com":
        return 0.0
    if rec.spec.attributes["type"].string == "gpu":
        return 1.0
    slices = sum(1 for key, _ in rec.consumes if key[3].startswith("memory-slice-"))
    return slices / 8


def _random_node(
    engine: Engine,
    job: Job,
    claims: list[ResourceClaim],
    by_node: dict[str, list],
    rng: random.Random,
) -> list:
    """kube-scheduler's shape: filter the nodes that have enough free matching devices, pick one
    at random (it scores nodes by CPU/memory, not devices, and breaks ties at random), devices
    first fit."""
    wants = _wants(job) if not job.mig else []
    fits = []
    for node, recs in by_node.items():
        if all(sum(1 for r in recs if pred(r) and _free(engine, r)) >= n for n, pred in wants):
            fits.append(node)
    rng.shuffle(fits)
    outcome = None
    for node in fits if wants else [None]:
        (outcome,) = engine.allocate(claims, node=node)
        if outcome.status == "allocated":
            break
    return [outcome] if outcome is not None else engine.allocate(claims)


def run(jobs: list[Job], scoring: bool, *, spread: random.Random | None = None) -> Result:
    """One pass over the trace. `spread`: instead of the engine's node order, a random
    node among those that fit (see `_random_node`), devices in Kubernetes' order."""
    engine = fleet_engine(scoring)
    by_node: dict[str, list] = {}
    total_gpus = 0
    for rec in engine.inventory.devices:
        if rec is not None and rec.local_node is not None:
            by_node.setdefault(rec.local_node, []).append(rec)
            if rec.driver == "gpu.nvidia.com" and rec.spec.attributes["type"].string == "gpu":
                total_gpus += 1
    result = Result()
    used = 0.0
    leaving: list[tuple[float, int, list[str], float]] = []
    started = time.perf_counter()
    for job in jobs:
        while leaving and leaving[0][0] <= job.at:
            _, _, keys, weight = heapq.heappop(leaving)
            for key in keys:
                engine.release(key)
            used -= weight
        claims = job.claims()
        result.claims += len(claims)
        result.units += 1
        result.large_claims += job.large
        multi = not job.members and job.gpus + job.nics >= 2
        optimum = best_level(engine, job, by_node) if multi else None
        t0 = time.perf_counter()
        if job.members:
            outcomes = allocate_gang(
                engine,
                claims,
                name=f"job-{job.index}",
                domain_label=None if job.family == "gb200" else "dralloc.dev/rack",
            )
        else:
            outcomes = _random_node(engine, job, claims, by_node, spread) if spread is not None else engine.allocate(claims)
        result.engine_seconds += time.perf_counter() - t0
        if all(o.status == "allocated" for o in outcomes):
            weight = sum(_weight(engine.inventory.by_key[(r.driver, r.pool, r.device)]) for o in outcomes for r in o.allocation.devices.results)
            used += weight
            heapq.heappush(
                leaving,
                (job.at + job.duration, job.index, [o.claim for o in outcomes], weight),
            )
            if multi:
                result.multi_device += 1
                result.locality_optimal += optimum is not None and shared_level(engine, outcomes[0]) <= optimum
        else:
            result.rejected += len(claims)
            if job.large:
                result.large_claims_rejected += 1
                # enough free GPUs of the family in total, but not on one node (or in one domain,
                # for a gang): the rejection is fragmentation, not a lack of capacity
                gpu = _wants(job)[0][1]
                free = sum(1 for recs in by_node.values() for r in recs if gpu(r) and _free(engine, r))
                result.large_rejected_with_enough_free_gpus += free >= job.gpus * max(1, job.members)
                if result.utilization_at_first_large_rejection is None:
                    result.utilization_at_first_large_rejection = used / total_gpus
        result.utilization_samples.append(used / total_gpus)
    result.seconds = time.perf_counter() - started
    return result


def measure(seed: int = 42, jobs: int = 3000, load: float = 0.9) -> dict:
    """Both runs over the same trace; the numbers as a stable JSON-able dict."""
    work = trace(seed, jobs, load)
    scored = run(work, scoring=True)
    baseline = run(work, scoring=False)
    scheduler = run(work, scoring=False, spread=random.Random(seed))

    def fraction(r: Result) -> float:
        return round(r.locality_optimal / r.multi_device, 4) if r.multi_device else 1.0

    def mean(r: Result) -> float:
        return round(sum(r.utilization_samples) / len(r.utilization_samples), 4) if r.utilization_samples else 0.0

    def first(r: Result) -> float | None:
        return None if r.utilization_at_first_large_rejection is None else round(r.utilization_at_first_large_rejection, 4)

    fewer = 1 - scored.large_claims_rejected / baseline.large_claims_rejected if baseline.large_claims_rejected else 0.0
    return {
        "seed": seed,
        "nodes": sum(n for _, n in FLEET),
        "gpus": 36 * 4 + 16 * 8 + 8 * 8 + 4 * 8 + 4 * 8,
        "offered_load": load,
        "units": scored.units,
        "claims": scored.claims,
        "large_claims": scored.large_claims,
        "multi_device_claims": scored.multi_device,
        "baseline_multi_device_claims": baseline.multi_device,
        "locality_optimal_fraction": fraction(scored),
        "baseline_locality_optimal_fraction": fraction(baseline),
        "rejected": scored.rejected,
        "baseline_rejected": baseline.rejected,
        "large_claims_rejected": scored.large_claims_rejected,
        "baseline_large_claims_rejected": baseline.large_claims_rejected,
        "large_claims_rejected_reduction": round(fewer, 4),
        "large_rejected_with_enough_free_gpus": scored.large_rejected_with_enough_free_gpus,
        "baseline_large_rejected_with_enough_free_gpus": baseline.large_rejected_with_enough_free_gpus,
        "utilization_at_first_large_rejection": first(scored),
        "baseline_utilization_at_first_large_rejection": first(baseline),
        "mean_utilization": mean(scored),
        "baseline_mean_utilization": mean(baseline),
        "random_node_locality_optimal_fraction": fraction(scheduler),
        "random_node_rejected": scheduler.rejected,
        "random_node_large_claims_rejected": scheduler.large_claims_rejected,
        "random_node_utilization_at_first_large_rejection": first(scheduler),
        "random_node_mean_utilization": mean(scheduler),
        "engine_seconds": round(scored.engine_seconds, 3),
        "baseline_engine_seconds": round(baseline.engine_seconds, 3),
        "units_per_second": round(scored.units / scored.engine_seconds, 1) if scored.engine_seconds else 0.0,
        "baseline_units_per_second": round(baseline.units / baseline.engine_seconds, 1) if baseline.engine_seconds else 0.0,
    }


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure(jobs=int(sys.argv[1]) if len(sys.argv) > 1 else 3000), indent=2))
