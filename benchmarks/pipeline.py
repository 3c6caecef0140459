"""`dralloc bench pipeline`: the whole system as separate processes, claims offered at a rate.

What runs: a nats-server (JetStream, file storage, a fixed port after its
first start so it can be restarted in place) and the four services, each as
`python -m dralloc.cli run <service>`: discovery simulating a fleet of
HGX H100 nodes (8 GPUs each, enough for every claim of the run; see Fleet
size), the
ingestor publishing the DeviceClasses of examples/, the allocator (two with
`--chaos`: active + standby) and the status writer. The benchmark itself
offers the claims, one-GPU ResourceClaims published as `ClaimSubmitted` (as
the ingestor or `dralloc submit` would), so their rate is exact.

Two phases, both measured from the server's own timestamps (the stream time
of each ClaimSubmitted and of the claim's AllocationCommitted), so the
benchmark's own delays do not count:

- latency: claims at `rate` per second for `duration` seconds -> p50_ms, p99_ms;
- throughput: `burst` claims offered at once (more than the system can take)
  -> claims_per_second, commits over the time from the first to the last.

Fleet size: every claim asks for one GPU and keeps it to the end (the
benchmark deletes none, so no release is mixed into what it measures), so the
fleet holds every claim with 10% to spare: 9,001 claims at the defaults ->
1,238 nodes, 9,904 GPUs. Fewer GPUs would make the last claims fail and wait
(the failure path, not allocation); a toy fleet of a few nodes would hide what
a fleet costs per claim (ordering candidate nodes, evaluating class selectors
on devices seen for the first time). The spare 10% keeps the last claims from
searching a nearly full fleet, which a real cluster avoids too.

With `chaos`, during both phases the active allocator is killed with SIGKILL
every `kill_every` seconds (and started again, as a standby) and nats-server
is restarted every `restart_every` seconds; afterwards ALLOCATIONS is read
from the start and checked: every submitted claim exactly one outcome
(`lost`: none, `duplicated`: more than one), no device committed to a claim
while another live claim holds it (`double_allocated_devices`).
"""

from __future__ import annotations

import asyncio
import contextlib
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
    AckPolicy,
    Bus,
    ConsumerConfig,
    DeliverPolicy,
    LocalCluster,
    LocalServer,
    NatsError,
    die_with_parent,
    until_jetstream_answers,
    wait_for_jetstream,
)
from dralloc.ingestor.service import publish_until_stored
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim
from dralloc.stats import percentile

REPO = Path(__file__).resolve().parents[1]
CLASSES = REPO / "examples" / "deviceclasses.yaml"
GPUS_PER_NODE = 8  # the h100-sxm profile
NAMESPACE = "bench"


@dataclass
class Options:
    rate: float = 1000.0
    duration: float = 5.0
    burst: int = 4000
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

    def __post_init__(self) -> None:
        if self.cluster > 1:
            self.nats = LocalCluster(self.root, self.cluster, self.nats_config, self.nats_env)
            self.env = {"DRALLOC_REPLICAS": str(min(3, self.cluster)), **self.env}
        else:
            self.nats = NatsServer(self.root, self.nats_config, self.nats_env)
        self.services: dict[str, Service] = {}

    async def __aenter__(self) -> Stack:
        fleet = self.root / "fleet.yaml"
        fleet.write_text(yaml.safe_dump([{"profile": "h100-sxm", "count": self.nodes, "prefix": "node"}]))
        await self.nats.start()
        url = self.nats.url
        if self.cluster > 1 and self.nats_config is None:  # (under auth the services wait for JetStream themselves)
            await wait_for_jetstream(url)
        env = {"DRALLOC_ALLOCATOR_LEASE_TTL": "2", "DRALLOC_ALLOCATOR_ACK_WAIT": "10", **self.env}
        specs = {
            "discovery": (["discovery"], {"DRALLOC_DISCOVERY_SOURCE": "fleet", "DRALLOC_DISCOVERY_FLEET": str(fleet),
                                          "DRALLOC_DISCOVERY_MIG": "false", "DRALLOC_DISCOVERY_INTERVAL": "3600"}),
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
                nodes = await bus.js.stream_info("INVENTORY", subjects_filter="dra.nodes.>")
                known = await bus.js.stream_info("INVENTORY", subjects_filter="dra.deviceclasses.>")
                # the classes too: a probe that comes before its class fails first (two outcomes)
                if len(nodes.state.subjects or {}) >= self.nodes and len(known.state.subjects or {}) >= classes:
                    break
                await asyncio.sleep(0.2)
            before = -1
            while (count := (await bus.js.stream_info("INVENTORY")).state.messages) != before:
                before = count
                await asyncio.sleep(0.5)  # the slices follow their nodes: wait for the stream to settle
            probe = claim_event("probe", gpus=1)
            await bus.publish(probe)
            reader = StreamReader(bus, "ALLOCATIONS")
            while not any(isinstance(m.event, ev.AllocationCommitted) for m in await reader.read_new()):
                await asyncio.sleep(0.1)


# --- reading streams with their timestamps -------------------------------------------------


@dataclass
class Stored:
    seq: int
    time: float
    """The server's timestamp (seconds since the epoch)."""
    subject: str
    event: ev.Event | None
    headers: dict[str, str]


class StreamReader:
    """Reads a stream from the start, a little more on each call; survives server restarts."""

    def __init__(self, bus: Bus, stream: str) -> None:
        self.bus, self.stream = bus, stream
        self.next_seq = 1
        self.seen: list[Stored] = []

    async def read_new(self) -> list[Stored]:
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self.next_seq,
            ack_policy=AckPolicy.NONE, inactive_threshold=10.0, mem_storage=True,
        )  # fmt: skip
        new: list[Stored] = []
        sub = await self.bus.js.pull_subscribe("", durable=None, stream=self.stream, config=config)
        try:
            pending = (await sub.consumer_info()).num_pending
            while pending > 0:
                for msg in await sub.fetch(min(pending, 2000), timeout=5.0):
                    pending = msg.metadata.num_pending
                    try:
                        event: ev.Event | None = ev.decode(msg.data)
                    except ev.EventDecodeError:
                        event = None
                    meta = msg.metadata
                    new.append(Stored(meta.sequence.stream, meta.timestamp.timestamp(), msg.subject, event, dict(msg.headers or {})))
                    self.next_seq = meta.sequence.stream + 1
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        self.seen += new
        return new


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
    )


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


async def run(options: Options) -> dict[str, Any]:
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
            if (await bus.js.stream_info("ALLOCATIONS")).state.messages < len(names) and time.monotonic() < deadline:
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


def summary_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The report for people: (metric, value) rows."""
    return [(key, str(value)) for key, value in report.items() if key != "chaos_events"]


if __name__ == "__main__":  # python benchmarks/pipeline.py [--chaos]
    import json

    print(json.dumps(asyncio.run(run(Options(chaos="--chaos" in sys.argv))), indent=2))
