"""The allocator service: the only writer of allocation decisions; a thin shell over the engine.

    dralloc run allocator

At start it rebuilds its state from the streams: the current inventory
(INVENTORY, last value per subject), the ledger (ALLOCATIONS: the last
decision per claim; committed claims are restored into the engine) and the
claims still waiting (CLAIMS minus decided and deleted ones). Then it
follows INVENTORY with an ephemeral consumer and CLAIMS with the durable
consumer ``allocator``.

For each ClaimSubmitted it asks the engine, publishes AllocationCommitted or
AllocationFailed and only then acks. A redelivered claim (the process died
before its ack) finds its allocation in the ledger (which holds only decisions
stored in ALLOCATIONS) and is acked: never a second allocation. A claim that
does not fit (or names a class not yet known) waits and is tried again
whenever the inventory changes or devices are released.

Several allocator processes may run: one leads (the lease in
`dralloc.allocator.leader`), the others wait as standbys and take over, from
the streams, within ``lease_ttl`` seconds of the leader going silent. Every
decision is written behind a fence: with ``Nats-Expected-Last-Sequence`` (the
last ALLOCATIONS sequence this term has seen) and ``Dralloc-Epoch``, so the
server refuses a write from a deposed leader, or from a view missing an
earlier write (a publish whose ack was lost). A refused write ends the term;
the next term (this process or another) rebuilds from the streams.

Decisions are pipelined: the allocator decides the next claim while earlier
decisions are still on their way, and acks a claim only once its decision
(and every one before it) is stored. Each write in flight expects the stream
to end exactly at the one before it: ``Nats-Expected-Last-Sequence`` one
past it, and ``Nats-Expected-Last-Msg-Id`` its message id, which is unique to
this term (``<event id>@<term>``), so a write is stored only on top of this
term's own earlier writes. Any write that is refused, unanswered or found a
duplicate ends the term, and the writes behind it are refused in turn.

A gang's decisions are written as one JetStream atomic batch (`Bus.send_batch`):
the stream, and so every consumer, holds all of them or none, whatever
happens part way (a refused fence, a lost connection, SIGKILL: the server
drops a batch whose commit never came). A batch can carry only
``Nats-Expected-Last-Sequence`` (on its first message; JetStream refuses
``Nats-Expected-Last-Msg-Id`` in a batch), so it is sent only once every
write before it is stored: then that sequence is this term's own last write.
Members already committed count towards a gang (a stream written member by
member by an older version, or a member re-created): the others are placed
inside their domain, or, where it has no room, the committed ones give their
devices back in the same batch and the gang is decided again as a whole.

Environment: ``DRALLOC_ALLOCATOR_ACK_WAIT`` (seconds), ``DRALLOC_ALLOCATOR_MAX_DELIVER``,
``DRALLOC_ALLOCATOR_LEASE_TTL`` (seconds, default 3).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import time
import uuid
from collections.abc import Awaitable, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec
import nats.js.errors
from nats.js.api import PubAck
from opentelemetry import context as otel_context
from opentelemetry.context import Context

from dralloc import telemetry
from dralloc.metrics import allocator_metrics, report_lag
from dralloc.allocator import leader
from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.gang import allocate_gang, gang_of
from dralloc.bus import MAX_BATCH, Bus
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim, ResourceClaimStatus

log = logging.getLogger("dralloc.allocator")


@dataclass
class Config:
    ack_wait: float = 30.0
    max_deliver: int = 5
    retry_after: float = 0.1
    """Waiting claims are retried this long after the last inventory change (changes come in bursts)."""
    lease_ttl: float = leader.DEFAULT_TTL
    """A standby takes over this long after the leader's last renewal."""

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        env = os.environ
        config = cls(
            ack_wait=float(env.get("DRALLOC_ALLOCATOR_ACK_WAIT", "30")),
            max_deliver=int(env.get("DRALLOC_ALLOCATOR_MAX_DELIVER", "5")),
            lease_ttl=float(env.get("DRALLOC_ALLOCATOR_LEASE_TTL", str(leader.DEFAULT_TTL))),
        )
        for key, value in overrides.items():
            if value is not None:
                setattr(config, key, value)
        return config


def _failure(claim: ResourceClaim, status: str, message: str) -> ev.AllocationFailed:
    meta = claim.metadata
    return ev.AllocationFailed(
        namespace=meta.namespace or "default",
        name=meta.name,
        uid=meta.uid or "",
        generation=meta.generation or 1,
        reason="unsatisfiable" if status == "unsatisfiable" else "error",
        message=message or status,
    )


class Fenced(Exception):
    """A decision was not written: this allocator is no longer the leader, or its view of ALLOCATIONS is stale."""


WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when ``Nats-Expected-Last-Sequence`` does not match the stream."""
WRONG_LAST_MSG_ID = 10070
"""JetStream's error code when ``Nats-Expected-Last-Msg-Id`` does not match the stream."""


class Allocator:
    """The allocator's state around the engine; every mutation holds `lock` (one decision at a time)."""

    def __init__(
        self, bus: Bus, engine: Engine | None = None, *, lease: leader.Lease | None = None, term: asyncio.Event | None = None
    ) -> None:
        self.bus = bus
        self.engine = engine or Engine()
        self.lease = lease
        self.term = term or asyncio.Event()
        """Set when a write was fenced off: this term's state can no longer be trusted."""
        self.last_seq = 0
        """The last ALLOCATIONS sequence this allocator has seen (rebuilt), or that its last write sent will have."""
        self.token = uuid.uuid4().hex[:12]
        """This term's mark on its writes' message ids (see the module docstring)."""
        self.last_id: str | None = None
        """The message id of this term's last write sent (None before the first)."""
        self.tail: asyncio.Task[None] | None = None
        """The last write sent: done once it (and so every write before it) is stored."""
        self.failures: dict[str, str] = {}
        """Claim key -> message id of the failure this term wrote for it (an identical one is not written again)."""
        self.committed: dict[str, ev.AllocationCommitted] = {}
        self.waiting: dict[str, ResourceClaim] = {}
        self.traces: dict[str, Context] = {}
        """Each waiting claim's trace context, so a retry continues the claim's one trace."""
        self.lock = asyncio.Lock()
        self.room_changed = asyncio.Event()
        self.inventory_changed = False
        self.gangs: dict[str, dict[str, ResourceClaim]] = {}
        """Gang name -> the member claims here so far, not committed (see `_allocate_gang`)."""
        self.gang_held: dict[str, set[str]] = {}
        """Gang name -> keys of its committed members."""

    # -- start ----------------------------------------------------------------------

    async def rebuild(self) -> int:
        """State from the streams; returns the INVENTORY sequence to follow from."""
        inventory, inventory_seq = await self.bus.replay("INVENTORY")
        for event in inventory:
            self._apply_inventory(event)
        decisions, self.last_seq = await self.bus.replay("ALLOCATIONS")
        allocator_metrics().rebuilding(self.engine)
        for event in decisions:
            allocator_metrics().decided(event, replayed=True)
            if isinstance(event, ev.AllocationCommitted):
                self.engine.restore(event.claim)
                self._record(event)
        claims, _ = await self.bus.replay("CLAIMS")
        for event in claims:
            if isinstance(event, ev.ClaimSubmitted) and not self._is_committed(event.claim):
                self.waiting[event.claim.key] = event.claim
        log.info(
            "allocator: rebuilt %d inventory objects, %d allocations, %d waiting claims",
            len(inventory), len(self.committed), len(self.waiting),
        )  # fmt: skip
        return inventory_seq

    # -- inventory ------------------------------------------------------------------

    def _apply_inventory(self, event: ev.Event) -> None:
        match event:
            case ev.ResourceSlicePublished(slice=obj) | ev.DeviceClassPublished(device_class=obj) | ev.NodePublished(node=obj):
                self.engine.apply(obj)
            case ev.ResourceSliceRemoved(name=name):
                self.engine.remove("ResourceSlice", name)
            case ev.DeviceClassRemoved(name=name):
                self.engine.remove("DeviceClass", name)
            case ev.NodeRemoved(name=name):
                self.engine.remove("Node", name)

    async def on_inventory(self, event: ev.Event) -> None:
        async with self.lock:
            self._apply_inventory(event)
        self.inventory_changed = True
        self.room_changed.set()

    async def retry_waiting(self, stop: asyncio.Event, delay: float) -> None:
        """Try the waiting claims again after each burst of inventory changes or releases."""
        while not stop.is_set():
            changed = asyncio.ensure_future(self.room_changed.wait())
            stopped = asyncio.ensure_future(stop.wait())
            await asyncio.wait({changed, stopped}, return_when=asyncio.FIRST_COMPLETED)
            changed.cancel()
            stopped.cancel()
            if stop.is_set():
                return
            await asyncio.sleep(delay)
            self.room_changed.clear()
            if self.inventory_changed:  # a burst of inventory is in: the fleet's objects are long-lived
                self.inventory_changed = False
                gc.freeze()  # (no collection first: bursts are many while a fleet comes up)
            async with self.lock:
                for key, claim in list(self.waiting.items()):
                    if stop.is_set():
                        return
                    with telemetry.tracer().start_as_current_span("retry allocation", context=self.traces.get(key)):
                        try:
                            await self._allocate(claim)
                        except Exception as exc:  # the bus is down: the next change retries again
                            log.warning("allocator: retrying %s failed: %s", key, exc)

    # -- claims ---------------------------------------------------------------------

    async def on_claim(self, event: ev.Event) -> None:
        """Decide on a claim event; returns once the decision is stored."""
        durable = await self.take_claim(event)
        if durable is not None:
            await durable

    async def take_claim(self, event: ev.Event) -> Awaitable[None] | None:
        """Decide on a claim event and send the decision; returns what completes once it is stored
        (the consumer acks the claim then, and takes the next one meanwhile)."""
        async with self.lock:
            if isinstance(event, ev.ClaimSubmitted):
                await self._decide(event.claim)
            elif isinstance(event, ev.ClaimDeleted):
                await self._release(event.key, event.uid)
            # Whatever was decided, or not (a redelivery), stands once every write so far is stored.
            tail = self.tail
        return tail if tail is not None and not tail.done() else None

    def _is_committed(self, claim: ResourceClaim) -> bool:
        done = self.committed.get(claim.key)
        return done is not None and done.claim.metadata.uid == claim.metadata.uid

    async def _allocate(self, claim: ResourceClaim) -> None:
        """Decide on a claim; returns once the decision is stored."""
        await self._decide(claim)
        if self.tail is not None:
            await self.tail

    async def _decide(self, claim: ResourceClaim) -> None:
        """Decide on a claim and send the decision (`self.tail` completes once it is stored)."""
        key = claim.key
        began = time.perf_counter()
        if self._is_committed(claim):
            # Seen before (a redelivery): the ledger only holds decisions stored in ALLOCATIONS, so
            # there is nothing to write again.
            self._stop_waiting(key)
            return
        if key in self.committed:
            # Same name, new object: the old one was deleted and re-created (we missed or raced the delete).
            await self._release(key, self.committed[key].claim.metadata.uid or "")
        if claim.status is not None and claim.status.allocation is not None:
            await self._adopt(claim)
            return
        gang = gang_of(claim)
        if gang is not None and gang[1] > 1:
            await self._allocate_gang(claim, *gang)
            return
        with telemetry.tracer().start_as_current_span("allocate", attributes={"dralloc.claim": key}) as span:
            (outcome,) = self.engine.allocate([claim])
            span.set_attribute("dralloc.outcome", outcome.status)
            if outcome.node:
                span.set_attribute("dralloc.node", outcome.node)
        if outcome.status != "allocated":
            self.waiting[key] = claim
            self.traces[key] = otel_context.get_current()
            await self._fail(claim, outcome.status, outcome.message, began)
            return
        decided = msgspec.structs.replace(claim, status=ResourceClaimStatus(allocation=outcome.allocation))
        event = ev.AllocationCommitted(claim=decided, node=outcome.node)
        try:
            stored = await self._send(event, began)
        except BaseException:
            self.engine.release(key)  # not sent: the redelivery decides again
            raise
        self._record(event)
        self._stop_waiting(key)
        stored.add_done_callback(lambda done: self._undo_unless_stored(done, event))

    def _undo_unless_stored(self, write: asyncio.Task[None], event: ev.AllocationCommitted) -> None:
        """A commit that was not stored is forgotten (the term is over; its redelivery decides again)."""
        if (write.cancelled() or write.exception() is not None) and self.committed.get(event.key) is event:
            self._forget(event.key)
            self.engine.release(event.key)

    def _record(self, event: ev.AllocationCommitted) -> None:
        self.committed[event.key] = event
        gang = gang_of(event.claim)
        if gang is not None and gang[1] > 1:
            self.gang_held.setdefault(gang[0], set()).add(event.key)

    def _forget(self, key: str) -> None:
        gang = gang_of(self.committed.pop(key).claim)
        if gang is not None and (held := self.gang_held.get(gang[0])) is not None:
            held.discard(key)
            if not held:
                del self.gang_held[gang[0]]

    async def _fail(self, claim: ResourceClaim, status: str, message: str, began: float | None = None) -> None:
        """Send the claim's failure, unless this term already wrote the same one (a retry that still does not fit)."""
        failure = _failure(claim, status, message)
        if self.failures.get(failure.key) != failure.msg_id:
            await self._send(failure, began)
            self.failures[failure.key] = failure.msg_id

    async def _allocate_gang(self, claim: ResourceClaim, name: str, size: int, domain: str | None) -> None:
        """A gang member (annotations `dralloc.dev/gang`, `-size`, `-domain`) waits, with no decision
        written, until all `size` members are here (committed ones count); then the engine places the
        others inside one domain, that of the committed ones if any (engine/gang.py), and the decisions
        are written as one atomic batch (see the module docstring). A gang that cannot be completed
        where its committed members are is given back and decided again whole, in the same batch."""
        if size > MAX_BATCH // 2:  # one batch may give back size - 1 members and commit all size
            await self._fail(claim, "error", f"gang {name}: {size} claims; at most {MAX_BATCH // 2} are committed all or none")
            return
        members = self.gangs.setdefault(name, {})
        members[claim.key] = claim
        self.waiting[claim.key] = claim
        self.traces.setdefault(claim.key, otel_context.get_current())
        held = [self.committed[key].claim for key in self.gang_held.get(name, ())]
        if len(members) + len(held) < size:
            return
        began = time.perf_counter()
        with telemetry.tracer().start_as_current_span("allocate gang", attributes={"dralloc.gang": name, "dralloc.gang.size": size}):
            claims = sorted([*members.values(), *held], key=lambda c: c.key)
            outcomes = allocate_gang(self.engine, claims, name=name, domain_label=domain)
            given_back: list[ResourceClaim] = []
            if held and any(o.status != "allocated" for o in outcomes):
                # No room for the rest where the committed members are. A partial gang never keeps
                # devices: they are given back (in the batch below) and the gang is decided whole.
                given_back = held
                for member in held:
                    self.engine.release(member.key)
                    members[member.key] = msgspec.structs.replace(member, status=None)
                claims = sorted(members.values(), key=lambda c: c.key)
                outcomes = allocate_gang(self.engine, claims, name=name, domain_label=domain)
        placed = all(o.status == "allocated" for o in outcomes)
        if not placed and not given_back:
            for member, outcome in zip(claims, outcomes):  # all wait, none holds devices
                await self._fail(member, outcome.status, outcome.message)
            return
        batch: list[ev.AllocationEvent] = [
            ev.AllocationReleased(namespace=m.metadata.namespace or "default", name=m.metadata.name, uid=m.metadata.uid or "")
            for m in given_back
        ]
        for member, outcome in zip(claims, outcomes):
            if not placed:
                batch.append(_failure(member, outcome.status, outcome.message))
            elif member.key in members:
                decided = msgspec.structs.replace(member, status=ResourceClaimStatus(allocation=outcome.allocation))
                batch.append(ev.AllocationCommitted(claim=decided, node=outcome.node))
        try:
            await (await self._send_batch(batch, began, [self.traces.get(event.key) for event in batch]))
        except BaseException:
            # None stored (or, if the answer was lost, the term is over and the next one reads the
            # stream): the engine and the gang go back to what the stream holds.
            for key in members:
                self.engine.release(key)
            for member in given_back:
                del members[member.key]
                self.engine.restore(self.committed[member.key].claim)
            raise
        for member in given_back:
            self._forget(member.key)
            self.waiting[member.key] = members[member.key]
        for event in batch:
            if isinstance(event, ev.AllocationCommitted):
                self._record(event)
                self._stop_waiting(event.key)
            elif isinstance(event, ev.AllocationFailed):
                self.failures[event.key] = event.msg_id
        if placed:
            del self.gangs[name]

    async def _adopt(self, claim: ResourceClaim) -> None:
        """A claim that arrives allocated (by Kubernetes, or by an earlier run written back to it):
        its devices are in use as they are; it is recorded as committed, never decided again."""
        key = claim.key
        for problem in self.engine.restore(claim):
            log.warning("allocator: adopting %s: %s", key, problem)
        record = self.engine.ledger.claims.get(key)
        event = ev.AllocationCommitted(claim=claim, node=record.node if record is not None else None)
        try:
            await self._write(event)
        except BaseException:
            self.engine.release(key)
            raise
        self._record(event)
        self._stop_waiting(key)

    async def _write(self, event: ev.AllocationEvent) -> None:
        """Publish a decision behind the fence and wait until it is stored; raises `Fenced` when refused."""
        await (await self._send(event))

    def _fence(self, what: str) -> dict[str, str]:
        """The headers every write of this term carries; raises `Fenced` once the term is over."""
        if self.term.is_set():
            raise Fenced(f"term over: {what} not written")
        if self.lease is None:
            return {}
        if not self.lease.held:
            self.term.set()
            raise Fenced(f"lease lost (epoch {self.lease.epoch}): {what} not written")
        return {"Dralloc-Epoch": str(self.lease.epoch)}

    async def _send(self, event: ev.AllocationEvent, began: float | None = None) -> asyncio.Task[None]:
        """Send a decision behind the fence (see the module docstring); returns the task that completes
        once it is stored and raises `Fenced` when it was refused. `began`: when the claim was taken up."""
        headers = {**self._fence(event.subject), "Nats-Expected-Last-Sequence": str(self.last_seq)}
        if self.last_id is not None:
            headers["Nats-Expected-Last-Msg-Id"] = self.last_id
        msg_id = f"{event.msg_id}@{self.token}"
        ack = await self.bus.send(event, headers=headers, msg_id=msg_id)
        expected, self.last_seq, self.last_id = self.last_seq, self.last_seq + 1, msg_id
        self.tail = asyncio.ensure_future(self._stored((event,), ack, expected, began))
        return self.tail

    async def _send_batch(
        self, events: list[ev.AllocationEvent], began: float | None = None, traces: list[Context | None] | None = None
    ) -> asyncio.Task[None]:
        """`_send` for decisions stored all or none (one atomic batch; `traces`: the one each continues).
        Only once every write before it is stored: its one fence, ``Nats-Expected-Last-Sequence``,
        then names this term's own write."""
        if self.tail is not None:
            await self.tail
        headers = self._fence(f"{len(events)} decisions of a gang")
        first = {"Nats-Expected-Last-Sequence": str(self.last_seq)}
        # The sequence each will take in the ids too: a member given back and committed again in one
        # term is a new message, not a duplicate (which would refuse the whole batch).
        msg_ids = [f"{event.msg_id}@{self.token}:{self.last_seq + i}" for i, event in enumerate(events, start=1)]
        ack = await self.bus.send_batch(events, headers=headers, first=first, msg_ids=msg_ids, traces=traces)
        expected, self.last_seq, self.last_id = self.last_seq, self.last_seq + len(events), msg_ids[-1]
        self.tail = asyncio.ensure_future(self._stored(events, ack, expected, began))
        return self.tail

    async def _stored(self, events: Sequence[ev.AllocationEvent], ack: Awaitable[PubAck], expected: int, began: float | None) -> None:
        what = events[0].subject if len(events) == 1 else f"{len(events)} decisions of a gang"
        try:
            stored = await ack
        except nats.js.errors.APIError as exc:
            self.term.set()
            if exc.err_code in (WRONG_LAST_SEQUENCE, WRONG_LAST_MSG_ID):
                raise Fenced(f"ALLOCATIONS moved past sequence {expected} (another leader, or a lost ack): {what} not written") from None
            raise
        except BaseException:
            self.term.set()  # stored or not, nobody can tell now: the next term reads the stream
            raise
        if stored.duplicate or stored.seq != expected + len(events):
            self.term.set()  # a write of this term already stored it: this term's view is not the stream's
            raise Fenced(f"{what} was already stored (sequence {stored.seq}): the term's view is stale")
        for event in events:
            decision = isinstance(event, ev.AllocationCommitted | ev.AllocationFailed)
            allocator_metrics().decided(event, time.perf_counter() - began if decision and began else None)

    def _stop_waiting(self, key: str) -> None:
        self.waiting.pop(key, None)
        self.traces.pop(key, None)
        self.failures.pop(key, None)

    async def _release(self, key: str, uid: str) -> None:
        waiting = self.waiting.get(key)
        if waiting is not None and (not uid or waiting.metadata.uid == uid):
            self._stop_waiting(key)
            for members in self.gangs.values():
                members.pop(key, None)
        done = self.committed.get(key)
        if done is None or (uid and done.claim.metadata.uid != uid):
            return
        namespace, name = key.split("/", 1)
        await self._write(ev.AllocationReleased(namespace=namespace, name=name, uid=done.claim.metadata.uid or ""))
        self.engine.release(key)
        self._forget(key)
        self.room_changed.set()  # freed devices may fit a waiting claim


async def serve(bus: Bus, config: Config, stop: asyncio.Event, *, engine: Engine | None = None) -> None:
    """Wait for the leader lease, lead until it is lost or a write is fenced off, and again; resign on stop."""
    lease = leader.Lease(await bus.key_value(leader.BUCKET), ttl=config.lease_ttl)
    try:
        while await lease.acquire(stop):
            allocator = Allocator(bus, engine, lease=lease)
            engine = None  # a later term rebuilds a fresh engine from the streams
            try:
                await _lead(bus, config, stop, allocator)
            except Exception as exc:  # NATS went away mid-term, or a refused write: the next term rebuilds
                log.warning("allocator: term of epoch %d ended: %s", lease.epoch, exc)
                await asyncio.sleep(0.2)
            else:
                log.info("allocator: term of epoch %d ended", lease.epoch)
    finally:
        await lease.resign()


async def _lead(bus: Bus, config: Config, stop: asyncio.Event, allocator: Allocator) -> None:
    """One term: rebuild from the streams, then decide until `stop` or the term ends."""
    term = allocator.term
    assert allocator.lease is not None
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(allocator.lease.keep(term))  # renewing already while the rebuild runs
        tasks.create_task(report_lag(bus, "CLAIMS", "allocator", term))
        tasks.create_task(_end_term_on(stop, term))
        gc.disable()  # the rebuild makes the fleet's objects: collections meanwhile only walk them again
        try:
            inventory_seq = await allocator.rebuild()
        finally:
            gc.enable()
        _freeze_long_lived()
        tasks.create_task(
            bus.consume("INVENTORY", allocator.on_inventory, term, durable=None, name="allocator-inventory", start_seq=inventory_seq + 1)
        )
        tasks.create_task(allocator.retry_waiting(term, config.retry_after))
        if allocator.waiting:
            allocator.room_changed.set()  # claims left waiting by a previous term: try them now
        tasks.create_task(
            bus.consume(
                "CLAIMS", allocator.take_claim, term, durable="allocator", ack_wait=config.ack_wait, max_deliver=config.max_deliver
            )
        )


def _freeze_long_lived() -> None:
    """Move what is alive now (the inventory, the ledger) out of the cyclic collector's sight: its
    full collections walked the whole fleet again and again (on 9,904 GPUs, ~10% of the allocator's
    time and pauses of tens of ms). Garbage first, so none of it is frozen. Young collections get
    rarer too: most of a decision's objects are freed by reference counting before one comes."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(YOUNG_COLLECTION_EVERY, *gc.get_threshold()[1:])


YOUNG_COLLECTION_EVERY = 20_000
"""Allocations between young collections (CPython's default: 700)."""


async def _end_term_on(stop: asyncio.Event, term: asyncio.Event) -> None:
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(term.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    term.set()
