"""`dralloc bench placement`: topology- and fragmentation-aware placement against Kubernetes.

A seeded churn trace (claims arrive and leave) over a mixed fleet of 68
simulated nodes (discovery's hardware profiles), run through the same engine
three times:

- **dralloc**: the engine with scoring, over the whole fleet;
- **baseline: Kubernetes as it runs**. kube-scheduler finds the nodes where
  the DRA allocator can allocate the pod's claims and picks one by its score;
  the DynamicResources plugin scores only `firstAvailable` sub-requests (flat
  for `exactly` requests), the other plugins score CPU and memory (spreading),
  and ties are broken at random: for devices, a random feasible node. Modelled
  as the nodes in a seeded random order, the first where the engine with
  scoring off (the allocator's first fit, devices in Kubernetes' order)
  allocates. Kubernetes has no gangs; the baseline gets dralloc's gang
  allocator anyway (all-or-nothing, domains in rank order), so its gangs are
  as good as first fit can make them;
- **first fit by rank** (`first_fit_*` keys): scoring off over the whole fleet,
  nodes in rank order. Kubernetes never orders nodes like this; it is a
  stronger comparator than Kubernetes (first fit in a fixed order is itself a
  packing rule: low-ranked nodes fill first, high-ranked ones stay whole),
  reported so the gain over plain packing is visible too.

Fleet: 36 GB200 NVL72 trays (two racks of 18, one NVLink clique each),
16 HGX H100 (two racks of 8, `dralloc.dev/rack`), 8 L40S PCIe servers (two
sockets, PCIe switches, NICs), 4 A100 PCIe servers (NVLink-bridged pairs,
MIG-capable) and 4 H200 servers with MIG partitions.

Claims: 1/2/4/8 whole GPUs, GPU+NIC pairs (no constraint: a preference),
MIG slices, and gangs (GB200: 2-8 trays of 4 GPUs in one clique; H100: 2-3
nodes of 8 GPUs in one rack). A claim that does not fit is rejected (it
leaves). Large claims: 8-GPU claims and gangs. Small claims leave at random
times and scatter holes, so some large claims are rejected while enough GPUs
of their family are free in total, only not on one node (or in one domain):
`large_rejected_with_enough_free_gpus` counts those (fragmentation); the rest
of `large_claims_rejected` found fewer free GPUs of their family than they
asked for, in total. Every run sees the same trace, so the same offered load.

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
    kind = "mig" if job.mig else "gpu"

    def gpu(rec) -> bool:
        attrs = rec.spec.attributes
        return (
            rec.driver == "gpu.nvidia.com"
            and attrs["type"].string == kind
            and attrs["productName"].string == product
            and (job.mig is None or attrs["profile"].string == job.mig)
        )

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


def _scheduler_pick(engine: Engine, job: Job, claims: list[ResourceClaim], by_node: dict[str, list], rng: random.Random) -> list:
    """Kubernetes' choice (see the module docstring): a random node among those where the
    allocator can allocate the claims, devices first fit on it. The count of free matching
    devices skips the nodes that cannot; the engine decides on the others."""
    wants = _wants(job)
    nodes = [node for node, recs in by_node.items() if all(sum(1 for r in recs if pred(r) and _free(engine, r)) >= n for n, pred in wants)]
    rng.shuffle(nodes)
    for node in nodes:
        outcomes = engine.allocate(claims, node=node)
        if outcomes[0].status == "allocated":
            return outcomes
    return engine.allocate(claims)  # nowhere: the engine says why


def run(jobs: list[Job], scoring: bool, *, scheduler: random.Random | None = None) -> Result:
    """One pass over the trace. `scheduler`: each claim on a node Kubernetes would pick
    (`_scheduler_pick`) instead of the engine's node order over the whole fleet."""
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
            outcomes = _scheduler_pick(engine, job, claims, by_node, scheduler) if scheduler is not None else engine.allocate(claims)
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
    """The three runs over the same trace (see the module docstring); the numbers as a stable
    JSON-able dict: dralloc's keys bare, Kubernetes' with `baseline_`, rank-order first fit's
    with `first_fit_`."""
    work = trace(seed, jobs, load)
    runs = {
        "": run(work, scoring=True),
        "baseline_": run(work, scoring=False, scheduler=random.Random(seed)),
        "first_fit_": run(work, scoring=False),
    }
    scored = runs[""]

    def fewer(than: Result) -> float:
        return round(1 - scored.large_claims_rejected / than.large_claims_rejected, 4) if than.large_claims_rejected else 0.0

    out: dict = {
        "seed": seed,
        "nodes": sum(n for _, n in FLEET),
        "gpus": sum(CAPACITY.values()),
        "offered_load": load,
        "units": scored.units,
        "claims": scored.claims,
        "large_claims": scored.large_claims,
        "large_claims_rejected_reduction": fewer(runs["baseline_"]),
        "large_claims_rejected_reduction_vs_first_fit": fewer(runs["first_fit_"]),
    }
    for prefix, r in runs.items():
        first = r.utilization_at_first_large_rejection
        samples = r.utilization_samples
        out |= {
            f"{prefix}multi_device_claims": r.multi_device,
            f"{prefix}locality_optimal_fraction": round(r.locality_optimal / r.multi_device, 4) if r.multi_device else 1.0,
            f"{prefix}rejected": r.rejected,
            f"{prefix}large_claims_rejected": r.large_claims_rejected,
            f"{prefix}large_rejected_with_enough_free_gpus": r.large_rejected_with_enough_free_gpus,
            f"{prefix}utilization_at_first_large_rejection": None if first is None else round(first, 4),
            f"{prefix}mean_utilization": round(sum(samples) / len(samples), 4) if samples else 0.0,
            f"{prefix}engine_seconds": round(r.engine_seconds, 3),
            f"{prefix}units_per_second": round(r.units / r.engine_seconds, 1) if r.engine_seconds else 0.0,
        }
    return out


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure(jobs=int(sys.argv[1]) if len(sys.argv) > 1 else 3000), indent=2))
