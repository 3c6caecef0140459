"""`dralloc bench pipeline --hostile`: a fixed hostile corpus against the services as processes under auth.conf.

What runs: `pipeline.Stack` (nats-server and the four services as processes),
with infra/nats/auth.conf and one per-node discovery user, every service
connecting as its own user. A `Harness` holds an admin connection and knows
which valid claims run on which devices; `ATTACKS` is the corpus: each attack
uses one credential (the one an attacker would hold: a node's discovery
credential, the ingestor's, any service's) to send what a service must survive:
oversized and deeply nested messages, forged decisions, events filed under
another object's subject, JetStream API calls out of the user's lane, a
resubmission inside the duplicate window, odd names, an allocation naming
another claim's device, an expensive selector, credentials in URLs.

After every attack `Harness.verify` checks what must hold (issue #11, "Done
means"): every service process alive and deciding (a fresh valid claim decided
within `DECIDE_WITHIN_S`), no device held by two live claims, no running claim's
devices changed, nothing lost or duplicated, no traceback and no password in
any log. The tests in tests/hostile/ run the attacks one by one and assert
each of these; the benchmark (`run`) interleaves the whole corpus with a
stream of valid claims and reports the counts.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import secrets
import sys
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pipeline.py beside this file (also when run by `dralloc bench`)
from pipeline import NAMESPACE, Stack, StreamReader, check, claim_event  # noqa: E402

from dralloc import natsauth  # noqa: E402
from dralloc.bus import Bus, NatsError  # noqa: E402
from dralloc.schemas import events as ev  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
AUTH = REPO / "infra" / "nats" / "auth.conf"
SERVICES = ("discovery", "ingestor", "allocator", "statuswriter")
USERS = (*SERVICES, "admin")
HOSTILE = "hostile"
"""The namespace of the attacks' claims (valid claims are in `pipeline.NAMESPACE`)."""
DECIDE_WITHIN_S = 10.0
NODE_USER = "node-0"
"""The node whose per-node discovery user the attacks hold (the fleet's first node)."""


def _secret(user: str) -> str:
    return f"pw-{user}-{secrets.token_hex(8)}"


@dataclass
class Credentials:
    """The passwords of this run (random, so that finding one in a log is proof of a leak)."""

    passwords: dict[str, str] = field(default_factory=lambda: {u: _secret(u) for u in (*USERS, f"discovery-{NODE_USER}")})

    def server_env(self) -> dict[str, str]:
        env = {f"DRALLOC_{u.upper()}_NATS_PASSWORD": self.passwords[u] for u in USERS}
        env[natsauth.node_password_variable(NODE_USER)] = self.passwords[f"discovery-{NODE_USER}"]
        return env

    def service_env(self) -> dict[str, dict[str, str]]:
        return {s: {"NATS_USER": s, "NATS_PASSWORD": self.passwords[s]} for s in SERVICES}

    def url(self, base: str, user: str) -> str:
        """`base` with `user`'s credentials in it (as an operator might configure NATS_URL)."""
        urls = []
        for one in base.split(","):  # a cluster: every server's URL
            scheme, rest = one.split("://", 1)
            urls.append(f"{scheme}://{user}:{self.passwords[user]}@{rest}")
        return ",".join(urls)


def secured_stack(nodes: int, allocators: int, credentials: Credentials, root: Path | None = None, cluster: int = 1) -> Stack:
    """`pipeline.Stack` under infra/nats/auth.conf (with `NODE_USER`'s discovery user), each service as its
    user; `cluster` nats-servers (3: a JetStream cluster with R3 streams)."""
    extra: dict[str, Any] = {} if root is None else {"root": root}
    stack = Stack(
        nodes=nodes,
        allocators=allocators,
        cluster=cluster,
        nats_config="include ./auth.conf\n",
        nats_env=credentials.server_env(),
        service_env=credentials.service_env(),
        **extra,
    )
    (stack.root / "auth.conf").write_text(natsauth.with_node_users(AUTH.read_text(), [NODE_USER]))
    return stack


# --- the harness ---------------------------------------------------------------------------------


@dataclass
class Outcome:
    """What an attack did: messages sent, and what the server refused."""

    sent: int = 0
    refused: list[str] = field(default_factory=list)
    stored: list[str] = field(default_factory=list)


class Harness:
    """The stack, an admin connection, and what must hold after every attack."""

    def __init__(self, stack: Stack, credentials: Credentials, admin: Bus) -> None:
        self.stack, self.credentials, self.admin = stack, credentials, admin
        self.claims, self.allocations = StreamReader(admin, "CLAIMS"), StreamReader(admin, "ALLOCATIONS")
        self.valid: set[str] = set()
        """Names (in `pipeline.NAMESPACE`) of the valid claims submitted: each must get one outcome."""
        self.max_stall_s = 0.0
        self.restarted: list[str] = []
        self._probes = 0

    async def connect_as(self, user: str) -> Bus:
        return await Bus.connect(self.credentials.url(self.stack.nats.url, user), name=f"hostile-{user}", timeout=5)

    # what runs ---------------------------------------------------------------------------------

    async def holders(self) -> dict[str, tuple[str, ...]]:
        """Live committed claims -> their devices (driver/pool/device), from ALLOCATIONS."""
        await self.allocations.read_new()
        held: dict[str, tuple[str, ...]] = {}
        for stored in self.allocations.seen:
            event = stored.event
            if isinstance(event, ev.AllocationCommitted):
                results = event.allocation.devices.results if event.allocation is not None else []
                held[event.key] = tuple(sorted(f"{r.driver}/{r.pool}/{r.device}" for r in results or []))
            elif isinstance(event, ev.AllocationReleased | ev.AllocationFailed):
                held.pop(event.key, None)
        return held

    async def decided(self, key: str, uid: str, timeout: float) -> ev.Event | None:
        """The first decision (committed or failed) for claim `key` with `uid`, waiting up to `timeout`."""
        deadline = time.monotonic() + timeout
        seen = 0
        while True:
            await self.allocations.read_new()
            for stored in self.allocations.seen[seen:]:
                event = stored.event
                if isinstance(event, ev.AllocationCommitted | ev.AllocationFailed) and event.key == key and event.uid == uid:
                    return event
            seen = len(self.allocations.seen)
            if time.monotonic() > deadline:
                return None
            await asyncio.sleep(0.1)

    async def submit_valid(self, name: str) -> float | None:
        """Submit a valid one-GPU claim; seconds until it is decided (None: not within `DECIDE_WITHIN_S`)."""
        event = claim_event(name)
        self.valid.add(name)
        start = time.monotonic()
        await self.admin.publish(event)
        decision = await self.decided(event.claim.key, event.claim.metadata.uid or "", DECIDE_WITHIN_S)
        took = time.monotonic() - start
        self.max_stall_s = max(self.max_stall_s, took)
        return took if decision is not None else None

    def logs(self) -> dict[str, str]:
        return {p.name: p.read_text(errors="replace") for p in sorted(self.stack.root.glob("*.log")) if not p.name.startswith("nats-server")}

    async def revive(self) -> list[str]:
        """Start again any service process that died (counted in `restarted`): the supervisor's job."""
        died = [name for name, s in self.stack.services.items() if s.proc is not None and s.proc.returncode is not None]
        for name in died:
            self.restarted.append(name)
            await self.stack.services[name].start()
        return died

    async def verify(self, running_before: dict[str, tuple[str, ...]]) -> list[str]:
        """What does not hold after an attack (empty: everything does). See the module docstring."""
        problems: list[str] = []
        for name, service in self.stack.services.items():
            if service.proc is None or service.proc.returncode is not None:
                logs = sorted(self.stack.root.glob(f"{name}.*.log"))
                tail = logs[-1].read_text(errors="replace")[-400:] if logs else ""
                problems.append(f"{name} is not running (exit {service.proc.returncode if service.proc else None}): {tail}")
        self._probes += 1
        took = await self.submit_valid(f"probe-{self._probes}")
        if took is None:
            problems.append(f"a valid claim submitted after the attack was not decided within {DECIDE_WITHIN_S:g}s")
        await self.claims.read_new()
        await self.allocations.read_new()
        verdict = check(self.claims.seen, self.allocations.seen, self.valid)
        if verdict.double_allocated_devices:
            problems.append(f"{verdict.double_allocated_devices} device(s) committed to a claim while another live claim held them")
        if verdict.lost or verdict.duplicated:
            problems.append(f"valid claims lost: {verdict.lost}, duplicated: {verdict.duplicated}")
        now = await self.holders()
        for key, devices in running_before.items():
            if key in now and now[key] != devices:
                problems.append(f"running claim {key} moved from {devices} to {now[key]}")
            elif key not in now:
                problems.append(f"running claim {key} lost its allocation")
        problems += log_problems(self.logs(), self.credentials)
        return problems


def log_problems(logs: dict[str, str], credentials: Credentials) -> list[str]:
    """Tracebacks and passwords in the services' logs."""
    problems = []
    for name, text in logs.items():
        if "Traceback (most recent call last)" in text:
            problems.append(f"{name} has a traceback: ...{text[text.index('Traceback') :][:600]}")
        for user, password in credentials.passwords.items():
            if password in text:
                problems.append(f"{name} shows {user}'s password")
    return problems


# --- sending ---------------------------------------------------------------------------------------


async def send_raw(bus: Bus, subject: str, data: bytes, outcome: Outcome, *, headers: dict[str, str] | None = None) -> bool:
    """Publish bytes to JetStream as `bus`'s user; True if stored, False if refused (no ack, or an error)."""
    outcome.sent += 1
    try:
        await (await bus.send_bytes(subject, data, headers=headers, timeout=2))
    except (NatsError, TimeoutError) as exc:
        outcome.refused.append(f"{subject}: {type(exc).__name__}")
        return False
    outcome.stored.append(subject)
    return True


async def api(bus: Bus, subject: str, body: dict[str, Any] | None, outcome: Outcome) -> bool:
    """A JetStream API request as `bus`'s user; True if the server did it (a success answer)."""
    outcome.sent += 1
    try:
        reply = await bus.request(subject, json.dumps(body or {}).encode(), timeout=1.5)
    except (NatsError, TimeoutError) as exc:
        outcome.refused.append(f"{subject}: {type(exc).__name__}")
        return False
    answer = json.loads(reply or b"{}")
    if "error" in answer:
        outcome.refused.append(f"{subject}: {answer['error'].get('description', answer['error'])}")
        return False
    outcome.stored.append(subject)
    return True


def hostile_claim(name: str, *, namespace: str = HOSTILE, selector: str | None = None, allocation: dict | None = None, config: Any = None) -> dict:
    """A ResourceClaim as plain data (so that it can carry what the typed model would refuse)."""
    request: dict[str, Any] = {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 1}}
    if selector is not None:
        request["exactly"]["selectors"] = [{"cel": {"expression": selector}}]
    spec: dict[str, Any] = {"devices": {"requests": [request]}}
    if config is not None:
        spec["devices"]["config"] = [{"requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": config}}]
    claim: dict[str, Any] = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, "uid": str(uuid.uuid4()), "generation": 1},
        "spec": spec,
    }
    if allocation is not None:
        claim["status"] = {"allocation": allocation}
    return claim


def submitted(claim: dict) -> bytes:
    return json.dumps({"type": "ClaimSubmitted", "schemaVersion": 1, "claim": claim}).encode()


def claim_subject(namespace: str, name: str) -> str:
    return ev.subject("claims", namespace, name)


async def committed_to(harness: Harness, namespace: str, name: str) -> bool:
    """Whether ALLOCATIONS holds a commit for that claim (a forged or misfiled one must never get one)."""
    await harness.allocations.read_new()
    return any(isinstance(s.event, ev.AllocationCommitted) and s.event.key == f"{namespace}/{name}" for s in harness.allocations.seen)


# --- the corpus ----------------------------------------------------------------------------------


async def oversized(h: Harness) -> Outcome:
    """Item 1: messages just under max payload on consumed subjects (their dead letters must fit)."""
    out = Outcome()
    async with await h.connect_as("ingestor") as ingestor:
        limit = ingestor.max_payload
        await send_raw(ingestor, claim_subject(HOSTILE, "big"), b"x" * (limit - 64), out)
        padded = submitted(hostile_claim("big-valid", config={"pad": "y" * (limit - 2000)}))
        await send_raw(ingestor, claim_subject(HOSTILE, "big-valid"), padded, out)
    async with await h.connect_as("discovery") as discovery:
        await send_raw(discovery, "dra.inventory.gpu%2Envidia%2Ecom.nowhere.big", b"y" * (limit - 64), out)
    return out


async def nested(h: Harness) -> Outcome:
    """Item 2: ~1,000 levels of JSON, bare, in an unknown field and in opaque config parameters."""
    out = Outcome()
    deep = "[" * 1000 + "]" * 1000
    async with await h.connect_as("ingestor") as ingestor:
        await send_raw(ingestor, claim_subject(HOSTILE, "deep-bare"), deep.encode(), out)
        unknown = json.loads(submitted(hostile_claim("deep-unknown")))
        text = json.dumps(unknown)[:-1] + f', "extra": {deep}}}'
        await send_raw(ingestor, claim_subject(HOSTILE, "deep-unknown"), text.encode(), out)
        inner = submitted(hostile_claim("deep-config", config={"x": 0})).decode().replace('{"x": 0}', deep)
        await send_raw(ingestor, claim_subject(HOSTILE, "deep-config"), inner.encode(), out)
    async with await h.connect_as("discovery") as discovery:
        await send_raw(discovery, "dra.inventory.gpu%2Envidia%2Ecom.node-0.deep", deep.encode(), out)
    return out


async def forged_decision(h: Harness) -> Outcome:
    """Item 3: the ingestor's credential writes an AllocationCommitted (a running claim's device) into
    CLAIMS, and tries ALLOCATIONS; neither may ever be acted on, now or at a rebuild."""
    out = Outcome()
    held = await h.holders()
    victim_key, devices = next(iter(sorted(held.items())))
    driver, pool, device = devices[0].split("/")
    claim = hostile_claim("forged")
    claim["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": driver, "pool": pool, "device": device}]}}}
    forged = json.dumps({"type": "AllocationCommitted", "schemaVersion": 1, "claim": claim, "node": pool}).encode()
    async with await h.connect_as("ingestor") as ingestor:
        await send_raw(ingestor, claim_subject(HOSTILE, "forged"), forged, out)
        await send_raw(ingestor, ev.subject("allocations", HOSTILE, "forged"), forged, out)
    return out


async def misfiled(h: Harness) -> Outcome:
    """Item 10: a claim stored under another claim's subject, then that claim's delete."""
    out = Outcome()
    async with await h.connect_as("ingestor") as ingestor:
        await send_raw(ingestor, claim_subject(HOSTILE, "decoy"), submitted(hostile_claim("smuggled")), out)
        gone = ev.ClaimDeleted(namespace=HOSTILE, name="decoy", uid="")
        await send_raw(ingestor, gone.subject, ev.encode(gone), out)
    return out


async def rebuild(h: Harness) -> Outcome:
    """Every allocator killed and started again: the rebuild replays what the attacks left in the streams."""
    for service in h.stack.allocators_():
        await service.kill()
    for service in h.stack.allocators_():
        await service.start()
    return Outcome()


async def jetstream_api(h: Harness) -> Outcome:
    """Item 4: each service user tries to weaken a stream, delete or purge one, and take over, drain or
    delete another service's consumer. The server must refuse every call."""
    out = Outcome()
    weakened = {"name": "ALLOCATIONS", "subjects": ["dra.allocations.>"], "max_msgs": 1, "storage": "file"}
    for user in SERVICES:
        async with await h.connect_as(user) as bus:
            if user != "allocator":  # the bootstrap identity may update streams (and is trusted to)
                await api(bus, "$JS.API.STREAM.UPDATE.ALLOCATIONS", weakened, out)
                await api(bus, "$JS.API.STREAM.CREATE.HIJACK", {"name": "HIJACK", "subjects": ["dra.claims.hostile.>"]}, out)
            await api(bus, "$JS.API.STREAM.DELETE.DEADLETTER", None, out)
            await api(bus, "$JS.API.STREAM.PURGE.CLAIMS", None, out)
            await api(bus, "$JS.API.STREAM.MSG.DELETE.ALLOCATIONS", {"seq": 1}, out)
            if user != "allocator":
                await api(bus, "$JS.API.CONSUMER.DELETE.CLAIMS.allocator", None, out)
                await api(
                    bus,
                    "$JS.API.CONSUMER.CREATE.CLAIMS.allocator",
                    {
                        "stream_name": "CLAIMS",
                        "config": {"name": "allocator", "durable_name": "allocator", "ack_policy": "explicit", "filter_subject": "dra.claims.nothing.>"},
                    },
                    out,
                )
                await api(bus, "$JS.API.CONSUMER.MSG.NEXT.CLAIMS.allocator", {"batch": 100, "expires": 500_000_000}, out)
            if user != "statuswriter":
                await api(bus, "$JS.API.CONSUMER.DELETE.ALLOCATIONS.statuswriter-local", None, out)
    return out


async def resubmission(h: Harness) -> Outcome:
    """Item 9: submit, delete, submit again within the duplicate window (same uid and generation)."""
    out = Outcome()
    event = claim_event("resubmitted")  # not in `valid`: it has two outcomes by design
    key, uid = event.claim.key, event.claim.metadata.uid or ""
    await h.admin.publish(event)
    await h.decided(key, uid, DECIDE_WITHIN_S)
    await h.admin.publish(ev.ClaimDeleted(namespace=NAMESPACE, name="resubmitted", uid=uid))
    await asyncio.sleep(1.0)
    ack = await h.admin.publish(event)
    out.sent += 3
    (out.refused if ack.duplicate else out.stored).append(f"third submit seq {ack.seq} duplicate={ack.duplicate}")
    return out


async def node_credential(h: Harness) -> Outcome:
    """Item 12: a node's discovery credential may publish its own node's slices only, and no claims."""
    out = Outcome()
    async with await h.connect_as(f"discovery-{NODE_USER}") as node:
        others = await node.subject_counts("INVENTORY", "dra.inventory.>")
        mine = [s for s in others if s.split(".")[3] == NODE_USER]
        theirs = [s for s in others if s.split(".")[3] != NODE_USER]
        if theirs:  # a removal of another node's slice: refused
            await send_raw(node, theirs[0], ev.encode(ev.ResourceSliceRemoved(name=theirs[0].split(".")[4], driver="x", pool=theirs[0].split(".")[3])), out)
        if mine and (current := await h.admin.last_message("INVENTORY", mine[0])) is not None:  # its own slice, republished unchanged: stored (a duplicate)
            await send_raw(node, mine[0], current.data, out, headers={"Nats-Msg-Id": current.headers.get("Nats-Msg-Id", "")})
        await send_raw(node, claim_subject(HOSTILE, "from-a-node"), submitted(hostile_claim("from-a-node")), out)
    return out


async def odd_names(h: Harness) -> Outcome:
    """Item 8: names and namespaces the API server refuses, straight onto the bus."""
    out = Outcome()
    async with await h.connect_as("ingestor") as ingestor:
        for i, name in enumerate(["has space", "tab\there", "star*", "gt>", "pct%41", "nul\x00", "UPPER", "a" * 300]):
            await send_raw(ingestor, f"dra.claims.{HOSTILE}.odd-{i}", submitted(hostile_claim(name)), out)
        # namespace "team-a/b" + name "c" against namespace "team-a" + name "b/c"
        await send_raw(ingestor, "dra.claims.team-a%2Fb.c", submitted(hostile_claim("c", namespace="team-a/b")), out)
    return out


async def adopted_conflict(h: Harness) -> Outcome:
    """Item 5: a claim submitted with a status.allocation naming a running claim's device."""
    out = Outcome()
    held = await h.holders()
    _, devices = next(iter(sorted(held.items())))
    driver, pool, device = devices[0].split("/")
    allocation = {"devices": {"results": [{"request": "gpu", "driver": driver, "pool": pool, "device": device}]}}
    async with await h.connect_as("ingestor") as ingestor:
        await send_raw(
            ingestor, claim_subject("other-team", "squatter"), submitted(hostile_claim("squatter", namespace="other-team", allocation=allocation)), out
        )
    return out


def _slow_selector(n: int = 47) -> str:
    """Three nested comprehensions over n-element lists and a lookup that always fails: n = 47 is the
    largest whose estimated cost (cel-go's) stays under Kubernetes' limit of 1,000,000, so it is
    accepted at compile time and its cost is paid at evaluation, per device."""
    items = "[" + ",".join(str(i) for i in range(n)) + "]"
    return f"{items}.all(a, {items}.all(b, {items}.all(c, a + b + c >= 0))) && device.attributes['gpu.nvidia.com'].nothing == 1"


SLOW_SELECTOR = _slow_selector()


async def slow_selector(h: Harness) -> Outcome:
    """Item 6: a selector within the length and cost limits that costs a lot per device."""
    out = Outcome()
    async with await h.connect_as("ingestor") as ingestor:
        await send_raw(ingestor, claim_subject(HOSTILE, "slow"), submitted(hostile_claim("slow", selector=SLOW_SELECTOR)), out)
    return out


async def secrets_in_urls(h: Harness) -> Outcome:
    """Item 11: a service started with its password in the NATS URL, and one pointed at a closed port."""
    out = Outcome()
    service = h.stack.services["statuswriter"]
    await service.stop()
    service.args = ["statuswriter", "--nats-url", h.credentials.url(h.stack.nats.url, "statuswriter")]
    service.env = {k: v for k, v in service.env.items() if k not in ("NATS_USER", "NATS_PASSWORD")}
    await service.start()
    closed = h.credentials.url("nats://127.0.0.1:1", "statuswriter")
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "dralloc.cli", "run", "statuswriter", "--nats-url", closed,
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT, env={**os.environ},
    )  # fmt: skip
    output, _ = await proc.communicate()
    (h.stack.root / "statuswriter-closed-port.log").write_bytes(output)
    out.sent += 2
    return out


def mutations(valid: bytes, limit: int) -> list[bytes]:
    """Mutated copies of a valid event's JSON: cut short, emptied, wrong types, a huge string, a
    400-digit integer, another event type, and padded to just under the server's limit."""
    text = valid.decode()
    return [
        valid[: len(valid) // 2],
        b"",
        b"null",
        b"[]",
        text.replace('"schemaVersion":1', '"schemaVersion":"1"').encode(),
        text.replace('"schemaVersion":1', '"schemaVersion":' + "9" * 400).encode(),
        text.replace('"type":"', '"type":"X', 1).encode(),
        text.replace('"type":"ClaimSubmitted"', '"type":"AllocationReleased"').encode(),
        (text[:-1] + ', "junk": "' + "z" * (limit - len(text) - 600) + '"}').encode(),
    ]


async def mutated_everywhere(h: Harness) -> Outcome:
    """Mutated and oversized events on every stream's subjects, with each service's credential (what
    the server lets through must be survived by every consumer and every rebuild)."""
    out = Outcome()
    valid = json.dumps({"type": "ClaimSubmitted", "schemaVersion": 1, "claim": hostile_claim("mutant")}, separators=(",", ":")).encode()
    targets = {
        "CLAIMS": claim_subject(HOSTILE, "mutant"),
        "INVENTORY": f"dra.inventory.gpu%2Envidia%2Ecom.{NODE_USER}.mutant",
        "ALLOCATIONS": ev.subject("allocations", HOSTILE, "mutant"),
    }
    for user in (*SERVICES, f"discovery-{NODE_USER}"):
        async with await h.connect_as(user) as bus:
            for subject in targets.values():
                batch = mutations(valid, bus.max_payload)
                if not await send_raw(bus, subject, batch[0], out):  # the server refuses by subject: one try tells
                    out.sent += len(batch) - 1
                    out.refused += [subject] * (len(batch) - 1)
                    continue
                for data in batch[1:]:
                    await send_raw(bus, subject, data, out)
    return out


Attack = Callable[[Harness], Awaitable[Outcome]]

ATTACKS: dict[str, Attack] = {
    "oversized": oversized,
    "nested": nested,
    "forged-decision": forged_decision,
    "misfiled": misfiled,
    "jetstream-api": jetstream_api,
    "resubmission": resubmission,
    "node-credential": node_credential,
    "odd-names": odd_names,
    "adopted-conflict": adopted_conflict,
    "slow-selector": slow_selector,
    "secrets-in-urls": secrets_in_urls,
    "mutated-everywhere": mutated_everywhere,
    "rebuild": rebuild,
}
"""The fixed corpus, in the order the benchmark sends it (the rebuild last: it replays the rest)."""


async def attack(h: Harness, name: str) -> Outcome:
    """One attack of the corpus by its name; fails (AssertionError naming what) if anything the
    module docstring promises does not hold after it."""
    running = await h.holders()
    outcome = await ATTACKS[name](h)
    problems = await h.verify(running)
    assert problems == [], f"after {name}: " + "; ".join(problems)  # (benchmarks/ is not assertion-rewritten: name them here)
    return outcome


@contextlib.asynccontextmanager
async def harness(nodes: int = 2, allocators: int = 2, running: int = 4, cluster: int = 1):
    """A secured stack, ready, with `running` valid claims committed; yields the `Harness`."""
    credentials = Credentials()
    async with secured_stack(nodes, allocators, credentials, cluster=cluster) as stack:
        admin = await Bus.connect(credentials.url(stack.nats.url, "admin"), name="hostile-admin")
        try:
            await stack.ready(admin)
            h = Harness(stack, credentials, admin)
            for i in range(running):
                if await h.submit_valid(f"running-{i}") is None:
                    raise RuntimeError(f"running-{i} was not decided: the stack does not allocate")
            yield h
        finally:
            await admin.close()


# --- the benchmark -------------------------------------------------------------------------------


LIVE_VALID = 8
"""Valid claims of the benchmark's normal load alive at once."""


async def run(*, valid_rate: float = 5.0, nodes: int = 4, cluster: int = 1) -> dict[str, Any]:
    """The corpus interleaved with valid claims at `valid_rate` per second; the report of `--hostile`."""
    async with harness(nodes=nodes, allocators=2, cluster=cluster) as h:
        running = await h.holders()
        stop = asyncio.Event()
        offered: list[str] = []

        async def normal_load() -> None:
            # Claims come and go (each deleted once `LIVE_VALID` newer ones exist), so the fleet never
            # runs out and every valid claim's one outcome is a commit.
            i = 0
            live: list[ev.ClaimSubmitted] = []
            while not stop.is_set():
                name = f"valid-{i}"
                offered.append(name)
                h.valid.add(name)
                event = claim_event(name)
                with contextlib.suppress(NatsError, TimeoutError):
                    await h.admin.publish(event)
                    live.append(event)
                if len(live) > LIVE_VALID:
                    gone = live.pop(0).claim.metadata
                    with contextlib.suppress(NatsError, TimeoutError):
                        await h.admin.publish(ev.ClaimDeleted(namespace=NAMESPACE, name=gone.name, uid=gone.uid or ""))
                i += 1
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1 / valid_rate)

        load = asyncio.create_task(normal_load())
        sent, problems = 0, []
        try:
            for name, attack in ATTACKS.items():
                outcome = await attack(h)
                sent += outcome.sent
                await h.revive()
                problems += [f"{name}: {p}" for p in await h.verify(running)]
        finally:
            stop.set()
            await load
        deadline = time.monotonic() + 60
        while True:
            await h.claims.read_new()
            await h.allocations.read_new()
            verdict = check(h.claims.seen, h.allocations.seen, h.valid)
            if verdict.lost == 0 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        return {
            "hostile_sent": sent,
            "valid_submitted": verdict.submitted,
            "valid_decided": verdict.outcomes,
            "max_stall_s": round(h.max_stall_s, 2),
            "lost": verdict.lost,
            "duplicated": verdict.duplicated,
            "double_allocated_devices": verdict.double_allocated_devices,
            "services_restarted": len(h.restarted),
            "nats_servers": cluster,
            "problems": problems,
        }


if __name__ == "__main__":  # python benchmarks/hostile.py
    print(json.dumps(asyncio.run(run()), indent=2))
