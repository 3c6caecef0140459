"""The allocator's book of decisions, around the engine: pure and synchronous (no bus, no asyncio).

It holds what the allocator has decided and what it still has to: the commits (which the engine's
ledger holds devices for), the failures this term wrote (so a retry that still does not fit writes
nothing again), the claims waiting for room, and the gangs gathering their members. It takes the
streams' events and returns the decisions to write (steps.py); the service (`shell.py`) writes
them behind the fence and tells it what became of each write, so it can undo what was not stored:

    step = book.submitted(claim, context)   # None | AllocationReleased | AllocationFailed
                                            # | Adopt | Allocate | GangComplete
    outcome, commit = book.allocate(claim, context)      # for Allocate (inside the "allocate" span)
    plan = book.decide_gang(complete)                    # for GangComplete
    book.commit_written(commit) / book.commit_not_written(key) / book.commit_refused(commit)
    book.failure(claim, status, message) -> AllocationFailed | None; book.failure_sent(failure)
    book.deleted(key, uid) -> AllocationReleased | None; book.release_stored(key)
    book.batch_stored(plan) / book.batch_refused(plan)

The parts: the gangs (gangs.py), the Pods' units (pod_units.py), inventory intake
(inventory_intake.py), reservations (reservations.py), facts about claims (claims.py).

`context` is the caller's, opaque here (the service's trace context): it is kept with a waiting
claim and dropped when the claim stops waiting, so a retry continues the claim's one trace.
"""

from __future__ import annotations

from typing import Any

import msgspec

from dralloc.allocator import gangs, pod_units
from dralloc.allocator.claims import allocation_of, ended_in_error, same_generation, unit_key
from dralloc.allocator.engine import Engine, Outcome
from dralloc.allocator.engine.gang import gang_of
from dralloc.allocator.evicting import Evictions
from dralloc.allocator.inventory_intake import apply_inventory, node_binding_problem
from dralloc.allocator.reservations import RESERVED_WORDS, Reservations, Unit, gang_unit
from dralloc.allocator.steps import Adopt, Allocate, AllocatePod, GangComplete, GangPlan, PodPlan, failure_event
from dralloc.schemas import events as ev
from dralloc.schemas.allocation import same_allocation
from dralloc.schemas.resource import AllocationResult, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus

__all__ = [
    "Adopt", "Allocate", "AllocatePod", "Decisions", "GangComplete", "GangPlan", "PodPlan", "failure_event", "node_binding_problem",
]  # fmt: skip
"""The book and what it returns (steps.py), importable from here as before."""


class Decisions:
    """The allocator's state around the engine (see the module docstring)."""

    def __init__(self, engine: Engine | None = None, *, max_gang: int, max_wait: float = 0.0) -> None:
        self.engine = engine or Engine()
        self.max_gang = max_gang
        self.reservations = Reservations(self.engine, max_wait)
        """What large waiting claims and gangs hold (reservations.py); `max_wait`: seconds they may,
        unless a claim's `dralloc.dev/max-wait` says otherwise (0: only those that say so)."""
        self.messages: dict[str, str] = {}
        """Waiting claim key -> why it did not fit last (written again when its reservation changes)."""
        """The largest gang committed all or none (one batch may give back size - 1 members and commit all size)."""
        self.committed: dict[str, ev.AllocationCommitted] = {}
        """Claim key -> its commit: stored, or sent (and forgotten again if it is refused)."""
        self.failures: dict[str, str] = {}
        """Claim key -> message id of the failure this term wrote for it (an identical one is not written again)."""
        self.waiting: dict[str, ResourceClaim] = {}
        self.parked: dict[str, ResourceClaim] = {}
        """Claims whose decision is an `error` (an invalid claim, a class not known yet, a selector that
        failed or spent its evaluation budget): tried again only after the inventory changes (`unpark`),
        never at a release, a rebuild or a resubmission of the same generation, so an expensive claim is
        not evaluated again and again."""
        self.contexts: dict[str, Any] = {}
        """Each waiting claim's context (the caller's; see the module docstring)."""
        self.gangs: dict[str, dict[str, ResourceClaim]] = {}
        """Gang name -> the member claims here so far, not committed (see `decide_gang`)."""
        self.gang_held: dict[str, set[str]] = {}
        """Gang name -> keys of its committed members."""
        self.replayed_decisions: dict[str, ev.AllocationEvent] = {}
        """Claim key -> its last decision replayed from ALLOCATIONS (for `gone`)."""
        self.replayed_claims: set[str] = set()
        """Keys of the claims CLAIMS held an event for when replayed (for `gone`)."""
        self.unused: dict[str, ResourceClaim] = {}
        """Claims allocated only with a Pod that uses them (`needs_pod`), waiting for one."""
        self.pods: dict[str, ev.PodSubmitted] = {}
        """Pods waiting for dralloc (pod key -> its unit), until allocated, deleted or ungated."""
        self.pods_waiting: set[str] = set()
        """Pods whose unit is complete but did not fit: tried again when room changes."""
        self.decided_pods: dict[str, ev.PodSubmitted] = {}
        """Pods whose unit was committed (until the Pod is deleted): decided again if the cluster
        takes one of its claims elsewhere."""
        self.made_for: dict[str, str] = {}
        """Claim key -> the Pod whose unit dralloc committed it with."""
        self.given_back: dict[str, AllocationResult] = {}
        """Claim key -> dralloc's own allocation it gave back to place the claim again: the cluster
        still showing it is a stale view, not someone else's allocation."""
        self.reserved: dict[str, list[ResourceClaimConsumerReference]] = {}
        """Claim key -> the Pod a commit reserves it for (`status.reservedFor`), from its unit."""
        self.seen: set[str] = set()
        """Keys of committed claims whose allocation the cluster has shown (`ClaimSubmitted.cluster`):
        one the cluster no longer shows after that was deallocated there."""
        self.evictions = Evictions()
        """Evictions asked for waiting Pods, in flight (evicting.py; with moves on)."""

    # -- the streams at start ---------------------------------------------------------

    def apply_inventory(self, event: ev.Event) -> str | None:
        """An inventory event into the engine (inventory_intake.py); returns why it was refused, if it was."""
        return apply_inventory(self.engine, event)

    def replayed(self, event: ev.Event) -> None:
        """An event of ALLOCATIONS (a commit is restored into the engine) or, after all of those, of
        CLAIMS (a claim not committed waits)."""
        if isinstance(event, ev.AllocationCommitted | ev.AllocationFailed | ev.AllocationReleased):
            self.replayed_decisions[event.key] = event
            if isinstance(event, ev.AllocationFailed):
                self.failures[event.key] = event.msg_id  # on record: the same failure is not written again
            else:
                self.failures.pop(event.key, None)
            if isinstance(event, ev.AllocationFailed) and event.reserved_until:
                # a wait an earlier term began: it goes on (until then), and its failure stands as written
                self.reservations.replayed[event.key] = event.reserved_until
                self.messages[event.key] = event.message.split(RESERVED_WORDS, 1)[0]
            else:
                self.reservations.replayed.pop(event.key, None)
                self.messages.pop(event.key, None)
        elif isinstance(event, ev.ClaimSubmitted):
            self.replayed_claims.add(event.claim.key)
        elif isinstance(event, ev.ClaimDeleted):
            self.replayed_claims.add(event.key)
        if isinstance(event, ev.AllocationCommitted):
            self.engine.restore(event.claim)
            self._record(event)
        elif isinstance(event, ev.ClaimSubmitted) and not self.is_committed(event.claim):
            if event.needs_pod:
                self.unused[event.claim.key] = event.claim
            elif ended_in_error(self.replayed_decisions.get(event.claim.key), event.claim):
                self.parked[event.claim.key] = event.claim  # decided: the rebuild does not evaluate it again
            else:
                self.waiting[event.claim.key] = event.claim
        elif isinstance(event, ev.ClaimSubmitted) and event.cluster and allocation_of(event.claim) is not None:
            self.seen.add(event.claim.key)
        elif isinstance(event, ev.PodSubmitted):
            self.pods[event.key] = event
            self.pods_waiting.add(event.key)  # decided (or found decided) after the rebuild

    def gone(self, decided: dict[str, ev.AllocationEvent] | None = None, present: set[str] | None = None) -> list[ev.AllocationReleased]:
        """After the rebuild: the releases to write for claims whose last decision (`decided`, the
        replayed ALLOCATIONS by claim key) stands though CLAIMS holds nothing of them any more
        (`present`: the keys CLAIMS has an event for); without them, what `replayed` saw (then forgotten). CLAIMS keeps each claim's latest event and a
        delete expires (`bus.TOMBSTONE_TTL_S`): a claim with nothing there was deleted, and its
        delete expired unseen. A commit's devices are freed (`release_stored` once written); a
        failure is superseded too, so its claim's subject empties in turn."""
        if decided is None and present is None:  # the rebuild's own call: what it replayed is not needed after
            decided, present = self.replayed_decisions, self.replayed_claims
            self.replayed_decisions, self.replayed_claims = {}, set()
        assert decided is not None and present is not None
        releases = []
        for key, event in decided.items():
            if key in present or not isinstance(event, ev.AllocationCommitted | ev.AllocationFailed):
                continue
            namespace, name = key.split("/", 1)
            allocation = event.allocation if isinstance(event, ev.AllocationCommitted) else None
            releases.append(ev.AllocationReleased(namespace=namespace, name=name, uid=event.uid, allocation=allocation))
        return releases

    # -- claim events -------------------------------------------------------------------

    def plain(self, claim: ResourceClaim, *, cluster: bool = False, needs_pod: bool = False) -> bool:
        """Would `submitted` surely return `Allocate(claim)`, changing nothing? A claim of its own (not
        a gang member, not waiting for a Pod, not arriving allocated, not from the cluster's view),
        not committed or parked under its name: first seen, or waiting. Such claims can be asked of
        the engine together (the service decides them in one hop to its thread)."""
        key = claim.key
        if cluster or needs_pod or key in self.committed or key in self.parked:
            return False
        if claim.status is not None and claim.status.allocation is not None:
            return False
        gang = gang_of(claim)
        return gang is None or gang[1] <= 1

    def on_record(self, claim: ResourceClaim) -> bool:
        """Is this claim, as delivered, one whose failure is already on record (this term wrote it, or
        it was replayed from ALLOCATIONS) and that waits for room? A redelivery (an ack that came too
        late, a new term's consumer handing back what the last one never acked) or the same claim
        published again: it is acked with nothing written, and tried again when room changes
        (`retry_waiting`), never decided again per delivery. (A committed claim delivered again is
        `submitted`'s: the cluster's view it carries may be news.)"""
        key = claim.key
        failure = self.failures.get(key)
        if failure is None or self.waiting.get(key) != claim:
            return False
        meta = claim.metadata
        return failure.startswith(f"failed:{meta.uid or key}:{meta.generation or 1}:")

    def submitted(
        self, claim: ResourceClaim, context: Any = None, *, cluster: bool = False, needs_pod: bool = False
    ) -> None | ev.AllocationReleased | ev.AllocationFailed | Adopt | Allocate | GangComplete | AllocatePod:
        """What a submitted claim asks for (`cluster`, `needs_pod`: the event's flags):
        - None: nothing to write (a redelivery of a commit; a gang member waiting for the others;
          a claim waiting for a Pod);
        - AllocationReleased: the claim replaced a committed one of its name (deleted and re-created),
          or the cluster holds another allocation for it, or none any more: write the release,
          `release_stored`, then submit the claim again (the cluster's allocation is then adopted);
        - AllocationFailed: write it, then `failure_sent` (a gang too large to commit all or none;
          an allocation made elsewhere that conflicts with one held, see `_adopt`);
        - Adopt, Allocate, GangComplete, AllocatePod: see each."""
        key = claim.key
        if self.is_committed(claim):
            if cluster and (release := self._cluster_truth(claim)) is not None:
                return release
            # Seen before (a redelivery): the book only holds decisions stored in ALLOCATIONS (or
            # on their way, and forgotten if refused), so there is nothing to write again.
            self._stop_waiting(key)
            return None
        if key in self.committed:
            # Same name, new object: the old one was deleted and re-created (we missed or raced the delete).
            return self.deleted(key, self.committed[key].claim.metadata.uid or "")
        if (parked := self.parked.get(key)) is not None and same_generation(parked, claim):
            return None  # decided (an error): the same claim again is not evaluated again
        if claim.status is not None and claim.status.allocation is not None:
            self.unused.pop(key, None)
            if cluster:
                self.seen.add(key)
            return self._adopt(claim)
        if needs_pod:
            # Kubernetes allocates a claim for a Pod that uses it (delayed allocation): alone it waits.
            self.unused[key] = claim
            return pod_units.pod_using(self, key)
        gang = gang_of(claim)
        if gang is not None and gang[1] > 1:
            return gangs.collect(self, claim, *gang, context)
        return Allocate(claim)

    def allocate(self, claim: ResourceClaim, context: Any = None) -> tuple[Outcome, ev.AllocationCommitted | None]:
        """Ask the engine; returns its outcome and, when allocated, the commit to write (the engine
        holds the devices until `commit_not_written` or `commit_refused`). A claim that does not fit
        waits: write `failure(...)`; then `reserve_waiting`."""
        (outcome,) = self._as_holder(unit_key(claim), self.engine.allocate, [claim])
        if outcome.status != "allocated":
            if outcome.status == "error":
                self.waiting.pop(claim.key, None)
                self.parked[claim.key] = claim
            else:
                self.waiting[claim.key] = claim
                self.messages[claim.key] = outcome.message
            self.contexts[claim.key] = context
            return outcome, None
        return outcome, ev.AllocationCommitted(claim=self._decided(claim, outcome), node=outcome.node)

    def deleted(self, key: str, uid: str) -> ev.AllocationReleased | None:
        """A claim deleted (`uid` empty: whichever object has that name): it stops waiting; returns
        the release to write if it is committed (then `release_stored`)."""
        self.given_back.pop(key, None)
        unused = self.unused.get(key)
        if unused is not None and (not uid or unused.metadata.uid == uid):
            del self.unused[key]
        waiting = self.waiting.get(key) or self.parked.get(key)
        if waiting is not None and (not uid or waiting.metadata.uid == uid):
            self._stop_waiting(key)
            for members in self.gangs.values():
                members.pop(key, None)
        done = self.committed.get(key)
        if done is None or (uid and done.claim.metadata.uid != uid):
            return None
        namespace, name = key.split("/", 1)
        return ev.AllocationReleased(namespace=namespace, name=name, uid=done.claim.metadata.uid or "", allocation=done.allocation)

    def failure(self, claim: ResourceClaim, status: str, message: str) -> ev.AllocationFailed | None:
        """The claim's failure to write, or None when this term already wrote the same one (a retry
        that still does not fit)."""
        unit = unit_key(claim)
        if status == "unsatisfiable":
            message += self.reservations.words(unit) + self.reservations.kept_from(claim)
        if (problem := self.reservations.problems.get(claim.key)) is not None:
            message += f"; {problem}"
        reserved = self.reservations.shown(unit)
        if unit in self.evictions.inflight:  # (a gang of Pods whose evictions run: evicting.py)
            message += self.evictions.note(unit)
            shown = self.evictions.shown(unit)
            reserved = shown if shown[0] else reserved
        failure = failure_event(claim, status, message, self._pod_of(claim.key), reserved=reserved)
        return failure if self.failures.get(failure.key) != failure.msg_id else None

    def _pod_of(self, key: str) -> str:
        """The Pod whose unit the claim waits with (a gang member from a Pod), for its Events."""
        refs = self.reserved.get(key)
        return refs[0].name if refs else ""

    def reserve_waiting(self, now: float) -> list[ev.AllocationFailed]:
        """Reserve for the large claims and complete gangs that wait (reservations.py), oldest first,
        at time `now` (seconds since the epoch); returns the failures to write again for the claims
        whose reservation began, moved or ended. The engine holds every reservation until the next call."""
        self.evictions.settle(self, now)  # (what a Pod placed or gone held while its evictions ran ends here)
        units: list[Unit] = []
        gangs: set[str] = set()
        for key, claim in self.waiting.items():
            if key not in self.messages:
                continue  # not tried yet, or not unsatisfiable
            gang = gang_of(claim)
            if gang is None or gang[1] <= 1:
                units.append(Unit(key, (claim,)))
                continue
            name, size, domain = gang
            members = self.gangs.get(name, {})
            if name in gangs or self.gang_held.get(name) or len(members) < size:
                continue  # one unit per gang; a gang not all here (or partly committed) holds nothing
            gangs.add(name)
            units.append(Unit(gang_unit(name), tuple(sorted(members.values(), key=lambda c: c.key)), domain))
        changed = set(self.reservations.plan(units, now))
        self.engine.reserve(self.reservations.others(""))
        out = []
        for unit in units:
            if unit.key in changed:
                for claim in unit.claims:
                    failure = self.failure(claim, "unsatisfiable", self.messages.get(claim.key, ""))
                    if failure is not None:
                        out.append(failure)
        return out

    def may_hold(self, claim: ResourceClaim) -> bool:
        """Whether the claim may hold a reservation at all (a max wait above 0): only then does its
        failure call for `reserve_waiting` at once (otherwise the next retry round does)."""
        return self.reservations.max_wait(claim) > 0

    def _as_holder(self, unit: str, work, *args, **kwargs):
        """Run engine `work` for `unit` (a Pod's key for a Pod): its own reservation, or what is held for
        it while its evictions run, is no penalty to it (every other unit's is)."""
        if self.reservations.held.get(unit) is None and unit not in self.reservations.evicting:
            return work(*args, **kwargs)
        self.engine.reserve(self.reservations.others(unit))
        try:
            return work(*args, **kwargs)
        finally:
            self.engine.reserve(self.reservations.others(""))

    # -- what became of the writes ---------------------------------------------------------

    def commit_written(self, event: ev.AllocationCommitted) -> None:
        """A commit was sent (or, adopted, stored): the claim is decided."""
        self._record(event)
        self._stop_waiting(event.key)

    def commit_not_written(self, key: str) -> None:
        """A commit was never sent: the engine gives its devices back (the redelivery decides again)."""
        self.engine.release(key)

    def commit_refused(self, event: ev.AllocationCommitted) -> None:
        """A commit sent was not stored: it is forgotten (the term is over; its redelivery decides again)."""
        if self.committed.get(event.key) is event:
            self._forget(event.key)
            self.engine.release(event.key)

    def failure_sent(self, event: ev.AllocationFailed) -> None:
        self.failures[event.key] = event.msg_id

    def release_stored(self, key: str) -> None:
        self.engine.release(key)
        if key in self.committed:  # (a release may supersede a failure: nothing held)
            self._forget(key)

    # -- gangs (gangs.py) and Pods (pod_units.py) -----------------------------------------------

    def decide_gang(self, complete: GangComplete, evict_at: float | None = None) -> GangPlan:
        """`gangs.decide_gang`: the engine places a complete gang's members inside one domain; with
        `evict_at` (moves on) the Pods in a gang of Pods' way are to be evicted if it does not fit."""
        return gangs.decide_gang(self, complete, evict_at)

    def batch_stored(self, plan: GangPlan) -> None:
        gangs.batch_stored(self, plan)

    def batch_refused(self, plan: GangPlan) -> None:
        gangs.batch_refused(self, plan)

    def pod_submitted(self, pod: ev.PodSubmitted) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
        """`pod_units.pod_submitted`: a Pod waiting for dralloc; its unit is decided once every claim is here."""
        return pod_units.pod_submitted(self, pod)

    def pod_deleted(self, key: str, uid: str) -> None:
        pod_units.pod_deleted(self, key, uid)

    def decide_pod(self, step: AllocatePod, evict_at: float | None = None) -> PodPlan:
        """`pod_units.decide_pod`: the engine places a Pod's claims together, on one node; with
        `evict_at` (moves on) the Pods in its way are to be evicted if it does not fit."""
        return pod_units.decide_pod(self, step, evict_at)

    def pod_stored(self, plan: PodPlan) -> None:
        pod_units.pod_stored(self, plan)

    def pod_refused(self, plan: PodPlan) -> None:
        pod_units.pod_refused(self, plan)

    def _cluster_truth(self, claim: ResourceClaim) -> ev.AllocationReleased | None:
        """A committed claim as the cluster holds it now: a release of dralloc's decision when the
        cluster holds another allocation (a status write lost to kube-scheduler) or none any more
        after it had shown one (deallocated by the resourceclaim controller); None when it agrees
        (or dralloc's write has not landed yet)."""
        key = claim.key
        have = allocation_of(claim)
        ours = self.committed[key].allocation
        stale = self.given_back.get(key)
        if have is not None and ours is not None and same_allocation(have, ours):
            self.given_back.pop(key, None)  # the cluster has caught up with the re-placement
        if have is not None and stale is not None and same_allocation(have, stale):
            return None  # dralloc's earlier write, seen before its release: not news
        if have is not None:
            if ours is not None and same_allocation(have, ours):
                self.seen.add(key)
                return None
            self.seen.discard(key)
            pod = self.made_for.get(key)
            if pod is not None and pod in self.decided_pods:  # its unit's other claims must follow it
                self.pods[pod] = self.decided_pods.pop(pod)
                self.pods_waiting.add(pod)
            return self.deleted(key, claim.metadata.uid or "")
        if key in self.seen:
            self.seen.discard(key)
            return self.deleted(key, claim.metadata.uid or "")
        return None

    def _decided(self, claim: ResourceClaim, outcome: Outcome) -> ResourceClaim:
        """The claim as committed: its allocation, and the Pod its unit reserves it for."""
        status = ResourceClaimStatus(allocation=outcome.allocation, reserved_for=self.reserved.pop(claim.key, []))
        return msgspec.structs.replace(claim, status=status)

    # -- bookkeeping -------------------------------------------------------------------------

    def is_committed(self, claim: ResourceClaim) -> bool:
        done = self.committed.get(claim.key)
        return done is not None and done.claim.metadata.uid == claim.metadata.uid

    def _adopt(self, claim: ResourceClaim) -> Adopt | ev.AllocationFailed | None:
        """A claim that arrives allocated (by Kubernetes, by an earlier run written back to it, or
        written into a file by hand): adopted as it is, recorded as committed and never decided
        again, only if it conflicts with nothing held (devices, share ids, capacity, counters;
        any namespace's claims). Otherwise it fails with an `error` naming the holders, and holds
        nothing (None: this term already wrote that failure)."""
        conflicts = self.engine.adopt(claim)
        if conflicts:
            return self.failure(claim, "error", "status.allocation not adopted, it conflicts with allocations held: " + "; ".join(conflicts))
        record = self.engine.ledger.claims.get(claim.key)
        return Adopt(ev.AllocationCommitted(claim=claim, node=record.node if record is not None else None))

    def _record(self, event: ev.AllocationCommitted) -> None:
        self.committed[event.key] = event
        gang = gang_of(event.claim)
        if gang is not None and gang[1] > 1:
            self.gang_held.setdefault(gang[0], set()).add(event.key)

    def _forget(self, key: str) -> None:
        self.seen.discard(key)
        self.made_for.pop(key, None)
        gang = gang_of(self.committed.pop(key).claim)
        if gang is not None and (held := self.gang_held.get(gang[0])) is not None:
            held.discard(key)
            if not held:
                del self.gang_held[gang[0]]

    def unpark(self) -> None:
        """The inventory changed: the claims decided as errors wait again (a class or device may
        have come that changes their verdict)."""
        self.waiting.update(self.parked)
        self.parked.clear()

    def _stop_waiting(self, key: str) -> None:
        claim = self.waiting.get(key)
        if claim is not None and self.reservations.drop(unit_key(claim)):  # placed or deleted: it ends now
            self.engine.reserve(self.reservations.others(""))
        self.waiting.pop(key, None)
        self.parked.pop(key, None)
        self.contexts.pop(key, None)
        self.failures.pop(key, None)
        self.messages.pop(key, None)
