"""The allocator's bus shell around the book of decisions: claims in, decisions out behind the fence.

What to decide lives in the book (`decisions.py`: pure, no bus): the commits, the failures
written, the waiting claims, the gangs. `Allocator` feeds it the streams' events, writes the
decisions it returns behind the fence, pipelined (fence.py), and tells it what became of each
write (so it undoes what was not stored); it also owns the spans and the metrics of decisions.

For each ClaimSubmitted it asks the engine, publishes AllocationCommitted or AllocationFailed and
only then acks; claims taken from the consumer meanwhile are queued and decided together
(intake.py): a run of plain claims in one hop to the engine's thread. A redelivered claim (the
process died before its ack) finds its allocation in the ledger (which holds only decisions
stored in ALLOCATIONS) and is acked: never a second allocation; one whose failure is on record
(written this term, or replayed) and that still waits is acked with nothing written
(`Decisions.on_record`): a decision stored is never written again through the fence. A claim that
does not fit (or names a class not yet known) waits and is tried again whenever the inventory
changes or devices are released (retry.py). Claims naming a class not known yet are decided only
once INVENTORY has been read as far as it was stored (catchup.py): a class published with them is
applied first, so no transient `not found` error is written.

A gang's (or a Pod's) decisions are written as one atomic batch (fence.py). Members already
committed count towards a gang (a stream written member by member by an older version, or a
member re-created): the others are placed inside their domain, or, where it has no room, the
committed ones give their devices back in the same batch and the gang is decided again as a whole.

Engine work (selector evaluation, search) runs in a worker thread (`Allocator._engine_work`), one
at a time under `lock`, so the lease is renewed and a stop is seen while a claim is evaluated; a
term's end interrupts it. A claim decided as an `error` is parked (`Decisions.parked`): tried
again only after the inventory changes, not at a rebuild.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, TypeVar

from opentelemetry import context as otel_context
from opentelemetry.context import Context

from dralloc import telemetry
from dralloc.allocator import evicting, leader, moving
from dralloc.allocator.catchup import InventoryMark, names_unknown_class
from dralloc.allocator.decisions import Adopt, Allocate, AllocatePod, Decisions, GangComplete
from dralloc.allocator.engine import Engine, Outcome
from dralloc.allocator.engine.memory import Collector
from dralloc.allocator.fence import Fence
from dralloc.allocator.intake import Intake, Taken
from dralloc.allocator.rebuild import rebuild
from dralloc.allocator.reservations import Unit, gang_unit, pod_unit
from dralloc.allocator.retry import retry_waiting
from dralloc.allocator.snapshot import Policy
from dralloc.allocator.snapshot_store import Snapshots
from dralloc.bus import MAX_BATCH, Bus, Permanent, PublishRefused
from dralloc.metrics import allocator_metrics
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim

T = TypeVar("T")

log = logging.getLogger("dralloc.allocator")

WARM_LULL_S = 0.05
"""`warm_engine` starts a round once the inventory has not changed for this long..."""
WARM_DEFER_S = 1.0
"""...or once this long has passed since the first change after the round before (whichever
comes first): an inventory that never rests is still warmed, a round at a time."""

HOP_NS = 10_000_000
"""Engine work in one hop to its thread, at most (ns of the engine thread's CPU time; a claim is
never cut): a run of claims taken together (a backlog: up to the consumer's ~1,000 unacked) was
decided whole before the first of its decisions was sent, so each waited for all of them, and
the bus and the status writer idled meanwhile. Each hop costs ~0.1 ms (the thread woken, the GIL
handed over). CPU time, not the clock: on a loaded machine the thread waits for a CPU, and for
the GIL while the event loop runs, so 10 ms of the clock held a claim or two, and handing the
hops over took a third of the event loop's time (py-spy, load 11-13)."""


class Allocator:
    """The bus shell around the book of decisions (`decisions.py`); every mutation holds `lock` (one
    decision at a time)."""

    def __init__(
        self,
        bus: Bus,
        engine: Engine | None = None,
        *,
        lease: leader.Lease | None = None,
        term: asyncio.Event | None = None,
        max_wait: float = 0.0,
        snapshot: Policy | None = None,
        moves: str = "off",
        collector: Collector | None = None,
    ) -> None:
        self.bus = bus
        self.collector = collector
        """The process's collector policy (engine/memory.py), settled after each piece of engine work;
        None: the collector is left as it is (a test's, a library user's process)."""
        self.moves = moves
        """When large units that wait get room by moving small claims (moving.py `MODES`; "off": never)."""
        self.snapshots = Snapshots(bus, policy=snapshot, epoch=lambda: lease.epoch if lease is not None else 0)
        """The compacted record of this term's decisions, loaded at the rebuild and written now and then."""
        self.book = Decisions(engine, max_gang=MAX_BATCH // 2, max_wait=max_wait)
        self.engine = self.book.engine
        moving.configure(self.engine, moves)  # when-refused: the held-node rules off
        self.lease = lease
        self.term = term or asyncio.Event()
        """Set when a write was fenced off: this term's state can no longer be trusted."""
        self.fence = Fence(bus, self.term, lease, self._stored)
        """This term's writes to ALLOCATIONS (fence.py)."""
        self.intake = Intake(self._decide_taken)
        """Claims taken from the consumer, decided in batches (intake.py)."""
        self.lock = asyncio.Lock()
        self.engine_busy = False
        """Engine work is running in its thread (`_engine_work`)."""
        self.room_changed = asyncio.Event()
        self.inventory_changed = False
        self.warm_wanted = asyncio.Event()
        """Set by an inventory change: the engine has new idle work (`warm_engine`)."""
        self.inventory_changed_at = 0.0
        """When the inventory last changed (`time.monotonic`): `warm_engine` waits for a lull."""
        self.inventory_mark: InventoryMark | None = None
        """How far the term's inventory reader has read INVENTORY (catchup.py); None: no reader
        follows it (a test feeding `on_inventory` itself), claims are decided with what is known."""

    @property
    def last_seq(self) -> int:
        """The last ALLOCATIONS sequence this term has seen, or that its last write sent will have."""
        return self.fence.last_seq

    @property
    def tail(self) -> asyncio.Future[None] | None:
        """The last write sent: done once it (and every write before it) is stored."""
        return self.fence.tail

    @property
    def committed(self) -> dict[str, ev.AllocationCommitted]:
        return self.book.committed

    @property
    def waiting(self) -> dict[str, ResourceClaim]:
        return self.book.waiting

    # -- start ----------------------------------------------------------------------

    async def rebuild(self) -> int:
        """State from the streams; returns the INVENTORY sequence to follow from (rebuild.py)."""
        return await rebuild(self)

    # -- inventory ------------------------------------------------------------------

    async def on_inventory(self, event: ev.Event) -> None:
        async with self.lock:
            refused = self.book.apply_inventory(event)
        if refused is not None:
            self.inventory_changed = True  # (a refused slice takes its earlier version with it)
            raise Permanent(refused)  # dead-lettered with the reason
        self.inventory_changed = True
        self.inventory_changed_at = time.monotonic()
        self.room_changed.set()
        self.warm_wanted.set()

    async def retry_waiting(self, stop: asyncio.Event, delay: float) -> None:
        """Try the waiting claims again after each burst of inventory changes or releases (retry.py)."""
        await retry_waiting(self, stop, delay)

    async def warm_engine(self, stop: asyncio.Event) -> None:
        """The engine's idle work (`Engine.warm`: nothing a decision depends on) in hops of at most
        `HOP_NS`, after the rebuild and after each inventory change, until `stop`. Each hop holds
        `lock` as a claim does, and the lock serves its waiters in turn: a claim that comes waits
        for one hop at most, and the first claim of a class does not pay for the whole fleet's. Once
        the work is done, the collector's turn (`Collector.idle`: a full collection if due).

        Each round waits for a lull in the inventory first (`_inventory_lull`): a fleet arrives as
        thousands of events, and a round after each would do the part of the work that is paid per
        round (the multi-node domains, after each Node object: a pass over every node) thousands
        of times."""
        while not stop.is_set():
            self.warm_wanted.clear()
            await self._inventory_lull(stop)
            more = True
            while more and not stop.is_set():
                async with self.lock:
                    more = await self._engine_work(self.engine.warm, HOP_NS / 1e9)
            if self.collector is not None and not stop.is_set():
                self.collector.idle()
            wanted, stopped = asyncio.ensure_future(self.warm_wanted.wait()), asyncio.ensure_future(stop.wait())
            await asyncio.wait({wanted, stopped}, return_when=asyncio.FIRST_COMPLETED)
            wanted.cancel()
            stopped.cancel()

    async def _inventory_lull(self, stop: asyncio.Event) -> None:
        """Return once the inventory has not changed for `WARM_LULL_S`, or `WARM_DEFER_S` after the
        call, or at `stop`."""
        deadline = time.monotonic() + WARM_DEFER_S
        while (wait := min(self.inventory_changed_at + WARM_LULL_S, deadline) - time.monotonic()) > 0 and not stop.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), wait)

    # -- claims ---------------------------------------------------------------------

    async def on_claim(self, event: ev.Event) -> None:
        """Decide on a claim event; returns once the decision is stored."""
        durable = await self.take_claim(event)
        if durable is not None:
            await durable

    async def take_claim(self, event: ev.Event) -> Awaitable[None] | None:
        """Take a claim event; returns what completes once its decision is stored (the consumer acks
        the claim then, and takes the next one meanwhile). A ClaimSubmitted is queued and decided
        with the others queued meanwhile (intake.py); any other event waits for those first."""
        if isinstance(event, ev.ClaimSubmitted):
            return self.intake.put(Taken(event, otel_context.get_current(), time.perf_counter()))
        await self.intake.flush()
        async with self.lock:
            if isinstance(event, ev.ClaimDeleted) and (release := self.book.deleted(event.key, event.uid)) is not None:
                await self.release(release)
            elif isinstance(event, ev.PodSubmitted):
                await self.decide_step(self.book.pod_submitted(event))
            elif isinstance(event, ev.PodDeleted):
                self.book.pod_deleted(event.key, event.uid)
            elif isinstance(event, ev.EvictionRefused):
                await self._eviction_refused(event)
            # Whatever was decided, or not, stands once every write so far is stored.
            tail = self.tail
        return tail if tail is not None and not tail.done() else None

    async def _decide_taken(self, batch: list[Taken]) -> None:
        """Decide the claims the intake took, in order: each run of plain claims (`Decisions.plain`)
        in one engine hop (`_allocate_run`), any other alone; each `Taken` settled once its decision is sent.
        If one names a class not known yet, INVENTORY is read as far as it is stored first (catchup.py;
        outside `lock`, which the inventory reader takes)."""
        mark = self.inventory_mark
        if mark is not None and names_unknown_class((taken.event.claim for taken in batch), self.engine.inventory.classes):
            await mark.catch_up(self.bus, self.term)
        async with self.lock:
            run: list[Taken] = []
            names: set[str] = set()  # a name once per run: its second claim is decided after the first is recorded
            for taken in batch:
                claim = taken.event.claim
                plain = self.book.plain(claim, cluster=taken.event.cluster, needs_pod=taken.event.needs_pod) and not self.book.on_record(claim)
                if plain and claim.key not in names:
                    run.append(taken)
                    names.add(claim.key)
                    continue
                await self._allocate_run(run)
                run, names = [], set()
                await self._decide_taken_alone(taken)
            await self._allocate_run(run)

    async def _decide_taken_alone(self, taken: Taken) -> None:
        """A claim that is not plain (or delivered again), decided on its own in its own trace context."""
        event = taken.event
        token = otel_context.attach(taken.context)
        try:
            if not self.book.on_record(event.claim):  # (delivered again: its failure stands, nothing to write)
                await self._decide(event.claim, cluster=event.cluster, needs_pod=event.needs_pod, began=taken.began)
        except Exception as exc:
            taken.settle(None, exc)
        else:
            taken.settle(self.tail)  # whatever was decided, or not, stands once every write so far is stored
        finally:
            otel_context.detach(token)

    async def _allocate_run(self, run: list[Taken]) -> None:
        """Plain claims, asked of the engine together in one hop to its thread (`_allocate_each`),
        then each outcome written in order as `_allocate_one` would."""
        while run:
            try:
                results = await self._engine_work(self._allocate_each, [(t.event.claim, t.context) for t in run])
            except Exception as exc:  # the first claim's engine work raised: it alone is handed back
                run[0].settle(None, exc)
                run = run[1:]
                continue
            recording = telemetry.recording()  # (else the span is context only, and nothing continues it)
            for taken, (outcome, commit, start, end) in zip(run, results):
                claim = taken.event.claim
                if recording:
                    attributes = {"dralloc.claim": claim.key, "dralloc.outcome": outcome.status}
                    if outcome.node:
                        attributes["dralloc.node"] = outcome.node
                    span = telemetry.tracer().start_span("allocate", context=taken.context, start_time=start, attributes=attributes)
                    span.end(end_time=end)
                token = otel_context.attach(taken.context)
                try:
                    await self._write_outcome(claim, outcome, commit, taken.began)
                except Exception as exc:
                    taken.settle(None, exc)
                else:
                    taken.settle(self.tail)
                finally:
                    otel_context.detach(token)
            run = run[len(results) :]

    def _allocate_each(self, claims: list[tuple[ResourceClaim, Context]]) -> list[tuple[Outcome, ev.AllocationCommitted | None, int, int]]:
        """In the engine's thread: `Decisions.allocate` for each claim in turn, with when it began and
        ended (ns, for its span). Stops after a claim that may now hold a reservation: the claims
        after it are decided once that is in force, as one at a time they would be; and before a
        claim whose engine work raises (unless it is the first: then it raises), so what the claims
        before it hold is written; and once the hop has taken `HOP_NS` (the rest go in the next hop),
        so that what is decided is written while the rest of a backlog waits, not after all of it."""
        out: list[tuple[Outcome, ev.AllocationCommitted | None, int, int]] = []
        began = time.thread_time_ns()
        for claim, context in claims:
            start = time.time_ns()
            try:
                outcome, commit = self.book.allocate(claim, context)
            except Exception:
                if not out:
                    raise
                break
            end = time.time_ns()
            out.append((outcome, commit, start, end))
            if commit is None and outcome.status == "unsatisfiable" and self.book.may_hold(claim):
                break
            if time.thread_time_ns() - began >= HOP_NS:
                break
        return out

    async def retry(self, claim: ResourceClaim) -> None:
        """Decide on a waiting claim again (retry.py); returns once the decision is stored."""
        await self._decide(claim)
        if self.tail is not None:
            await self.tail

    async def _decide(self, claim: ResourceClaim, *, cluster: bool = False, needs_pod: bool = False, began: float | None = None) -> None:
        """Write what the book decides for a claim (`self.tail` completes once it is stored)."""
        began = began or time.perf_counter()
        context = otel_context.get_current()
        step = self.book.submitted(claim, context, cluster=cluster, needs_pod=needs_pod)
        while isinstance(step, ev.AllocationReleased):  # it replaced a committed claim, or the cluster holds another allocation
            await self.release(step)
            step = self.book.submitted(claim, context, cluster=cluster, needs_pod=needs_pod)
        await self.decide_step(step, context, began)

    async def decide_step(self, step: Any, context: Context | None = None, began: float | None = None) -> None:
        """Write one step the book returned (see `Decisions.submitted`)."""
        began = began or time.perf_counter()
        match step:
            case ev.AllocationFailed():
                await self._send_failure(step)
            case Adopt(commit=event):
                try:
                    await self.fence.write(event)
                except BaseException:
                    self.book.commit_not_written(event.key)
                    raise
                self.book.commit_written(event)
            case Allocate(claim=alone):
                await self._allocate_one(alone, context or otel_context.get_current(), began)
            case GangComplete():
                await self._allocate_gang(step)
            case AllocatePod():
                await self._allocate_pod(step, began)

    async def _allocate_pod(self, step: AllocatePod, began: float) -> None:
        """A Pod's claims are all here: allocated together on one node, their commits written as one
        atomic batch (all or none); or each claim's failure, and the Pod waits for room."""
        evict_at = time.time() if self.moves != "off" else None  # moves in a cluster: evict the Pods in its way (evicting.py)
        with telemetry.tracer().start_as_current_span("allocate pod", attributes={"dralloc.pod": step.pod}) as span:
            plan = await self._engine_work(self.book.decide_pod, step, evict_at)
            span.set_attribute("dralloc.outcome", "allocated" if plan.batch else "evicting" if plan.evictions else "waiting")
        for failure in plan.failures:
            await self._send_failure(failure, began)
        if plan.evictions:
            await self._write_evictions(pod_unit(step.pod), plan.evictions, began)
        if not plan.batch:
            return
        try:
            await (await self.fence.send_batch(list(plan.batch), began))
        except BaseException:
            self.book.pod_refused(plan)
            raise
        self.book.pod_stored(plan)

    async def _eviction_refused(self, refused: ev.EvictionRefused) -> None:
        """The status writer could not evict a Pod asked for (evicting.py `Evictions.refusal`): if it is
        news, what was held for the waiting Pod is free for others now, and the Pod is decided again
        at once, so its failure (its Event, `dralloc get claims`) says why it still waits."""
        pod = f"{refused.for_namespace}/{refused.for_pod}"
        if self.moves == "off" or not self.book.evictions.refusal(self.book, refused, time.time()):
            return
        self.room_changed.set()  # (the held devices may fit a claim that avoided them; a gang's failures are written again there)
        if not refused.gang and pod in self.book.pods:
            await self.decide_step(self.book.pod_submitted(self.book.pods[pod]))

    async def _allocate_one(self, claim: ResourceClaim, context: Context, began: float) -> None:
        with telemetry.tracer().start_as_current_span("allocate", attributes={"dralloc.claim": claim.key}) as span:
            outcome, event = await self._engine_work(self.book.allocate, claim, context)
            span.set_attribute("dralloc.outcome", outcome.status)
            if outcome.node:
                span.set_attribute("dralloc.node", outcome.node)
        await self._write_outcome(claim, outcome, event, began)

    async def _write_outcome(self, claim: ResourceClaim, outcome: Outcome, event: ev.AllocationCommitted | None, began: float) -> None:
        """Write what the engine made of a claim of its own: its commit, or its failure (it waits)."""
        if event is None:
            if outcome.status == "unsatisfiable" and self.book.may_hold(claim):
                await self.reserve_waiting()  # (it may hold a node now: its failure says so)
            await self._send_failure(self.book.failure(claim, outcome.status, outcome.message), began)
            return
        try:
            stored = await self.fence.send(event, began)
        except BaseException:
            self.book.commit_not_written(event.key)  # not sent: the redelivery decides again
            raise
        self.book.commit_written(event)
        stored.add_done_callback(lambda done: self._undo_unless_stored(done, event))

    async def observe_once(self) -> None:
        """Take a snapshot of the engine with the reservations per node and hand them to the metrics
        (which ask for one when a reader collects: `AllocatorMetrics.watch`). Taken under `lock` in the
        engine's worker thread, so the exporter's thread never reads the engine itself."""
        async with self.lock:
            snapshot = await self._engine_work(lambda: self.engine.snapshot(fleet=True))
            reserved = self.book.reservations.per_node()
        allocator_metrics().observed(snapshot, reserved)

    async def _engine_work(self, fn: Callable[..., T], *args: Any) -> T:
        """Run engine work (selector evaluation, search) in a worker thread: the event loop keeps
        renewing the lease and answers SIGTERM meanwhile. The engine is not thread-safe: every caller
        holds `lock`, so one thread at a time uses it (`_undo_unless_stored` is the one mutation made
        outside the lock, and it waits while the engine is busy)."""
        self.engine_busy = True
        try:
            return await asyncio.to_thread(fn, *args)
        finally:
            self.engine_busy = False
            if self.collector is not None:  # what the work left alive (a decision's, a warm hop's) is long-lived
                self.collector.settle()

    def _undo_unless_stored(self, write: asyncio.Future[None], event: ev.AllocationCommitted) -> None:
        if write.cancelled() or write.exception() is not None:
            if self.engine_busy:  # a callback, not holding the lock: the engine's thread may be in it
                asyncio.ensure_future(self._undo_locked(event))
            else:
                self.book.commit_refused(event)

    async def _undo_locked(self, event: ev.AllocationCommitted) -> None:
        async with self.lock:
            self.book.commit_refused(event)

    async def _send_failure(self, failure: ev.AllocationFailed | None, began: float | None = None) -> None:
        """Send a failure the book asks for (None: this term already wrote the same one)."""
        if failure is not None:
            await self.fence.send(failure, began)
            self.book.failure_sent(failure)

    async def _allocate_gang(self, complete: GangComplete) -> None:
        """A gang's members are all here: its decisions are written as one atomic batch (see the module docstring)."""
        began = time.perf_counter()
        attributes: dict[str, str | int] = {"dralloc.gang": complete.name, "dralloc.gang.size": complete.size}
        evict_at = time.time() if self.moves != "off" else None  # a gang of Pods evicts the Pods in its way (evicting.py)
        with telemetry.tracer().start_as_current_span("allocate gang", attributes=attributes):
            plan = await self._engine_work(self.book.decide_gang, complete, evict_at)
        if plan.unplaced and self.book.may_hold(plan.unplaced[0][0]):
            await self.reserve_waiting()  # (the gang may hold a domain's nodes now: the failures say so)
        for member, outcome in plan.unplaced:  # all wait, none holds devices
            await self._send_failure(self.book.failure(member, outcome.status, outcome.message))
        if plan.evictions:
            await self._write_evictions(gang_unit(complete.name), plan.evictions, began)
        if not plan.batch:
            return
        traces = [self.book.contexts.get(event.key) for event in plan.batch]
        try:
            await (await self.fence.send_batch(plan.batch, began, traces))
        except BaseException:
            self.book.batch_refused(plan)
            raise
        self.book.batch_stored(plan)

    async def make_moves(self) -> None:
        """Moves for the large units whose turn it is (moving.py): each unit's moves and its commits
        written as one atomic batch; the engine goes back to the stream's state if it is not stored.
        A unit of claims of their own that no move in place makes room for asks for the Pods in its
        way to be evicted instead (`evicting.decide_unit`; its failures, written again, tell of it).
        Called from the retry round, holding `lock`."""
        for unit in moving.due(self.book, self.moves, time.time()):
            began = time.perf_counter()
            asked: list[ev.EvictionRequested] = []
            with telemetry.tracer().start_as_current_span("move", attributes={"dralloc.claim": unit.key}) as span:
                moves = await self._engine_work(moving.decide, self.book, unit)
                if moves is None:
                    asked = await self._engine_work(evicting.decide_unit, self.book, unit, time.time())
                span.set_attribute("dralloc.outcome", "moved" if moves is not None else "evicting" if asked else "no plan")
            if asked:
                await self._ask_evictions(unit, asked, began)
            if moves is None:
                continue
            traces = [self.book.contexts.get(event.key) for event in moves.batch]
            try:
                await (await self.fence.send_batch(moves.batch, began, traces))
            except BaseException:
                moving.refused(self.book, moves)
                raise
            moving.stored(self.book, moves)

    async def _ask_evictions(self, unit: Unit, asked: list[ev.EvictionRequested], began: float) -> None:
        """Write the failures of a unit of claims of their own again (they now tell of the evictions
        asked for it), then the requests as one atomic batch (`Evictions.refused` if not stored)."""
        for claim in unit.claims:
            await self._send_failure(self.book.failure(claim, "unsatisfiable", self.book.messages.get(claim.key, "")))
        await self._write_evictions(unit.key, asked, began)

    async def _write_evictions(self, unit: str, requests: Sequence[ev.EvictionRequested], began: float) -> None:
        """Write a unit's eviction requests as one atomic batch, stored before this returns; if they
        are not, the unit's evictions and hold end as if refused (`Evictions.refused`). A batch the bus
        can never store (`PublishRefused`, raised before anything is sent: the fence is intact) is a
        refusal with its backoff (`Evictions.unsendable`), and the term goes on: ended, its successor
        would plan the same batch again."""
        try:
            await (await self.fence.send_batch(list(requests), began))
        except PublishRefused as exc:
            log.error("allocator: the evictions for %s cannot be asked for: %s", unit, exc)
            self.book.evictions.unsendable(self.book, unit, str(exc), time.time())
            self.room_changed.set()  # (what was held is free again; the waiting unit's failures are written again)
        except BaseException:
            self.book.evictions.refused(self.book, unit)
            raise

    async def reserve_waiting(self) -> None:
        """Write the failures of waiting claims whose reservation began, moved or ended (reservations.py)."""
        for failure in self.book.reserve_waiting(time.time()):
            await self._send_failure(failure)

    async def release(self, release: ev.AllocationReleased) -> None:
        await self.fence.write(release)
        self.book.release_stored(release.key)
        self.room_changed.set()  # freed devices may fit a waiting claim

    def _stored(self, first: int, events: Sequence[ev.AllocationEvent], began: float | None) -> None:
        """A write is stored (`Fence`): the snapshot and the metrics take it into account."""
        self.snapshots.stored(first, events)
        for event in events:
            decision = isinstance(event, ev.AllocationCommitted | ev.AllocationFailed)
            allocator_metrics().decided(event, time.perf_counter() - began if decision and began else None)
