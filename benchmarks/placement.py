"""`dralloc bench placement`: topology- and fragmentation-aware placement against Kubernetes.

A seeded churn trace (claims arrive and leave) over a mixed fleet of 68
simulated nodes (discovery's hardware profiles), run through the same engine
three times:

- **dralloc**: the engine with scoring, over the whole fleet, with reservations for
  the large claims that wait (`gang.reservation_for`; held nodes are tried last, a
  held node whole again is kept from smaller claims, and a smaller claim that must
  take a held node takes the one with the most claims first: placement.py);
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
import itertools
import random
import time
from dataclasses import dataclass, field

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.gang import allocate_gang, reservation_for
from dralloc.allocator.moving import configure, moves_from
from dralloc.discovery.fleet import build_fleet, fleet_nodes
from dralloc.schemas.resource import (
    CELDeviceSelector,
    DeviceClass,
    DeviceClassSpec,
    DeviceSelector,
    ObjectMeta,
    ResourceClaim,
)
from dralloc.stats import percentile

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
    max_wait: float = 0.0
    """Minutes the claim may wait for room before it is refused (0: refused at once)."""

    @property
    def large(self) -> bool:
        return self.members > 0 or self.gpus >= 8

    def claims(self) -> list[ResourceClaim]:
        count = max(1, self.members)
        return [_claim(f"job-{self.index:05d}-{m}", self) for m in range(count)]


Departure = tuple[str, list[str], float, int]
"""A running job's end on the timeline: its family, its claims' keys, the GPUs it held (weighted) and its index."""


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


MAX_WAIT = 30.0
"""Minutes a large claim may wait for room (small ones never wait: they are refused at once)."""


def trace(seed: int = 42, jobs: int = 3000, load: float = 0.9, max_wait: float = MAX_WAIT) -> list[Job]:
    """Poisson arrivals with exponential durations (minutes). Every GPU family is offered the
    same load: `load` x its GPUs, on average (1.0: as much GPU time as it has). Large claims
    may wait `max_wait` minutes for room."""
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
        job = Job(i, now, rng.expovariate(1 / mean), family, count, nics, mig, members)
        job.max_wait = max_wait if job.large else 0.0
        out.append(job)
    return out


def fleet_engine(scoring: bool, keep_whole: float = 0.0) -> Engine:
    """The bench's fleet in a new engine; `keep_whole`: the factor of whole nodes kept for large
    claims in proportion to recent large demand (engine/keep_whole.py; 0: off)."""
    engine = Engine(scoring=scoring)
    engine.placement.keep_whole.factor = keep_whole
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
    return engine.ledger.free(rec)


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

POLICIES = ("dralloc", "kubernetes", "first_fit")
"""The three placements every trace runs through (see the module docstring)."""
MOVE_POLICIES = ("dralloc_moves", "dralloc_moves_early")
"""dralloc with moves (engine/moves.py), run beside the three with `--moves`: a large claim that would be
refused while its family has enough free GPUs gets room by moving the small claims in its way.
`dralloc_moves` is the allocator's `when-refused` (moving.py): at `MOVE_AT` of its wait (25 of 30
minutes; a gang: not before, `moves_from`) and at its end (at once when it may not wait), the held-node
rules off; `dralloc_moves_early`:
as soon as it starts waiting, and again when the wait ends, the held-node rules on."""


SMALL_WHY = ("family_full", "fragmented", "held", "restart_overhang", "other")
"""Why a small claim was refused, judged as it happens (`_why_small`): its family had fewer free
devices of the kind it asks than it asks, fleet-wide (conservation: nothing placement can do then);
enough in total but no node with enough (fragmentation); it would fit with every reservation, held-node
rule and kept-whole node lifted (held); it would fit, count-wise, if the devices that moved claims hold
only because their move restarted them were free (restart_overhang: a move's cost, taken before the
other classes); none of these (other: a NIC, counters)."""


@dataclass(slots=True)
class Result:
    claims: int = 0
    units: int = 0
    rejected: int = 0
    """Claims refused (a gang's every member)."""
    large_claims: int = 0
    large_claims_rejected: int = 0
    large_rejected_with_enough_free_gpus: int = 0
    small_claims: int = 0
    small_claims_rejected: int = 0
    multi_device: int = 0
    locality_optimal: int = 0
    large_waits: list[float] = field(default_factory=list)
    """Minutes from arrival to placement of each large claim placed (0: placed on arrival)."""
    gpu_minutes: float = 0.0
    """GPUs (a MIG slice its share) x minutes of every claim placed."""
    utilization_at_first_large_rejection: float | None = None
    utilization_samples: list[float] = field(default_factory=list)
    fragmented: list[dict] = field(default_factory=list)
    """Per large refusal with enough free GPUs of the family in total, what the fleet looked like
    (`_why_fragmented`): why placement failed it."""
    small_why: dict[str, int] = field(default_factory=lambda: dict.fromkeys(SMALL_WHY, 0))
    """Small refusals by class at the moment each happened (`_why_small`, `SMALL_WHY`)."""
    small_by_family: dict[str, dict[str, int]] = field(default_factory=dict)
    """The same per GPU family (a family without a refusal is absent)."""
    moving: bool = False
    """A run with moves (`MOVE_POLICIES`): its summary reports them."""
    moves: int = 0
    """Move plans applied (each placed one large claim or gang)."""
    claims_moved: int = 0
    gpu_minutes_lost: float = 0.0
    """GPUs x minutes the moved claims had served before their move (a move restarts a workload)."""
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
    allocator can allocate the claims, devices first fit on it; [] where none can. The count of
    free matching devices skips the nodes that cannot; the engine decides on the others."""
    wants = _wants(job)
    nodes = [node for node, recs in by_node.items() if all(sum(1 for r in recs if pred(r) and _free(engine, r)) >= n for n, pred in wants)]
    rng.shuffle(nodes)
    for node in nodes:
        outcomes = engine.allocate(claims, node=node)
        if outcomes[0].status == "allocated":
            return outcomes
    return []


def _domain_label(job: Job) -> str | None:
    return None if job.family == "gb200" else "dralloc.dev/rack"


def run(
    jobs: list[Job],
    policy: str = "dralloc",
    *,
    seed: int = 0,
    keep_whole: float = 0.0,
    move_after: float | None = None,
    reserve: bool = True,
    by_lost: bool = False,
) -> Result:
    """One pass over the trace with one of the `POLICIES` (`seed`: Kubernetes' tie-breaks;
    `keep_whole`: dralloc's factor of whole nodes kept for large claims, `fleet_engine`).

    Time moves from event to event: arrivals, departures, and the end of a claim's wait. A
    claim that does not fit on arrival waits if the trace lets it (`Job.max_wait`), in arrival
    order, and is tried again whenever a claim of its GPU family leaves; it is refused when its
    wait is over (the same rule for every policy). Only dralloc reserves for what waits: after
    every change each waiting claim, oldest first, holds the node (the gang: the domain's nodes)
    closest to fitting it (`Engine.reserve`), and every other claim tries those nodes last.

    Levers of the move policies (README "Levers measured"; the defaults are the policies as
    shipped): `move_after`, minutes into a wait when moves are tried once before its end (None:
    `dralloc_moves` at `moving.moves_from` of the wait, early only at its start; at or past the wait's
    length: only at its end); `reserve` False, no reservations (a wait ends in a move, not in idle held
    GPUs); `by_lost`, among targets moving as many claims the one whose claims had served the
    least GPU time (engine/moves.py `lost`)."""
    if policy not in POLICIES + MOVE_POLICIES:
        raise ValueError(f"unknown policy {policy!r}; known: {', '.join(POLICIES + MOVE_POLICIES)}")
    ours = policy == "dralloc" or policy in MOVE_POLICIES
    engine = fleet_engine(scoring=ours, keep_whole=keep_whole if ours else 0.0)
    scheduler = random.Random(seed) if policy == "kubernetes" else None
    reserving = ours and (reserve or policy not in MOVE_POLICIES)
    moving = policy in MOVE_POLICIES
    early = policy == "dralloc_moves_early"
    if policy == "dralloc_moves":  # as the allocator's `when-refused` (moving.py): held-node rules off,
        configure(engine, "when-refused")  # moves tried at moves_from of the wait and at its end
    by_node: dict[str, list] = {}
    total_gpus = 0
    for rec in engine.inventory.devices:
        if rec is not None and rec.local_node is not None:
            by_node.setdefault(rec.local_node, []).append(rec)
            if rec.driver == "gpu.nvidia.com" and rec.spec.attributes["type"].string == "gpu":
                total_gpus += 1
    result = Result(moving=moving)
    used = 0.0
    # (time, 0 departure | 1 end of a wait | 2 moves tried during a wait, order, payload): departures first
    timeline: list[tuple[float, int, int, Departure | Job]] = []
    order = itertools.count()
    waiting: dict[int, tuple[Job, list[ResourceClaim]]] = {}  # in arrival order
    held: dict[int, int] = {}  # waiting job -> the devices reserved for it
    # for `_why_fragmented`: when each claim was placed, and per waiting job the nodes it holds now,
    # every node it held, and the claims placed on a node while that node was held for it
    placed_at: dict[str, float] = {}
    holding: dict[int, set[str]] = {}
    ever_held: dict[int, set[str]] = {}
    intruders: dict[int, list[str]] = {}
    # for moves: the small claims running (movable: key -> claim, and its job and start) and each
    # job's current departure (a moved claim restarts: its earlier departure no longer counts)
    movable: dict[str, ResourceClaim] = {}
    running: dict[str, tuple[Job, float, float]] = {}
    departs: dict[int, int] = {}
    first_end: dict[str, float] = {}  # a moved claim still running -> when it would have left unmoved

    def reserve_others(job: Job) -> None:
        if reserving:
            others = 0
            for index, bits in held.items():
                if index != job.index:
                    others |= bits
            engine.reserve(others)

    def attempt(job: Job, claims: list[ResourceClaim], now: float) -> bool:
        multi = not job.members and job.gpus + job.nics >= 2
        optimum = best_level(engine, job, by_node) if multi else None
        reserve_others(job)
        t0 = time.perf_counter()
        if job.members:
            outcomes = allocate_gang(engine, claims, name=f"job-{job.index}", domain_label=_domain_label(job))
        elif scheduler is not None:
            outcomes = _scheduler_pick(engine, job, claims, by_node, scheduler)
        else:
            outcomes = engine.allocate(claims)
        result.engine_seconds += time.perf_counter() - t0
        if not outcomes or any(o.status != "allocated" for o in outcomes):
            return False
        placed(job, claims, outcomes, now)
        if multi:
            result.multi_device += 1
            result.locality_optimal += optimum is not None and shared_level(engine, outcomes[0]) <= optimum
        return True

    def placed(job: Job, claims: list[ResourceClaim], outcomes: list, now: float) -> None:
        nonlocal used
        for o in outcomes:
            placed_at[o.claim] = now
            for index, nodes in holding.items():
                if index != job.index and o.node in nodes:
                    intruders.setdefault(index, []).append(f"{o.claim} ({job.gpus} {job.family} GPUs{', gang' if job.members else ''}) on {o.node}")
        weight = sum(_weight(engine.inventory.by_key[(r.driver, r.pool, r.device)]) for o in outcomes for r in o.allocation.devices.results)
        used += weight
        result.gpu_minutes += weight * job.duration
        departs[job.index] = next(order)
        heapq.heappush(timeline, (now + job.duration, 0, departs[job.index], (job.family, [o.claim for o in outcomes], weight, job.index)))
        if moving and not job.large:
            movable[claims[0].key] = claims[0]
            running[claims[0].key] = (job, now, weight)
        if job.large:
            result.large_waits.append(now - job.at)

    def enough_free(job: Job) -> bool:
        """Enough free GPUs of the family in total for the large claim (or gang), if not on one node."""
        gpu = _wants(job)[0][1]
        free = sum(1 for recs in by_node.values() for r in recs if gpu(r) and _free(engine, r))
        return free >= job.gpus * max(1, job.members)

    def move_for(job: Job, claims: list[ResourceClaim], now: float) -> bool:
        """Moves (engine/moves.py) for a large claim refused with enough free GPUs: the small claims in
        the way of the cheapest node (or domain) restart elsewhere, the claim takes the node. Locality
        is not counted for a claim placed so (the oracle saw no node with room)."""
        if not moving or not job.large or not enough_free(job):
            return False
        reserve_others(job)
        t0 = time.perf_counter()
        lost = {k: w * (now - start) for k, (_, start, w) in running.items()} if by_lost else None
        plan = engine.plan_moves(claims, movable, domain_label=_domain_label(job) if job.members else None, lost=lost)
        outcomes = engine.apply_moves(plan) if plan is not None else []
        result.engine_seconds += time.perf_counter() - t0
        if plan is None:
            return False
        result.moves += 1
        result.claims_moved += len(plan.moves)
        for move in plan.moves:
            moved, start, weight = running[move.claim]
            first_end.setdefault(move.claim, start + moved.duration)
            result.gpu_minutes_lost += weight * (now - start)
            running[move.claim] = (moved, now, weight)
            placed_at[move.claim] = now
            departs[moved.index] = next(order)  # it restarts: its whole duration from now
            heapq.heappush(timeline, (now + moved.duration, 0, departs[moved.index], (moved.family, [move.claim], weight, moved.index)))
        keys = set(plan.unit)
        placed(job, claims, [o for o in outcomes if o.claim in keys], now)
        return True

    def refuse(job: Job, claims: list[ResourceClaim], now: float) -> None:
        result.rejected += max(1, job.members)
        if not job.large:
            result.small_claims_rejected += 1
            overhang = [key for key, end in first_end.items() if end <= now]
            why = _why_small(engine, job, claims, by_node, overhang)
            result.small_why[why] += 1
            family = result.small_by_family.setdefault(job.family, dict.fromkeys(SMALL_WHY, 0))
            family[why] += 1
            return
        result.large_claims_rejected += 1
        # enough free GPUs of the family in total, but not on one node (or in one domain, for a
        # gang): the refusal is fragmentation, not a lack of capacity
        gpu = _wants(job)[0][1]
        free = sum(1 for recs in by_node.values() for r in recs if gpu(r) and _free(engine, r))
        enough = free >= job.gpus * max(1, job.members)
        result.large_rejected_with_enough_free_gpus += enough
        if enough:
            result.fragmented.append(
                _why_fragmented(
                    engine, job, by_node, gpu, holding.get(job.index, set()), ever_held.get(job.index, set()), intruders.get(job.index, []), placed_at
                )
            )
        if result.utilization_at_first_large_rejection is None:
            result.utilization_at_first_large_rejection = used / total_gpus

    def reserve_for_waiting() -> None:
        """Each waiting claim, oldest first, holds what is closest to fitting it, apart from the
        nodes held for older ones."""
        held.clear()
        holding.clear()
        avoid = 0
        names = engine.inventory.node_names
        for index, (job, claims) in waiting.items():
            bits = reservation_for(engine, claims, domain_label=_domain_label(job), avoid=avoid)
            held[index] = bits
            engine.reserve(bits)
            ranks = engine.placement.reserved_nodes
            holding[index] = {names[r] for r in range(len(names)) if (ranks >> r) & 1}
            ever_held.setdefault(index, set()).update(holding[index])
            avoid |= ranks

    def advance(until: float) -> None:
        nonlocal used
        while timeline and timeline[0][0] <= until:
            now, kind, seq, payload = heapq.heappop(timeline)
            if kind == 0:
                assert isinstance(payload, tuple)
                family, keys, weight, index = payload
                if departs.get(index) != seq:
                    continue  # a departure a move superseded (the claim restarted)
                del departs[index]
                for key in keys:
                    engine.release(key)
                    movable.pop(key, None)
                    running.pop(key, None)
                    first_end.pop(key, None)
                used -= weight
                for index, (job, claims) in list(waiting.items()):
                    if job.family == family and attempt(job, claims, now):
                        del waiting[index]
                        held.pop(index, None)
            elif kind == 2:  # moves tried `move_after` minutes into a wait
                assert isinstance(payload, Job)
                job = payload
                if job.index in waiting and move_for(job, waiting[job.index][1], now):
                    del waiting[job.index]
                    held.pop(job.index, None)
                    holding.pop(job.index, None)
            elif isinstance(payload, Job) and (job := payload).index in waiting:
                claims = waiting.pop(job.index)[1]
                held.pop(job.index, None)
                if not move_for(job, claims, now):
                    refuse(job, claims, now)
                holding.pop(job.index, None)
            if reserving and waiting:
                reserve_for_waiting()

    started = time.perf_counter()
    for job in jobs:
        advance(job.at)
        claims = job.claims()
        result.claims += len(claims)
        result.units += 1
        result.large_claims += job.large
        result.small_claims += not job.large
        if not attempt(job, claims, job.at) and not (early and job.max_wait > 0 and move_for(job, claims, job.at)):
            if job.max_wait > 0:
                waiting[job.index] = (job, claims)
                heapq.heappush(timeline, (job.at + job.max_wait, 1, next(order), job))
                at = move_after if move_after is not None else moves_from(job.max_wait, job.members > 0) if policy == "dralloc_moves" else None
                if moving and at is not None and 0 < at < job.max_wait:
                    heapq.heappush(timeline, (job.at + at, 2, next(order), job))
                if reserving:
                    reserve_for_waiting()
            elif not move_for(job, claims, job.at):
                refuse(job, claims, job.at)
        result.utilization_samples.append(used / total_gpus)
    advance(float("inf"))  # what still waits is placed or refused
    result.seconds = time.perf_counter() - started
    return result


def _fits_unheld(engine: Engine, claims: list[ResourceClaim]) -> bool:
    """Whether the claims would fit with every reservation, the held-node rules and kept-whole nodes
    lifted; the engine is left as it was (what the try took is given back, keep_whole's clock paused)."""
    placement = engine.placement
    kinds = placement.kinds
    reserved, rules, keep, factor = placement.reserved, placement.held_rules, kinds.keep, placement.keep_whole.factor
    placement.reserve(0)
    placement.held_rules, kinds.keep, placement.keep_whole.factor = False, None, 0.0
    try:
        outcomes = engine.allocate(claims)
        for outcome in outcomes:
            if outcome.status == "allocated":
                engine.release(outcome.claim)
    finally:
        placement.reserve(reserved)
        placement.held_rules, kinds.keep, placement.keep_whole.factor = rules, keep, factor
    return all(o.status == "allocated" for o in outcomes)


def _why_small(engine: Engine, job: Job, claims: list[ResourceClaim], by_node: dict[str, list], overhang: list[str]) -> str:
    """The class (`SMALL_WHY`) of a small claim refused now; `overhang`: the moved claims running past
    the end they had before their move (they hold their devices only because the move restarted them)."""
    if _fits_unheld(engine, claims):
        return "held"
    wants = _wants(job)
    free = {node: [sum(1 for r in recs if pred(r) and _free(engine, r)) for _, pred in wants] for node, recs in by_node.items()}

    def somewhere(counts: dict[str, list[int]]) -> bool:
        return any(all(c >= n for c, (n, _) in zip(row, wants)) for row in counts.values())

    if overhang and not somewhere(free):
        freed = {node: list(row) for node, row in free.items()}
        for key in overhang:
            allocation = engine.allocation_of(key)
            for r in allocation.devices.results if allocation is not None else ():
                rec = engine.inventory.by_key[(r.driver, r.pool, r.device)]
                for i, (_, pred) in enumerate(wants):
                    freed[rec.local_node][i] += bool(pred(rec))
        if somewhere(freed):
            return "restart_overhang"
    if sum(row[0] for row in free.values()) < wants[0][0]:
        return "family_full"
    return "other" if somewhere(free) else "fragmented"


def _why_fragmented(
    engine: Engine, job: Job, by_node: dict[str, list], gpu, holding: set[str], ever_held: set[str], intruders: list[str], placed_at: dict[str, float]
) -> dict:
    """A large refusal with enough free GPUs of the family in total, described: the free GPUs of
    the family per node (most first), the nodes held for the claim when its wait ended and, on
    each, the claims still there and when they came (before or after the wait began), the
    nodes it held at any time of its wait, and the claims placed on held nodes while it waited."""
    at = job.at
    free = {node: sum(1 for r in recs if gpu(r) and _free(engine, r)) for node, recs in by_node.items() if any(gpu(r) for r in recs)}
    on = engine.placement.kinds.claims
    held_now = {}
    for node in sorted(holding):
        claims = sorted(on.get(node, {}))
        held_now[node] = {
            "free": free.get(node, 0),
            "claims_there_before_the_wait": sum(1 for c in claims if placed_at.get(c, 0.0) <= at),
            "claims_placed_during_the_wait": sum(1 for c in claims if placed_at.get(c, 0.0) > at),
        }
    return {
        "job": job.index,
        "family": job.family,
        "gpus": job.gpus,
        "members": job.members,
        "free_total": sum(free.values()),
        "free_per_node": sorted((n for n in free.values() if n), reverse=True),
        "held_at_the_end": held_now,
        "nodes_held_during_the_wait": len(ever_held),
        "placed_on_held_nodes_during_the_wait": intruders,
    }


# --- numbers -------------------------------------------------------------------------------


def _minutes(value: float | None) -> float | None:
    """A wait in minutes as reported: two decimals (None, for no waits, stays None)."""
    return None if value is None else round(value, 2)


def summary(r: Result) -> dict:
    """One policy's numbers of one run, as stable JSON."""
    samples = r.utilization_samples
    first = r.utilization_at_first_large_rejection
    moved = {"moves": r.moves, "claims_moved": r.claims_moved, "gpu_hours_lost_to_moves": round(r.gpu_minutes_lost / 60, 1)} if r.moving else {}
    return {
        "rejected": r.rejected,
        "large_claims_rejected": r.large_claims_rejected,
        "large_rejected_with_enough_free_gpus": r.large_rejected_with_enough_free_gpus,
        "small_claims_rejected": r.small_claims_rejected,
        "large_waited": sum(1 for w in r.large_waits if w > 0),
        "large_wait_p50_min": _minutes(percentile(r.large_waits, 50)),
        "large_wait_p99_min": _minutes(percentile(r.large_waits, 99)),
        "mean_utilization": round(sum(samples) / len(samples), 4) if samples else 0.0,
        "gpu_hours_served": round(r.gpu_minutes / 60, 1),
        **moved,
        "multi_device_claims": r.multi_device,
        "locality_optimal_fraction": round(r.locality_optimal / r.multi_device, 4) if r.multi_device else 1.0,
        "utilization_at_first_large_rejection": None if first is None else round(first, 4),
        "engine_seconds": round(r.engine_seconds, 3),
        "units_per_second": round(r.units / r.engine_seconds, 1) if r.engine_seconds else 0.0,
        "small_claims_rejected_why": dict(r.small_why),
        "small_claims_rejected_why_by_family": {f: dict(r.small_by_family[f]) for f in sorted(r.small_by_family)},
        "large_rejected_with_enough_free_gpus_why": r.fragmented,
    }


def table_numbers(numbers: dict) -> dict:
    """One policy's numbers for a table (the CLI without --json): the small-claim classes one row
    each (`small_claims_rejected_why.family_full`, ...); the per-refusal descriptions and the
    per-family classes are left to the JSON."""
    out = {}
    for key, value in numbers.items():
        if key.endswith(("_why", "_by_family")) and key != "small_claims_rejected_why":
            continue
        if isinstance(value, dict):
            out.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            out[key] = value
    return out


def policies(moves: bool = False) -> tuple[str, ...]:
    """The policies a run goes through: the three, and with `moves` dralloc with moves (`MOVE_POLICIES`)."""
    return POLICIES + MOVE_POLICIES if moves else POLICIES


def measure_one(
    seed: int = 42,
    load: float = 0.9,
    jobs: int = 3000,
    max_wait: float = MAX_WAIT,
    keep_whole: float = 0.0,
    moves: bool = False,
    levers: dict | None = None,
) -> tuple[dict, dict[str, Result]]:
    """The policies over one trace: its numbers (one run of the JSON) and the raw results;
    `levers`: `run`'s move levers (move_after, reserve, by_lost), for the move policies only."""
    work = trace(seed, jobs, load, max_wait)
    results = {policy: run(work, policy, seed=seed, keep_whole=keep_whole, **(levers or {}) if policy in MOVE_POLICIES else {}) for policy in policies(moves)}
    scored = results["dralloc"]
    out: dict = {
        "seed": seed,
        "load": load,
        "units": scored.units,
        "claims": scored.claims,
        "large_claims": scored.large_claims,
        "small_claims": scored.small_claims,
    }
    for policy, r in results.items():
        out[policy] = summary(r)
    return out, results


def measure(
    seeds: list[int],
    loads: list[float],
    jobs: int = 3000,
    max_wait: float = MAX_WAIT,
    keep_whole: float = 0.0,
    moves: bool = False,
    levers: dict | None = None,
) -> dict:
    """Every seed at every load through the three policies (with `moves`, the two of
    `MOVE_POLICIES` too): `runs` (one object per seed and load) and `totals` (counts summed,
    waits pooled, utilization averaged over the runs, and dralloc, with moves too, against each
    comparator: `vs_kubernetes`, `vs_first_fit`, `dralloc_moves_vs_first_fit`, ...). `levers`:
    the move policies' levers (`run`), echoed as `move_levers`."""
    runs = []
    pooled: dict[str, list[Result]] = {p: [] for p in policies(moves)}
    for seed in seeds:
        for load in loads:
            numbers, results = measure_one(seed, load, jobs, max_wait, keep_whole, moves, levers)
            runs.append(numbers)
            for policy, r in results.items():
                pooled[policy].append(r)
    totals: dict = {"runs": len(runs)}
    for policy, results in pooled.items():
        waits = [w for r in results for w in r.large_waits]
        totals[policy] = {
            "large_claims": sum(r.large_claims for r in results),
            "large_claims_rejected": sum(r.large_claims_rejected for r in results),
            "large_rejected_with_enough_free_gpus": sum(r.large_rejected_with_enough_free_gpus for r in results),
            "runs_with_large_rejected_with_enough_free_gpus": sum(1 for r in results if r.large_rejected_with_enough_free_gpus),
            "small_claims": sum(r.small_claims for r in results),
            "small_claims_rejected": sum(r.small_claims_rejected for r in results),
            "small_claims_rejected_why": {why: sum(r.small_why[why] for r in results) for why in SMALL_WHY},
            "small_claims_rejected_why_by_family": {
                f: {why: sum(r.small_by_family.get(f, {}).get(why, 0) for r in results) for why in SMALL_WHY} for f in sorted(CAPACITY)
            },
            "rejected": sum(r.rejected for r in results),
            "large_wait_p50_min": _minutes(percentile(waits, 50)),
            "large_wait_p99_min": _minutes(percentile(waits, 99)),
            "mean_utilization": round(sum(summary(r)["mean_utilization"] for r in results) / len(results), 4) if results else 0.0,
            "gpu_hours_served": round(sum(r.gpu_minutes for r in results) / 60, 1),
        }
        if policy in MOVE_POLICIES:
            totals[policy]["moves"] = sum(r.moves for r in results)
            totals[policy]["claims_moved"] = sum(r.claims_moved for r in results)
            totals[policy]["gpu_hours_lost_to_moves"] = round(sum(r.gpu_minutes_lost for r in results) / 60, 1)
    for mine in ("dralloc", *(MOVE_POLICIES if moves else ())):
        ours = totals[mine]
        for other in ("kubernetes", "first_fit"):
            theirs = totals[other]
            totals[f"vs_{other}" if mine == "dralloc" else f"{mine}_vs_{other}"] = _versus(runs, mine, other, ours, theirs)
    return {
        "jobs": jobs,
        "max_wait_min": max_wait,
        "keep_whole": keep_whole,
        "moves": moves,
        **({"move_levers": levers} if moves and levers else {}),
        "nodes": sum(n for _, n in FLEET),
        "gpus": sum(CAPACITY.values()),
        "runs": runs,
        "totals": totals,
    }


def _versus(runs: list[dict], mine: str, other: str, ours: dict, theirs: dict) -> dict:
    """One of our policies' totals against a comparator's."""
    return {
        "large_claims_rejected_fewer": round(1 - ours["large_claims_rejected"] / theirs["large_claims_rejected"], 4)
        if theirs["large_claims_rejected"]
        else 0.0,
        "runs_with_more_large_rejected": sum(1 for run_ in runs if run_[mine]["large_claims_rejected"] > run_[other]["large_claims_rejected"]),
        "small_claims_rejected_more": round(ours["small_claims_rejected"] / theirs["small_claims_rejected"] - 1, 4) if theirs["small_claims_rejected"] else 0.0,
        "mean_utilization_lower": round(1 - ours["mean_utilization"] / theirs["mean_utilization"], 4) if theirs["mean_utilization"] else 0.0,
    }


def parse_seeds(text: str) -> list[int]:
    """`42`, `1-5` or `1,3,7-9` -> the seeds; ValueError naming what is wrong."""
    seeds: list[int] = []
    for part in text.split(","):
        part = part.strip()
        low, dash, high = part.partition("-")
        try:
            first, last = int(low), int(high) if dash else int(low)
        except ValueError:
            raise ValueError(f"seeds: {part!r} is not a number or a range like 1-5") from None
        if last < first:
            raise ValueError(f"seeds: the range {part!r} runs backwards")
        if last - first >= 1000:
            raise ValueError(f"seeds: the range {part!r} has more than 1000 seeds")
        seeds.extend(range(first, last + 1))
    return seeds


def parse_loads(text: str) -> list[float]:
    """`0.9` or `0.9,1.1` -> the loads; ValueError naming what is wrong."""
    loads = []
    for part in text.split(","):
        try:
            load = float(part)
        except ValueError:
            raise ValueError(f"loads: {part.strip()!r} is not a number") from None
        if not 0 < load <= 10:
            raise ValueError(f"loads: {part.strip()} is not in (0, 10]")
        loads.append(load)
    return loads


if __name__ == "__main__":
    import json
    import sys

    print(json.dumps(measure([42], [0.9], jobs=int(sys.argv[1]) if len(sys.argv) > 1 else 3000), indent=2))
