"""`dralloc bench pipeline`: the whole system as separate processes, claims sent as users send them.

What runs: a nats-server (JetStream, file storage, a fixed port after its
first start so it can be restarted in place) and the four services, each as
`python -m dralloc.cli run <service>`: discovery simulating a fleet of HGX
H100 nodes (8 GPUs each) and h200-sxm-mig nodes (each H200 also offered as
MIG partitions that share its counters, the real H200 MIG table; see Fleet
size), the
ingestor publishing the DeviceClasses of examples/, the allocator (two with
`--chaos`: active + standby) and the status writer (the local store, a KV
bucket).

Before any claim: `ready_s`, seconds from starting nats-server and the services to the
fleet on the bus, a probe claim committed and every service idle (`until_idle`, which
looks once a second): the allocator has followed the fleet from INVENTORY and warmed its
engine, discovery published it, the ingestor its classes.

How claims enter (the measured run): as a user's program sends them through
the client's submit path, `dralloc submit`'s `submit_paths`: each claim has
its own JSON manifest (written before the phase's clock runs: the harness's
work, as a user's files on disk), and every ~5 ms the files due are submitted
together (read, each claim decoded, validated and linted, given its uid,
published and its store awaited) over one connection kept open
(`Submitter`). Every tenth claim asks for a MIG slice (`mig.nvidia.com`, a
CEL selector on the 1g.18gb profile), the rest for one whole H100
(`gpu.nvidia.com`, a CEL selector on productName). Why this path and not the
ingestor service's file watch: that source re-reads every manifest of its
directories on each change and polls at an interval, so a directory filling
with thousands of claim files a second costs O(files) per poll and adds the
interval to every latency; and `dralloc submit` per batch starts a Python
process (~1.5 CPU seconds here, mostly imports: `/usr/bin/time dralloc
submit -f one.yaml`). The submit path does the ingestor's own per-claim work
(`dralloc.ingestor.sources.events_from_manifests`) in the user's process.

Each claim's latency runs from when it was due (start + i / rate: a
submitter that falls behind counts against it) to the status writer's stored
record (the server's timestamp of the KV put in `KV_dralloc-claims`); a claim
with no record by the end counts until the records are read (at least that
long: `latency_claims_without_record` says how many), never left out. Phases:

- latency: claims at `rate` per second for `duration` seconds -> p50_ms,
  p99_ms, and where the time went (`p50_ms_by_stage`: submit = offer to
  ClaimSubmitted stored, allocate = to AllocationCommitted stored, status = to
  the record; `allocate_p50_ms_by_second`: the allocate stage's p50 per second
  of the phase, by when the claims were offered);
- throughput: claims offered at `sustain_rate` per second (above what the
  system takes: `backlog_at_window_end` > `backlog_at_window_start`, claims in
  CLAIMS without a record, says so) for `sustain` seconds -> claims_per_second,
  records stored per second in the steady window (`sustained_window`: from the
  phase's first record plus a quarter, the warm-up, to the last of its claims
  entering CLAIMS; the drain after it, without the submitter's load, is left
  out); `cpu_s_in_window` per process (sampled every 0.5 s) and
  `runqueue_wait_s_in_window` (seconds its threads were runnable but waited
  for a CPU: a process starved by the machine, not idle on its own),
  `main_thread_cpu_s_in_window` (its main thread's, the event loop: the
  allocator's engine work runs in another thread, so the difference is the
  engine's), `cpu_ms_per_claim_by_process`: each one's CPU over the claims it finished
  in the window (the submitter: claims into CLAIMS, which run ahead of the
  rest when offered above capacity; the allocator: commits; the status
  writer, nats-server and the others: records stored), their sum
  `cpu_ms_per_claim_in_window` and claims_per_cpu_second = 1000 / that sum
  (the wall clock counts others' work on a shared machine; CPU seconds much
  less).

Then the bus's ceiling on the same server (`benchmarks/ceiling.py`): the same
chain of publishes, pull fetches, acks and a KV put with no work between ->
jetstream_ceiling_claims_per_second, and ratio_of_ceiling.

Fleet size: every claim keeps its device to the end (the benchmark deletes
none, so no release is mixed into what it measures), so the fleet holds every
claim with 10% to spare (`fleet_for`). Fewer devices would make the last
claims fail and wait (the failure path, not allocation); a toy fleet of a few
nodes would hide what a fleet costs per claim (ordering candidate nodes,
evaluating class selectors on devices seen for the first time).

With `chaos` (`run_chaos`): ClaimSubmitted published directly (retried
through restarts) at `rate`, then `burst` at once; during both the active
allocator is killed with SIGKILL every `kill_every` seconds (and started
again, as a standby) and nats-server is restarted every `restart_every`
seconds; afterwards ALLOCATIONS is read from the start and checked: every
submitted claim exactly one outcome (`lost`: none, `duplicated`: more than
one), no device committed to a claim while another live claim holds it
(`double_allocated_devices`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import os
import shutil
import sys
import tempfile
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import yaml

from dralloc.allocator import leader
from dralloc.bus import (
    Bus,
    LocalCluster,
    LocalServer,
    NatsError,
    StoredMessage,
    die_with_parent,
    until_jetstream_answers,
    wait_for_jetstream,
)
from dralloc.client.submit import submit_paths
from dralloc.ingestor.service import publish_until_stored
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim
from dralloc.schemas.status import DEFAULT_BUCKET, UnreadableStatus, decode_status, kv_key
from dralloc.stats import percentile

sys.path.insert(0, str(Path(__file__).resolve().parent))  # ceiling.py beside this file (also when run by `dralloc bench`)
from ceiling import measure as measure_ceiling  # noqa: E402
from ceiling import process_cpu_seconds  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
CLASSES = REPO / "examples" / "deviceclasses.yaml"
GPUS_PER_NODE = 8  # the h100-sxm profile
NAMESPACE = "bench"


@dataclass
class Options:
    rate: float = 1000.0
    """Claims per second offered in the latency phase."""
    duration: float = 5.0
    """Seconds of the latency phase."""
    sustain_rate: float = 4000.0
    """Claims per second offered in the throughput phase (above what the system takes: its backlog grows)."""
    sustain: float = 5.0
    """Seconds of the throughput phase; the rate is over its last three quarters (the first is warm-up)."""
    mig_every: int = 10
    """Every this many claims, one asks for a MIG slice (1g.18gb) instead of a whole GPU (0: none)."""
    ceiling: int = 20000
    """Messages through the bus-only chain (`benchmarks/ceiling.py`) after the pipeline (0: not measured)."""
    burst: int = 4000
    """With `chaos`: claims offered at once after the latency phase."""
    chaos: bool = False
    kill_every: float = 3.0
    restart_every: float = 7.0
    allocators: int = 1
    cluster: int = 1
    """nats-servers (3: a JetStream cluster, R3 streams, `--chaos` restarting one server at a time)."""
    settle_timeout: float = 120.0
    """After offering, how long to wait for every claim's outcome."""


# --- processes --------------------------------------------------------------------------


NatsServer = LocalServer
"""A nats-server with JetStream in a directory, restartable on its port and store: the bus's
(`dralloc.bus.LocalServer`), under the name the tests import."""


class Service:
    """One `dralloc run <name>` process, its output in a log file."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], root: Path) -> None:
        self.name, self.args, self.env, self.root = name, args, env, root
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0

    async def start(self) -> None:
        self.starts += 1
        log = open(self.root / f"{self.name}.{self.starts}.log", "wb")  # noqa: SIM115 (the child owns it)
        try:
            self.proc = await asyncio.create_subprocess_exec(
                sys.executable, "-m", "dralloc.cli", "run", *self.args,
                env={**os.environ, **self.env}, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                preexec_fn=die_with_parent,
            )  # fmt: skip
        finally:
            log.close()

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None and self.proc.returncode is None else None

    def peak_rss_mb(self) -> float | None:
        """The process's peak resident memory (Linux /proc), while it runs."""
        try:
            status = Path(f"/proc/{self.pid}/status").read_text()
        except (OSError, TypeError):
            return None
        kb = next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM:")), None)
        return None if kb is None else round(kb / 1024, 1)

    async def kill(self) -> None:
        if self.pid is not None:
            self.proc.kill()  # type: ignore[union-attr]
            await self.proc.wait()  # type: ignore[union-attr]

    async def stop(self) -> None:
        if self.pid is not None:
            self.proc.terminate()  # type: ignore[union-attr]
            try:
                await asyncio.wait_for(self.proc.wait(), 10)  # type: ignore[union-attr]
            except TimeoutError:
                await self.kill()


@dataclass
class Stack:
    """nats-server and the four services as processes, in a temp directory removed at the end."""

    nodes: int
    allocators: int = 1
    root: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="dralloc-bench-")))
    env: dict[str, str] = field(default_factory=dict)
    service_env: dict[str, dict[str, str]] = field(default_factory=dict)
    """Per service (discovery, ingestor, statuswriter, allocator): more variables, e.g. its NATS user."""
    nats_config: str | None = None
    nats_env: dict[str, str] = field(default_factory=dict)
    cluster: int = 1
    """nats-servers: more than one is a JetStream cluster on loopback (`dralloc.bus.LocalCluster`), the
    streams replicated on 3 of them (or all, if fewer), and a restart restarts one server at a time."""
    mig_nodes: int = 0
    """More nodes, of the h200-sxm-mig profile (each H200 also offered as MIG partitions sharing its
    counters: the real H200 MIG table), named mig-<i>; `nodes` are h100-sxm (whole GPUs), named node-<i>."""

    def __post_init__(self) -> None:
        if self.cluster > 1:
            self.nats = LocalCluster(self.root, self.cluster, self.nats_config, self.nats_env)
            self.env = {"DRALLOC_REPLICAS": str(min(3, self.cluster)), **self.env}
        else:
            self.nats = NatsServer(self.root, self.nats_config, self.nats_env)
        self.services: dict[str, Service] = {}

    async def __aenter__(self) -> Stack:
        fleet = self.root / "fleet.yaml"
        entries = [{"profile": "h100-sxm", "count": self.nodes, "prefix": "node"}]
        if self.mig_nodes:
            entries.append({"profile": "h200-sxm-mig", "count": self.mig_nodes, "prefix": "mig"})
        fleet.write_text(yaml.safe_dump(entries))
        await self.nats.start()
        url = self.nats.url
        if self.cluster > 1 and self.nats_config is None:  # (under auth the services wait for JetStream themselves)
            await wait_for_jetstream(url)
        env = {"DRALLOC_ALLOCATOR_LEASE_TTL": "2", "DRALLOC_ALLOCATOR_ACK_WAIT": "10", **self.env}
        specs = {
            "discovery": (["discovery"], {"DRALLOC_DISCOVERY_SOURCE": "fleet", "DRALLOC_DISCOVERY_FLEET": str(fleet),
                                          "DRALLOC_DISCOVERY_INTERVAL": "3600"}),
            "ingestor": (["ingestor", "-f", str(CLASSES), "--watch"], {"DRALLOC_INGESTOR_INTERVAL": "3600"}),
            "statuswriter": (["statuswriter"], {}),
            **{f"allocator-{i}": (["allocator"], {}) for i in range(self.allocators)},
        }  # fmt: skip
        for name, (args, extra) in specs.items():
            own = self.service_env.get(name.split("-")[0], {})
            self.services[name] = Service(name, [*args, "--nats-url", url], {**env, **extra, **own}, self.root)
        try:
            for service in self.services.values():
                await service.start()
        except BaseException:
            await self.__aexit__()
            raise
        return self

    async def __aexit__(self, *exc: object) -> None:
        await asyncio.gather(*(s.stop() for s in self.services.values()), return_exceptions=True)
        await self.nats.stop()
        shutil.rmtree(self.root, ignore_errors=True)

    def allocators_(self) -> list[Service]:
        return [s for n, s in self.services.items() if n.startswith("allocator-")]

    async def leader_pid(self, bus: Bus) -> int | None:
        """The pid in the leader lease (holders are host:pid:random)."""
        try:
            entry = await (await bus.key_value(leader.BUCKET)).get(leader.KEY)
        except Exception:
            return None
        return int(entry.value.decode().split(":")[1]) if entry.value else None

    async def ready(self, bus: Bus, timeout: float = 120.0) -> None:
        """The fleet is on the bus and a leader has rebuilt: a probe claim gets committed."""
        # made by the allocator (the stream owner), with the deployment's replicas; a cluster answers only once it has elected its leaders
        await until_jetstream_answers(bus, "bench", asyncio.Event(), bus.check_streams, timeout)
        async with asyncio.timeout(timeout):
            classes = sum(1 for doc in yaml.safe_load_all(CLASSES.read_text()) if doc)
            while True:
                nodes = await bus.subject_counts("INVENTORY", "dra.nodes.>")
                known = await bus.subject_counts("INVENTORY", "dra.deviceclasses.>")
                # the classes too: a probe that comes before its class fails first (two outcomes)
                if len(nodes) >= self.nodes + self.mig_nodes and len(known) >= classes:
                    break
                await asyncio.sleep(0.2)
            before = -1
            while (count := (await bus.stream_state("INVENTORY")).messages) != before:
                before = count
                await asyncio.sleep(0.5)  # the slices follow their nodes: wait for the stream to settle
            probe = claim_event("probe", gpus=1)
            await bus.publish(probe)
            reader = StreamReader(bus, "ALLOCATIONS")
            while not any(isinstance(m.event, ev.AllocationCommitted) for m in await reader.read_new()):
                await asyncio.sleep(0.1)


# --- reading streams with their timestamps -------------------------------------------------


def _epoch(msg: StoredMessage) -> float:
    """The server's timestamp of a stored message, in seconds since the epoch (0.0 if it gave none)."""
    return msg.time.timestamp() if msg.time is not None else 0.0


@dataclass
class Stored:
    seq: int
    time: float
    """The server's timestamp (seconds since the epoch)."""
    subject: str
    event: ev.Event | None
    headers: dict[str, str]


class StreamReader:
    """Reads a stream from the start, a little more on each call; survives server restarts.

    Each stored message is taken once, by its sequence: a reading consumer whose server restarts
    mid-scan may deliver what it delivered already (a replica's view of how far it got), and a
    read cut short keeps what it took (a read that raised is resumed after it, not before)."""

    def __init__(self, bus: Bus, stream: str) -> None:
        self.bus, self.stream = bus, stream
        self.next_seq = 1
        self.seen: list[Stored] = []

    async def read_new(self) -> list[Stored]:
        """What the stream stored since the last call (raises if the server is away: call again)."""
        first = len(self.seen)
        await self.bus.scan(self.stream, self.take, start_seq=self.next_seq)
        return self.seen[first:]

    def take(self, msg: StoredMessage) -> None:
        """One message the scan delivered, into `seen` unless it was taken already."""
        if msg.sequence < self.next_seq:
            return  # delivered again: the same stored message, not another
        try:
            event: ev.Event | None = ev.decode(msg.data)
        except ev.EventDecodeError:
            event = None
        self.seen.append(Stored(msg.sequence, _epoch(msg), msg.subject, event, msg.headers))
        self.next_seq = msg.sequence + 1


# --- claims and the check ------------------------------------------------------------------------


def claim_event(name: str, gpus: int = 1) -> ev.ClaimSubmitted:
    claim = msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": NAMESPACE, "uid": str(uuid.uuid4()), "generation": 1},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )  # fmt: skip
    return ev.ClaimSubmitted(claim=claim)


@dataclass
class Verdict:
    submitted: int
    outcomes: int
    lost: int
    duplicated: int
    double_allocated_devices: int
    latencies_ms: list[float]
    commit_times: list[float]
    duplicates: dict[str, list[str]] = field(default_factory=dict)
    """Each duplicated claim's outcomes, described (a failing check says what was written)."""


def check(claims: Iterable[Stored], allocations: Iterable[Stored], names: set[str] | None = None) -> Verdict:
    """Each submitted claim's outcomes in ALLOCATIONS, and devices held by two live claims at once.

    `names` limits the count to these claims (a phase of the run); devices are checked over everything.
    """
    submitted: dict[str, float] = {}
    for stored in claims:
        if isinstance(stored.event, ev.ClaimSubmitted) and stored.event.claim.metadata.namespace == NAMESPACE:
            submitted.setdefault(stored.event.claim.key, stored.time)
    outcomes: dict[str, list[Stored]] = {}
    holders: dict[tuple[str, str, str], str] = {}
    double = 0
    for stored in sorted(allocations, key=lambda s: s.seq):
        event = stored.event
        if isinstance(event, ev.AllocationCommitted | ev.AllocationFailed):
            outcomes.setdefault(event.key, []).append(stored)
        if isinstance(event, ev.AllocationCommitted) and event.allocation is not None:
            for result in event.allocation.devices.results or []:
                device = (result.driver, result.pool, result.device)
                if holders.get(device, event.key) != event.key:
                    double += 1
                holders[device] = event.key
        elif isinstance(event, ev.AllocationReleased):
            for device in [d for d, k in holders.items() if k == event.key]:
                del holders[device]
    keys = [k for k in submitted if names is None or k.split("/", 1)[1] in names]
    latencies, commits = [], []
    for key in keys:
        for stored in outcomes.get(key, [])[:1]:
            if isinstance(stored.event, ev.AllocationCommitted):
                latencies.append((stored.time - submitted[key]) * 1000)
                commits.append(stored.time)
    return Verdict(
        submitted=len(keys),
        outcomes=sum(1 for k in keys if k in outcomes),
        lost=sum(1 for k in keys if k not in outcomes),
        duplicated=sum(1 for k in keys if len(outcomes.get(k, [])) > 1),
        double_allocated_devices=double,
        latencies_ms=latencies,
        commit_times=sorted(commits),
        duplicates={k: [_outcome(s) for s in outcomes[k]] for k in keys if len(outcomes.get(k, [])) > 1},
    )


def _outcome(stored: Stored) -> str:
    """One outcome in words: its sequence, what it is, where or why, and the term that wrote it."""
    event, headers = stored.event, stored.headers or {}
    what = (
        f"committed on {event.node}"
        if isinstance(event, ev.AllocationCommitted)
        else f"failed ({getattr(event, 'reason', '')}: {getattr(event, 'message', '')})"
    )
    return f"#{stored.seq} {what}, epoch {headers.get('Dralloc-Epoch', '?')}, id {headers.get('Nats-Msg-Id', '?')}"


# --- the run ------------------------------------------------------------------------------------


async def offer(bus: Bus, names: list[str], rate: float | None, stop: asyncio.Event) -> None:
    """Publish a claim per name, `rate` per second (None: all at once), retrying through NATS restarts."""
    claims = [claim_event(name) for name in names]  # made before the clock runs: the harness's own work
    start = time.monotonic()
    tick = 0.01
    sent = 0
    in_flight: set[asyncio.Task] = set()
    while sent < len(names):
        due = len(names) if rate is None else min(len(names), int((time.monotonic() - start) * rate) + 1)
        for claim in claims[sent:due]:
            task = asyncio.create_task(publish_until_stored(bus, claim, stop))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)
            if len(in_flight) >= 512:  # bound the client's own backlog
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        sent = due
        if sent < len(names):
            await asyncio.sleep(tick)
    if in_flight:
        await asyncio.wait(in_flight)


async def chaos(stack: Stack, bus: Bus, options: Options, stop: asyncio.Event, log: list[str]) -> None:
    """Kill the active allocator (SIGKILL) and restart nats-server at intervals, until `stop`."""
    next_kill = time.monotonic() + options.kill_every
    next_restart = time.monotonic() + options.restart_every
    while not stop.is_set():
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), max(0.0, min(next_kill, next_restart) - time.monotonic()))
        if stop.is_set():
            return
        now = time.monotonic()
        if now >= next_kill:
            next_kill = now + options.kill_every
            pid = await stack.leader_pid(bus)
            for service in stack.allocators_():
                if service.pid is not None and service.pid == pid:
                    await service.kill()
                    log.append(f"{time.time():.3f} kill -9 allocator pid {pid}")
                    await service.start()  # back as a standby
        if now >= next_restart:
            next_restart = now + options.restart_every
            await stack.nats.restart()
            log.append(f"{time.time():.3f} restarted nats-server")


async def run_chaos(options: Options) -> dict[str, Any]:
    """The chaos run: ClaimSubmitted published directly (retried through restarts), then a burst; the invariants checked."""
    rate_claims = int(options.rate * options.duration)
    total = rate_claims + options.burst + 1
    nodes = math.ceil(total * 1.1 / GPUS_PER_NODE)  # room for every claim: outcomes are commits
    allocators = max(options.allocators, 2 if options.chaos else 1)
    events: list[str] = []
    async with Stack(nodes=nodes, allocators=allocators, cluster=options.cluster) as stack:
        bus = await Bus.connect(stack.nats.url, name="bench")
        try:
            await stack.ready(bus)
            stop_chaos = asyncio.Event()
            chaos_task = asyncio.create_task(chaos(stack, bus, options, stop_chaos, events)) if options.chaos else None
            never = asyncio.Event()
            paced = [f"rate-{i}" for i in range(rate_claims)]
            burst = [f"burst-{i}" for i in range(options.burst)]
            await offer(bus, paced, options.rate, never)
            await offer(bus, burst, None, never)
            if chaos_task is not None:
                await settle(bus, set(paced) | set(burst), options.settle_timeout)  # chaos goes on while the backlog drains
                stop_chaos.set()
                await chaos_task
            verdict_all = await settle(bus, set(paced) | set(burst), options.settle_timeout)
            peak_rss = {name: service.peak_rss_mb() for name, service in stack.services.items()}
            claims_seen = await _read_all(bus, "CLAIMS")
            allocations_seen = await _read_all(bus, "ALLOCATIONS")
        finally:
            await bus.close()
    paced_verdict = check(claims_seen, allocations_seen, set(paced))
    burst_verdict = check(claims_seen, allocations_seen, set(burst))
    times = burst_verdict.commit_times
    report: dict[str, Any] = {
        "claims_per_second": round((len(times) - 1) / (times[-1] - times[0]), 1) if len(times) > 1 and times[-1] > times[0] else None,
        "p50_ms": _round(percentile(paced_verdict.latencies_ms, 50)),
        "p99_ms": _round(percentile(paced_verdict.latencies_ms, 99)),
        "rate": options.rate,
        "duration_s": options.duration,
        "burst": options.burst,
        "nodes": nodes,
        "gpus": nodes * GPUS_PER_NODE,
        "allocators": allocators,
        "nats_servers": options.cluster,
        "peak_rss_mb": peak_rss,
    }
    if options.chaos:
        report.update(
            submitted=verdict_all.submitted,
            outcomes=verdict_all.outcomes,
            lost=verdict_all.lost,
            duplicated=verdict_all.duplicated,
            double_allocated_devices=verdict_all.double_allocated_devices,
            chaos_events=events,
        )
    return report


async def settle(bus: Bus, names: set[str], timeout: float) -> Verdict:
    """Wait (up to `timeout`) until every named claim has an outcome; the check over everything read."""
    claims, allocations = StreamReader(bus, "CLAIMS"), StreamReader(bus, "ALLOCATIONS")
    deadline = time.monotonic() + timeout
    while True:
        try:
            # Reading and decoding the streams costs the CPU the system is being measured on: only
            # once there can be an outcome for every claim (a count from the server) are they read.
            if (await bus.stream_state("ALLOCATIONS")).messages < len(names) and time.monotonic() < deadline:
                await asyncio.sleep(0.5)
                continue
            await claims.read_new()
            await allocations.read_new()
        except (NatsError, TimeoutError):
            await asyncio.sleep(0.5)  # the server is restarting
            continue
        verdict = check(claims.seen, allocations.seen, names)
        if verdict.lost == 0 or time.monotonic() > deadline:
            return verdict
        await asyncio.sleep(0.5)


async def _read_all(bus: Bus, stream: str) -> list[Stored]:
    reader = StreamReader(bus, stream)
    await reader.read_new()
    return reader.seen


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 2)


# --- the measured run: claims through the submit path, each ending at the status writer's record ---------


MIG_SELECTOR = "device.attributes['gpu.nvidia.com'].profile == '1g.18gb'"
GPU_SELECTOR = "device.attributes['gpu.nvidia.com'].productName == 'NVIDIA H100 80GB HBM3'"
MIG_SLICES_PER_NODE = 56
"""1g.18gb slices an h200-sxm-mig node holds at once (8 GPUs x 7)."""


def claim_manifest(name: str, mig: bool) -> dict[str, Any]:
    """A ResourceClaim as a user writes it (no uid: the submit path derives one): one whole H100
    (`gpu.nvidia.com`, a CEL selector on productName: that keeps whole-GPU claims off the MIG
    nodes' H200s, so a MIG node's GPUs stay for slices), or one MIG slice of profile 1g.18gb
    (`mig.nvidia.com`, a CEL selector on the profile)."""
    if mig:
        request = {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 1, "selectors": [{"cel": {"expression": MIG_SELECTOR}}]}}
    else:
        request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1, "selectors": [{"cel": {"expression": GPU_SELECTOR}}]}}
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [request]}},
    }  # fmt: skip


def is_mig(index: int, mig_every: int) -> bool:
    """Whether the `index`-th claim of a run asks for a MIG slice."""
    return mig_every > 0 and index % mig_every == mig_every - 1


def fleet_for(gpu_claims: int, mig_claims: int) -> tuple[int, int]:
    """(h100-sxm nodes, h200-sxm-mig nodes) holding every claim with 10% to spare: outcomes are commits.
    (Whole-GPU claims select H100s, MIG claims H200 slices: each kind has its own nodes.)"""
    nodes = math.ceil(gpu_claims * 1.1 / GPUS_PER_NODE)
    mig_nodes = math.ceil(mig_claims * 1.1 / MIG_SLICES_PER_NODE) + (1 if mig_claims else 0)
    return nodes, mig_nodes


SUBMIT_ATTEMPTS = 5
MEASURED_LEASE_TTL = 10.0
MEASURED_ACK_WAIT = 30.0
"""The allocator's own default (DRALLOC_ALLOCATOR_ACK_WAIT)."""


def server_pids(nats: Any) -> list[int]:
    """The running nats-server processes of a `LocalServer` or `LocalCluster`."""
    procs = getattr(nats, "procs", None) or [getattr(nats, "proc", None)]
    return [proc.pid for proc in procs if proc is not None and proc.returncode is None]


async def until_idle(pids: list[int | None], timeout: float, busy: float = 0.05) -> None:
    """Until the processes together use less than `busy` of a CPU over a second (or `timeout`).

    `Stack.ready` sees the fleet in INVENTORY and one claim committed; the allocator may still be
    applying the rest of the inventory then (it follows the stream live), and a claim that comes
    before its nodes fails first and is decided again: not what the run measures."""
    deadline = time.monotonic() + timeout
    before = sum(process_cpu_seconds(pid) for pid in pids)
    while time.monotonic() < deadline:
        await asyncio.sleep(1.0)
        now = sum(process_cpu_seconds(pid) for pid in pids)
        if now - before < busy:
            return
        before = now


def claims_directory(fallback: Path) -> Path:
    """Where the submitter writes its claim files: a fresh directory in memory (/dev/shm) where there
    is one, else under `fallback` (creating a file on this machine's ext4 costs ~0.4 ms of CPU,
    0.04 ms on tmpfs). Writing them is the harness's work, done before a phase's clock runs;
    reading them (the submit path) is measured."""
    shm = Path("/dev/shm")
    return Path(tempfile.mkdtemp(prefix="dralloc-claims-", dir=shm if shm.is_dir() and os.access(shm, os.W_OK) else fallback))


class Submitter:
    """Claims sent as a user's program sends them: each claim a JSON manifest in `directory`, a batch
    of files handed to the client's submit path (`dralloc submit`'s `submit_paths`: the file read, each
    object decoded, validated and linted, a uid derived, published and its store awaited) over one
    connection. A claim's offer time is when it was due (start + i / rate), so a submitter falling
    behind counts against the latency (no coordinated omission)."""

    def __init__(self, bus: Bus, directory: Path) -> None:
        self.bus, self.directory = bus, directory
        self.offered: dict[str, float] = {}
        """Claim name -> the wall-clock time it was due."""
        self.problems: list[str] = []
        self.batches = 0
        self.retries = 0
        """Batches submitted again after the server did not answer in time (as a user's program
        retries; the same claims keep their uids, so a retry of a stored claim is a duplicate)."""

    def write(self, names: list[str], mig_every: int, first_index: int) -> list[str]:
        """Each claim's manifest (`claim_manifest`, a MIG slice for every `mig_every`-th of the run)
        as a JSON file in `directory`; their paths. The harness's work: called before the clock runs,
        as the files a user wrote before submitting them (writing them while the services are
        measured took ~10% of this process's samples in the window: py-spy, loaded)."""
        paths = []
        for i, name in enumerate(names):
            path = self.directory / f"{name}.json"
            path.write_text(json.dumps(claim_manifest(name, is_mig(first_index + i, mig_every))))
            paths.append(str(path))
        return paths

    async def submit(self, paths: list[str]) -> None:
        """Submit a batch of claim files (retried, with the same files, when the server does not answer in time)."""
        self.batches += 1
        for attempt in range(SUBMIT_ATTEMPTS):
            try:
                await submit_paths(paths, None, self.problems.append, bus=self.bus)
                return
            except (NatsError, TimeoutError):
                if attempt == SUBMIT_ATTEMPTS - 1:
                    raise
                self.retries += 1
                await asyncio.sleep(0.1 * 2**attempt)

    async def offer(self, names: list[str], rate: float, mig_every: int, first_index: int = 0) -> tuple[float, float]:
        """Offer `names` at `rate` per second in batches (what is due every few ms: a JSON file per
        claim, the batch's files in one submit); returns the wall-clock (start, end) of the offering."""
        paths = self.write(names, mig_every, first_index)  # before the clock runs: the harness's own work
        start_wall, start = time.time(), time.monotonic()
        sent = 0
        in_flight: set[asyncio.Task[None]] = set()
        while sent < len(names):
            due = min(len(names), int((time.monotonic() - start) * rate) + 1)
            if due > sent:
                for i in range(sent, due):
                    self.offered[names[i]] = start_wall + i / rate
                task = asyncio.create_task(self.submit(paths[sent:due]))
                in_flight.add(task)
                task.add_done_callback(in_flight.discard)
                sent = due
                if len(in_flight) >= 64:  # bound the client's own backlog
                    await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
            await asyncio.sleep(0.005)
        end_wall = time.time()
        if in_flight:
            await asyncio.gather(*in_flight)
        return start_wall, end_wall


@dataclass
class Record:
    """A status writer's record as stored: the claim's name, its state and the server's timestamp."""

    name: str
    state: str
    time: float
    message: str = ""


async def read_records(bus: Bus, bucket: str, namespace: str = NAMESPACE) -> dict[str, Record]:
    """Every record of the status bucket about a claim in `namespace`, by claim name, stamped with the
    time the server stored it (each record's first store: the bucket keeps one per claim)."""
    prefix = f"$KV.{bucket}.{kv_key(namespace + '/')}"
    records: dict[str, Record] = {}

    def take(msg: StoredMessage) -> None:
        if not msg.subject.startswith(prefix) or not msg.data:
            return
        try:
            status = decode_status(msg.subject[len(f"$KV.{bucket}.") :], msg.data)
        except UnreadableStatus:
            return
        name = msg.subject[len(prefix) :]
        records.setdefault(name, Record(name, status.state, _epoch(msg), status.message))

    await bus.scan(f"KV_{bucket}", take)
    return records


async def wait_for_records(bus: Bus, bucket: str, count: int, timeout: float) -> None:
    """Until the bucket holds `count` records (a count from the server, read without decoding), or `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(NatsError, TimeoutError):
            if (await bus.stream_state(f"KV_{bucket}")).messages >= count:
                return
        await asyncio.sleep(0.25)


def latencies_ms(offered: dict[str, float], records: dict[str, Record], names: Iterable[str], until: float) -> list[float]:
    """Each named claim's time from its offer to its stored record, in ms. A claim offered but without a
    record counts until `until` (when the records were read): at least that long, so a pipeline that
    never finishes some claims shows in the percentiles instead of dropping them."""
    return [((records[n].time if n in records else until) - offered[n]) * 1000 for n in names if n in offered]


def handled_times(submitted: dict[str, float], committed: dict[str, float], records: dict[str, Record], names: Iterable[str]) -> dict[str, list[float]]:
    """When each process finished its part of each named claim (server times), by process kind: the
    submitter (`bench`) its entry into CLAIMS, the allocator its AllocationCommitted, the status writer
    (and nats-server, the discovery and the ingestor, counted per finished claim) its record."""
    names = list(names)
    stored = [records[n].time for n in names if n in records]
    return {
        "bench": [submitted[n] for n in names if n in submitted],
        "allocator": [committed[n] for n in names if n in committed],
        "statuswriter": stored,
        "nats-server": stored,
        "discovery": stored,
        "ingestor": stored,
    }


def cpu_ms_per_claim(cpu: tuple[float, float, dict[str, float]] | None, handled: dict[str, list[float]]) -> dict[str, float | None]:
    """Each process's CPU in the window per claim it handled in the window (`handled_times`, by the
    name's kind: ``allocator-0`` is an allocator): a submitter running ahead of the pipeline does
    more claims than are stored meanwhile, and its CPU is divided by those it did."""
    if cpu is None:
        return {}
    start, end, seconds = cpu
    result: dict[str, float | None] = {}
    for name, used in seconds.items():
        kind = "nats-server" if name.startswith("nats-server") else name.split("-")[0]
        count = sum(1 for t in handled.get(kind, []) if start <= t < end)
        result[name] = round(used * 1000 / count, 3) if count else None
    return result


def first_stored(stream: Iterable[Stored], kind: type) -> dict[str, float]:
    """Claim name (in `NAMESPACE`) -> when the first event of `kind` about it was stored (server time)."""
    first: dict[str, float] = {}
    for stored in stream:
        event = stored.event
        if isinstance(event, kind) and event.claim.metadata.namespace == NAMESPACE:  # type: ignore[attr-defined]
            first.setdefault(event.claim.metadata.name, stored.time)  # type: ignore[attr-defined]
    return first


def stage_latencies_ms(
    offered: dict[str, float], submitted: dict[str, float], committed: dict[str, float], records: dict[str, Record], names: Iterable[str]
) -> dict[str, list[float]]:
    """Where each named claim's time went, in ms: `submit` (offer to its ClaimSubmitted stored in CLAIMS),
    `allocate` (to its AllocationCommitted stored in ALLOCATIONS), `status` (to its stored record)."""
    stages: dict[str, list[float]] = {"submit": [], "allocate": [], "status": []}
    for name in names:
        if name in offered and name in submitted and name in committed and name in records:
            stages["submit"].append((submitted[name] - offered[name]) * 1000)
            stages["allocate"].append((committed[name] - submitted[name]) * 1000)
            stages["status"].append((records[name].time - committed[name]) * 1000)
    return stages


def p50_ms_by_second(offered: dict[str, float], start: dict[str, float], end: dict[str, float], names: Iterable[str]) -> list[float | None]:
    """Per second of a phase (by when each claim was offered, from the first offer), the p50 in ms of
    `end` - `start` over its claims that have both (None: none has). A one-time stall shows as seconds
    whose claims wait far longer than the rest (a backlog draining), a pipeline too slow for the rate
    as a wait that grows second by second."""
    names = [n for n in names if n in offered]
    if not names:
        return []
    first = min(offered[n] for n in names)
    seconds: dict[int, list[float]] = {}
    for name in names:
        if name in start and name in end:
            seconds.setdefault(int(offered[name] - first), []).append((end[name] - start[name]) * 1000)
    last = int(max(offered[n] for n in names) - first)
    return [_round(percentile(seconds[i], 50)) if i in seconds else None for i in range(last + 1)]


def sustained_window(submitted: dict[str, float], records: dict[str, Record], names: Iterable[str]) -> tuple[float, float] | None:
    """The steady part of the throughput phase (server times): from the first of `names`' records plus a
    quarter of the phase (warm-up) to the last of them entering CLAIMS (after it, the services only
    drain the backlog, without the submitter's load). None when there is no such span."""
    names = list(names)
    ends = [submitted[n] for n in names if n in submitted]
    firsts = [records[n].time for n in names if n in records]
    if not ends or not firsts:
        return None
    first, end = min(firsts), max(ends)
    start = first + (end - first) / 4
    return (start, end) if end > start else None


CpuSample = tuple[float, dict[str, float]]


def runqueue_seconds(schedstats: Iterable[str]) -> float:
    """Seconds a process's threads spent runnable but waiting for a CPU, from each thread's
    ``/proc/<pid>/task/<tid>/schedstat`` (on-CPU ns, runqueue-wait ns, timeslices); lines that do
    not parse count as 0. On a shared machine this tells a process starved of CPU (long waits)
    from one idle on its own (waiting for I/O or a lock: neither runs nor waits here)."""
    total = 0
    for text in schedstats:
        fields = text.split()
        if len(fields) >= 2 and fields[1].isdigit():
            total += int(fields[1])
    return total / 1e9


def process_runqueue_seconds(pid: int | None) -> float:
    """`runqueue_seconds` of a live process (Linux /proc); 0.0 once it is gone, or without schedstat."""
    if pid is None:
        return 0.0
    texts = []
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                texts.append((task / "schedstat").read_text())
    return runqueue_seconds(texts)


def main_thread_seconds(pid: int | None) -> float:
    """Seconds a live process's main thread has been on a CPU (its ``schedstat``'s first field; Linux
    /proc); 0.0 once it is gone. In a service that is its event loop: the allocator's engine work runs
    in another thread, so the two tell the shell's CPU from the engine's."""
    if pid is None:
        return 0.0
    try:
        fields = Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()
    except OSError:
        return 0.0
    return int(fields[0]) / 1e9 if fields and fields[0].isdigit() else 0.0


async def sample_cpu(
    pids: dict[str, int | None],
    stop: asyncio.Event,
    samples: list[CpuSample],
    every: float = 0.5,
    waits: list[CpuSample] | None = None,
    loops: list[CpuSample] | None = None,
) -> None:
    """Every `every` seconds until `stop`: (wall time, CPU seconds so far of each process and of this
    one) into `samples`, the same processes' `process_runqueue_seconds` so far into `waits`, and their
    `main_thread_seconds` into `loops`."""
    everyone = pids | {"bench": os.getpid()}
    while True:
        now = time.time()
        samples.append((now, {name: process_cpu_seconds(pid) for name, pid in pids.items()} | {"bench": time.process_time()}))
        if waits is not None:
            waits.append((now, {name: process_runqueue_seconds(pid) for name, pid in everyone.items()}))
        if loops is not None:
            loops.append((now, {name: main_thread_seconds(pid) for name, pid in everyone.items()}))
        if stop.is_set():
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every)


def cpu_between(samples: list[CpuSample], start: float, end: float) -> tuple[float, float, dict[str, float]] | None:
    """(from, to, CPU seconds per process) between the first and the last sample inside [start, end]."""
    inside = [sample for sample in samples if start <= sample[0] <= end]
    if len(inside) < 2:
        return None
    (t0, first), (t1, last) = inside[0], inside[-1]
    return t0, t1, {name: round(last[name] - first.get(name, 0.0), 2) for name in last}


def leader_terms(allocations: Iterable[Stored]) -> int:
    """How many leader terms (``Dralloc-Epoch``) wrote the decisions: 1 unless a leader stepped down."""
    return len({s.headers.get("Dralloc-Epoch") for s in allocations if isinstance(s.event, ev.AllocationCommitted | ev.AllocationFailed)})


def window_rate(times: Iterable[float], start: float, end: float) -> float | None:
    """Events per second with a time in [start, end)."""
    if end <= start:
        return None
    return sum(1 for t in times if start <= t < end) / (end - start)


def backlog_at(offered: dict[str, float], records: dict[str, Record], names: Iterable[str], at: float) -> int:
    """Of `names`, how many were offered by `at` and had no stored record yet."""
    return sum(1 for n in names if offered.get(n, math.inf) <= at and (n not in records or records[n].time > at))


async def run(options: Options) -> dict[str, Any]:
    """`dralloc bench pipeline`: the measured run (see the module docstring); with `chaos`, `run_chaos`."""
    if options.chaos:
        return await run_chaos(options)
    paced = [f"rate-{i}" for i in range(int(options.rate * options.duration))]
    sustained = [f"sustain-{i}" for i in range(int(options.sustain_rate * options.sustain))]
    everything = paced + sustained
    mig_claims = sum(1 for i in range(len(everything)) if is_mig(i, options.mig_every))
    nodes, mig_nodes = fleet_for(len(everything) - mig_claims + 1, mig_claims)  # (+1: the readiness probe)
    # Not the fault tests' short lease (2 s) and ack wait (10 s): on a shared machine a starved leader
    # misses a 2 s renewal, and a claim waiting behind a backlog is redelivered after 10 s and decided
    # again (its write then fenced as a stale view); either ends the term and the next one rebuilds,
    # which is then what gets measured. `leader_terms` shows whether it happened all the same.
    timing = {"DRALLOC_ALLOCATOR_LEASE_TTL": str(MEASURED_LEASE_TTL), "DRALLOC_ALLOCATOR_ACK_WAIT": str(MEASURED_ACK_WAIT)}
    started = time.monotonic()
    async with Stack(nodes=nodes, mig_nodes=mig_nodes, allocators=max(1, options.allocators), cluster=options.cluster, env=timing) as stack:
        manifests = claims_directory(stack.root)
        bus = await Bus.connect(stack.nats.url, name="bench")
        try:
            await stack.ready(bus)
            await until_idle([s.pid for s in stack.services.values()], options.settle_timeout)
            ready = time.monotonic() - started
            submitter = Submitter(bus, manifests)
            await submitter.offer(paced, options.rate, options.mig_every)
            await wait_for_records(bus, DEFAULT_BUCKET, len(paced) + 1, options.settle_timeout)
            pids = {name: service.pid for name, service in stack.services.items()}
            pids |= {f"nats-server-{i}": pid for i, pid in enumerate(server_pids(stack.nats))}
            samples: list[CpuSample] = []
            waits: list[CpuSample] = []
            loops: list[CpuSample] = []
            sampled = asyncio.Event()
            sampler = asyncio.create_task(sample_cpu(pids, sampled, samples, waits=waits, loops=loops))
            await submitter.offer(sustained, options.sustain_rate, options.mig_every, first_index=len(paced))
            await wait_for_records(bus, DEFAULT_BUCKET, len(everything) + 1, options.settle_timeout)
            sampled.set()
            await sampler
            read_at = time.time()
            records = await read_records(bus, DEFAULT_BUCKET)
            allocations = await _read_all(bus, "ALLOCATIONS")
            submitted = first_stored(await _read_all(bus, "CLAIMS"), ev.ClaimSubmitted)
            committed = first_stored(allocations, ev.AllocationCommitted)
            stages = stage_latencies_ms(submitter.offered, submitted, committed, records, paced)
            terms = leader_terms(allocations)
            peak_rss = {name: service.peak_rss_mb() for name, service in stack.services.items()}
            ceiling = None
            if options.ceiling > 0:
                payload = ev.encode(claim_event("ceiling-payload"))
                ceiling = await measure_ceiling(bus, payload, options.ceiling, DEFAULT_BUCKET, server_pids(stack.nats))
        finally:
            await bus.close()
            shutil.rmtree(manifests, ignore_errors=True)
    window = sustained_window(submitted, records, sustained)
    warm, end = window if window is not None else (0.0, 0.0)
    times = [records[n].time for n in sustained if n in records]
    rate = window_rate(times, warm, end)
    latencies = latencies_ms(submitter.offered, records, paced, read_at)
    cpu = cpu_between(samples, warm, end)
    cpu_window = cpu[2] if cpu is not None else {}
    waited = cpu_between(waits, warm, end)
    looped = cpu_between(loops, warm, end)
    per_claim = cpu_ms_per_claim(cpu, handled_times(submitted, committed, records, sustained))
    per_claim_total = sum(v for v in per_claim.values() if v is not None) if per_claim and None not in per_claim.values() else None
    states: dict[str, int] = {}
    for name in everything:
        state = records[name].state if name in records else "missing"
        states[state] = states.get(state, 0) + 1
    ceiling_rate = None if ceiling is None else ceiling["claims_per_second"]
    return {
        "ready_s": round(ready, 1),
        "claims_per_second": _round(rate),
        "jetstream_ceiling_claims_per_second": ceiling_rate,
        "ratio_of_ceiling": round(rate / ceiling_rate, 3) if rate and ceiling_rate else None,
        "p50_ms": _round(percentile(latencies, 50)),
        "p99_ms": _round(percentile(latencies, 99)),
        "latency_claims_without_record": sum(1 for n in paced if n not in records),
        "p50_ms_by_stage": {stage: _round(percentile(values, 50)) for stage, values in stages.items()},
        "p99_ms_by_stage": {stage: _round(percentile(values, 99)) for stage, values in stages.items()},
        "allocate_p50_ms_by_second": p50_ms_by_second(submitter.offered, submitted, committed, paced),
        "rate": options.rate,
        "duration_s": options.duration,
        "sustain_rate": options.sustain_rate,
        "sustain_s": options.sustain,
        "window_s": round(end - warm, 2),
        "submitted_per_second_in_window": _round(window_rate([submitted[n] for n in sustained if n in submitted], warm, end)),
        "backlog_at_window_start": backlog_at(submitted, records, sustained, warm),
        "backlog_at_window_end": backlog_at(submitted, records, sustained, end),
        "outcomes": states,
        "not_allocated": sorted({f"{r.state}: {r.message[:200]}" for n in everything if (r := records.get(n)) is not None and r.state != "allocated"})[:3],
        "submit_problems": len(submitter.problems),
        "mig_claims": mig_claims,
        "nodes": nodes,
        "mig_nodes": mig_nodes,
        "gpus": (nodes + mig_nodes) * GPUS_PER_NODE,
        "allocators": max(1, options.allocators),
        "leader_terms": terms,
        "nats_servers": options.cluster,
        "cpu_s_in_window": cpu_window,
        "runqueue_wait_s_in_window": waited[2] if waited is not None else {},
        "main_thread_cpu_s_in_window": looped[2] if looped is not None else {},
        "cpu_ms_per_claim_by_process": per_claim,
        "cpu_ms_per_claim_in_window": None if per_claim_total is None else round(per_claim_total, 3),
        "claims_per_cpu_second": round(1000 / per_claim_total, 1) if per_claim_total else None,
        "submit_retries": submitter.retries,
        "ceiling": ceiling,
        "peak_rss_mb": peak_rss,
    }


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report for people: (metric, value) rows."""
    return [(key, str(value)) for key, value in report.items() if key not in ("chaos_events", "ceiling")]


if __name__ == "__main__":  # python benchmarks/pipeline.py [--chaos]
    print(json.dumps(asyncio.run(run(Options(chaos="--chaos" in sys.argv))), indent=2))
