"""The allocator's book of decisions, around the engine: pure and synchronous (no bus, no asyncio).

It holds what the allocator has decided and what it still has to: the commits (which the engine's
ledger holds devices for), the failures this term wrote (so a retry that still does not fit writes
nothing again), the claims waiting for room, and the gangs gathering their members. It takes the
streams' events and returns the decisions to write; the service (`service.py`) writes them behind
the fence and tells it what became of each write, so it can undo what was not stored:

    step = book.submitted(claim, context)   # None | AllocationReleased | AllocationFailed
                                            # | Adopt | Allocate | GangComplete
    outcome, commit = book.allocate(claim, context)      # for Allocate (inside the "allocate" span)
    plan = book.decide_gang(complete)                    # for GangComplete
    book.commit_written(commit) / book.commit_not_written(key) / book.commit_refused(commit)
    book.failure(claim, status, message) -> AllocationFailed | None; book.failure_sent(failure)
    book.deleted(key, uid) -> AllocationReleased | None; book.release_stored(key)
    book.batch_stored(plan) / book.batch_refused(plan)

`context` is the caller's, opaque here (the service's trace context): it is kept with a waiting
claim and dropped when the claim stops waiting, so a retry continues the claim's one trace.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import msgspec

from dralloc.allocator.engine import Engine, Outcome
from dralloc.allocator.engine.gang import allocate_gang, gang_of
from dralloc.allocator.reservations import RESERVED_WORDS, Reservations, Unit
from dralloc.schemas import events as ev
from dralloc.schemas.limits import slice_problem
from dralloc.schemas.resource import AllocationResult, ResourceClaim, ResourceClaimConsumerReference, ResourceClaimStatus, ResourceSlice


@dataclass(frozen=True, slots=True)
class Adopt:
    """A claim that arrives allocated, conflicting with nothing held: the engine already holds its
    devices as they are; write `commit`."""

    commit: ev.AllocationCommitted


@dataclass(frozen=True, slots=True)
class Allocate:
    """A claim of its own, for `Decisions.allocate`."""

    claim: ResourceClaim


@dataclass(frozen=True, slots=True)
class GangComplete:
    """Every member of a gang is here (committed ones count), for `Decisions.decide_gang`."""

    name: str
    size: int
    domain: str | None


@dataclass(frozen=True, slots=True)
class AllocatePod:
    """A Pod's unit is complete (every claim it uses is here), for `Decisions.decide_pod`."""

    pod: str


@dataclass(slots=True)
class PodPlan:
    """A Pod's decisions: `batch` (its claims' commits, all or none, written as one atomic batch)
    or `failures` (every claim not yet allocated fails with the unit's reason; none holds devices)."""

    pod: str
    batch: list[ev.AllocationEvent] = field(default_factory=list)
    failures: list[ev.AllocationFailed] = field(default_factory=list)
    given_back: list[ResourceClaim] = field(default_factory=list)
    """Claims dralloc committed for this Pod that the batch releases (first) and places again: their
    node no longer fits the claims the cluster holds (a write of the unit lost to kube-scheduler)."""


@dataclass(slots=True)
class GangPlan:
    """A gang's decisions. `unplaced`: nothing to batch, each member fails on its own (none holds
    devices). Otherwise `batch` is written as one atomic batch, all stored or none."""

    name: str
    members: dict[str, ResourceClaim]
    """The gang's members not committed: the book's own collection, which the outcome updates."""
    given_back: list[ResourceClaim] = field(default_factory=list)
    """Committed members whose devices the batch gives back (the gang is decided again whole)."""
    batch: list[ev.AllocationEvent] = field(default_factory=list)
    placed: bool = False
    unplaced: list[tuple[ResourceClaim, Outcome]] = field(default_factory=list)


def node_binding_problem(slice_: ResourceSlice) -> str | None:
    """dralloc's rule binding a node-local slice to its node: its pool is named after the node,
    as the node-local pools of NVIDIA's driver, DraNet, the example driver and dralloc's discovery
    are. Slices travel on ``dra.inventory.<driver>.<pool>.<slice>``, so a node's credential
    allowed only its own pool's subjects can publish nothing for another node."""
    node, pool = slice_.spec.node_name, slice_.spec.pool.name
    if node is None or pool == node:
        return None
    return f"spec.pool.name {pool!r} is not spec.nodeName {node!r} (a node-local pool is named after its node)"


def failure_event(claim: ResourceClaim, status: str, message: str, pod: str = "", reserved: tuple[tuple[str, ...], float] = ((), 0.0)) -> ev.AllocationFailed:
    """`reserved`: the nodes held for the claim while it waits and when its wait is over (reservations.py)."""
    meta = claim.metadata
    return ev.AllocationFailed(
        namespace=meta.namespace or "default",
        name=meta.name,
        uid=meta.uid or "",
        generation=meta.generation or 1,
        reason="unsatisfiable" if status == "unsatisfiable" else "error",
        message=message or status,
        pod=pod,
        reserved_nodes=list(reserved[0]),
        reserved_until=reserved[1],
    )


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

    # -- the streams at start ---------------------------------------------------------

    def apply_inventory(self, event: ev.Event) -> str | None:
        """An inventory event into the engine; returns why it was refused, if it was. A refused
        slice takes its earlier version with it, so that what a rebuild replays (the latest event
        per subject) and what was applied live are the same inventory."""
        match event:
            case ev.ResourceSlicePublished(slice=obj):
                if (problem := slice_problem(obj) or node_binding_problem(obj)) is not None:
                    self.engine.remove("ResourceSlice", obj.metadata.name)
                    return f"ResourceSlice {obj.metadata.name} refused: {problem}"
                self.engine.apply(obj)
            case ev.DeviceClassPublished(device_class=obj) | ev.NodePublished(node=obj) | ev.DeviceTaintRulePublished(rule=obj):
                self.engine.apply(obj)
            case ev.ResourceSliceRemoved(name=name):
                self.engine.remove("ResourceSlice", name)
            case ev.DeviceClassRemoved(name=name):
                self.engine.remove("DeviceClass", name)
            case ev.NodeRemoved(name=name):
                self.engine.remove("Node", name)
            case ev.DeviceTaintRuleRemoved(name=name):
                self.engine.remove("DeviceTaintRule", name)
        return None

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
            elif _ended_in_error(self.replayed_decisions.get(event.claim.key), event.claim):
                self.parked[event.claim.key] = event.claim  # decided: the rebuild does not evaluate it again
            else:
                self.waiting[event.claim.key] = event.claim
        elif isinstance(event, ev.ClaimSubmitted) and event.cluster and _allocation(event.claim) is not None:
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
        if (parked := self.parked.get(key)) is not None and _same_generation(parked, claim):
            return None  # decided (an error): the same claim again is not evaluated again
        if claim.status is not None and claim.status.allocation is not None:
            self.unused.pop(key, None)
            if cluster:
                self.seen.add(key)
            return self._adopt(claim)
        if needs_pod:
            # Kubernetes allocates a claim for a Pod that uses it (delayed allocation): alone it waits.
            self.unused[key] = claim
            return self._pod_using(key)
        gang = gang_of(claim)
        if gang is not None and gang[1] > 1:
            return self._collect(claim, *gang, context)
        return Allocate(claim)

    def allocate(self, claim: ResourceClaim, context: Any = None) -> tuple[Outcome, ev.AllocationCommitted | None]:
        """Ask the engine; returns its outcome and, when allocated, the commit to write (the engine
        holds the devices until `commit_not_written` or `commit_refused`). A claim that does not fit
        waits: write `failure(...)`; then `reserve_waiting`."""
        (outcome,) = self._as_holder(_unit_key(claim), self.engine.allocate, [claim])
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
        unit = _unit_key(claim)
        if status == "unsatisfiable":
            message += self.reservations.words(unit)
        if (problem := self.reservations.problems.get(claim.key)) is not None:
            message += f"; {problem}"
        failure = failure_event(claim, status, message, self._pod_of(claim.key), reserved=self.reservations.shown(unit))
        return failure if self.failures.get(failure.key) != failure.msg_id else None

    def _pod_of(self, key: str) -> str:
        """The Pod whose unit the claim waits with (a gang member from a Pod), for its Events."""
        refs = self.reserved.get(key)
        return refs[0].name if refs else ""

    def reserve_waiting(self, now: float) -> list[ev.AllocationFailed]:
        """Reserve for the large claims and complete gangs that wait (reservations.py), oldest first,
        at time `now` (seconds since the epoch); returns the failures to write again for the claims
        whose reservation began, moved or ended. The engine holds every reservation until the next call."""
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
            units.append(Unit(f"gang:{name}", tuple(sorted(members.values(), key=lambda c: c.key)), domain))
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
        """Run engine `work` for `unit`: its own reservation is no penalty to it (every other unit's is)."""
        if self.reservations.held.get(unit) is None:
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

    # -- gangs ------------------------------------------------------------------------------

    def _collect(self, claim: ResourceClaim, name: str, size: int, domain: str | None, context: Any) -> ev.AllocationFailed | GangComplete | None:
        """A gang member (annotations `dralloc.dev/gang`, `-size`, `-domain`) waits, with no decision
        written, until all `size` members are here (committed ones count)."""
        if size > self.max_gang:
            return self.failure(claim, "error", f"gang {name}: {size} claims; at most {self.max_gang} are committed all or none")
        members = self.gangs.setdefault(name, {})
        members[claim.key] = claim
        self.waiting[claim.key] = claim
        self.contexts.setdefault(claim.key, context)
        if len(members) + len(self.gang_held.get(name, ())) < size:
            return None
        return GangComplete(name, size, domain)

    def decide_gang(self, complete: GangComplete) -> GangPlan:
        """The engine places the members not committed inside one domain, that of the committed ones
        if any (engine/gang.py). A gang that cannot be completed where its committed members are is
        given back and decided again whole, in the same batch."""
        name, domain = complete.name, complete.domain
        members = self.gangs[name]
        held = [self.committed[key].claim for key in self.gang_held.get(name, ())]
        claims = sorted([*members.values(), *held], key=lambda c: c.key)
        outcomes = self._as_holder(f"gang:{name}", allocate_gang, self.engine, claims, name=name, domain_label=domain)
        plan = GangPlan(name, members)
        if held and any(o.status != "allocated" for o in outcomes):
            # No room for the rest where the committed members are. A partial gang never keeps
            # devices: they are given back (in the batch) and the gang is decided whole.
            plan.given_back = held
            for member in held:
                self.engine.release(member.key)
                members[member.key] = msgspec.structs.replace(member, status=None)
            claims = sorted(members.values(), key=lambda c: c.key)
            outcomes = self._as_holder(f"gang:{name}", allocate_gang, self.engine, claims, name=name, domain_label=domain)
        plan.placed = all(o.status == "allocated" for o in outcomes)
        if not plan.placed and not plan.given_back:
            plan.unplaced = list(zip(claims, outcomes))  # all wait, none holds devices
            for member, outcome in plan.unplaced:
                if outcome.status == "unsatisfiable":
                    self.messages[member.key] = outcome.message
            return plan
        plan.batch = [
            ev.AllocationReleased(namespace=m.metadata.namespace or "default", name=m.metadata.name, uid=m.metadata.uid or "", allocation=_allocation(m))
            for m in plan.given_back
        ]
        for member, outcome in zip(claims, outcomes):
            if not plan.placed:
                plan.batch.append(failure_event(member, outcome.status, outcome.message, self._pod_of(member.key)))
            elif member.key in members:
                plan.batch.append(ev.AllocationCommitted(claim=self._decided(member, outcome), node=outcome.node))
        return plan

    def batch_stored(self, plan: GangPlan) -> None:
        for member in plan.given_back:
            self._forget(member.key)
            self.waiting[member.key] = plan.members[member.key]
        for event in plan.batch:
            if isinstance(event, ev.AllocationCommitted):
                self._record(event)
                self._stop_waiting(event.key)
            elif isinstance(event, ev.AllocationFailed):
                self.failures[event.key] = event.msg_id
        if plan.placed:
            del self.gangs[plan.name]

    def batch_refused(self, plan: GangPlan) -> None:
        """None of the batch was stored (or, if the answer was lost, the term is over and the next one
        reads the stream): the engine and the gang go back to what the stream holds."""
        for key in plan.members:
            self.engine.release(key)
        for member in plan.given_back:
            del plan.members[member.key]
            self.engine.restore(self.committed[member.key].claim)

    # -- Pods ---------------------------------------------------------------------------------

    def pod_submitted(self, pod: ev.PodSubmitted) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
        """A Pod waiting for dralloc: its unit (the claims it uses) is decided once every claim is here."""
        self.pods[pod.key] = pod
        return self._pod_step(pod.key)

    def pod_deleted(self, key: str, uid: str) -> None:
        """The Pod is gone: its unit is forgotten (its claims are released by their own deletion; a
        shared claim stays allocated, as in Kubernetes)."""
        for units in (self.pods, self.decided_pods):
            pod = units.get(key)
            if pod is not None and (not uid or pod.uid == uid):
                del units[key]
        if key not in self.pods:
            self.pods_waiting.discard(key)

    def _pod_done(self, key: str) -> None:
        """Nothing left to decide for the Pod now (kept, in case the cluster takes a claim elsewhere)."""
        self.decided_pods[key] = self.pods.pop(key)
        self.pods_waiting.discard(key)

    def _pod_using(self, claim_key: str) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
        """A claim waiting for a Pod arrived: the first Pod waiting for it whose unit it completes."""
        namespace, name = claim_key.split("/", 1)
        for key, pod in list(self.pods.items()):
            if pod.namespace == namespace and name in pod.claims:
                step = self._pod_step(key)
                if step is not None:
                    return step
        return None

    def _pod_step(self, key: str) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
        """AllocatePod once every claim of the Pod is here (committed or waiting for a Pod); None
        while one is missing, or when all are committed already (nothing left to decide). A Pod
        whose one claim still to allocate is a gang member joins its gang (a gang of Pods)."""
        pod = self.pods[key]
        pending = []
        for name in pod.claims:
            claim_key = f"{pod.namespace}/{name}"
            if claim_key in self.committed:
                continue
            claim = self.unused.get(claim_key)
            if claim is None:
                return None  # not here yet: the claim's own event completes the unit
            pending.append(claim)
        if not pending and len(self._unit_nodes(pod)) <= 1:
            self._pod_done(key)  # every claim allocated, on one node: nothing left to decide for it
            return None
        for claim in pending:
            self.reserved[claim.key] = [ResourceClaimConsumerReference(resource="pods", name=pod.name, uid=pod.uid)]
        gang = gang_of(pending[0]) if pending else None
        if len(pending) == 1 and gang is not None and gang[1] > 1:
            del self.unused[pending[0].key]
            self._pod_done(key)
            return self._collect(pending[0], *gang, None)
        return AllocatePod(key)

    def decide_pod(self, step: AllocatePod) -> PodPlan:
        """The engine places the Pod's claims not allocated yet together, on one node: the node of
        its claims already allocated (a shared claim), if any. Allocated: `batch` (the engine holds
        the devices until `pod_stored` or `pod_refused`); not: each claim's failure, the Pod waits."""
        pod = self.pods[step.pod]
        keys = [f"{pod.namespace}/{name}" for name in pod.claims]
        pending = [self.unused[k] for k in keys if k not in self.committed]
        plan = PodPlan(step.pod)
        nodes = self._unit_nodes(pod)
        if len(nodes) > 1:
            # The cluster holds a claim of the unit elsewhere (kube-scheduler's write landed first):
            # what dralloc placed for this Pod is given back and placed again next to it.
            plan.given_back = [self.committed[k].claim for k in keys if self.made_for.get(k) == step.pod and k in self.committed]
            for claim in plan.given_back:
                self.engine.release(claim.key)
                self.reserved[claim.key] = list(claim.status.reserved_for) if claim.status else []
            pending += [msgspec.structs.replace(c, status=None) for c in plan.given_back]
            nodes = self._unit_nodes(pod, without={c.key for c in plan.given_back})
        if len(nodes) > 1:
            message = f"Pod {pod.key}: its claims are already allocated on different nodes ({', '.join(sorted(nodes))}); it can never run"
            outcomes = [Outcome(claim=c.key, status="error", message=message) for c in pending]
        else:
            outcomes = self.engine.allocate(pending, node=next(iter(nodes), None), together=True)
        if all(o.status == "allocated" for o in outcomes):
            plan.batch = [
                ev.AllocationReleased(namespace=c.metadata.namespace or "default", name=c.metadata.name, uid=c.metadata.uid or "", allocation=_allocation(c))
                for c in plan.given_back
            ]
            plan.batch += [ev.AllocationCommitted(claim=self._decided(c, o), node=o.node) for c, o in zip(pending, outcomes)]
            return plan
        for claim in plan.given_back:  # no better place: they keep what they had
            self.engine.restore(self.committed[claim.key].claim)
        plan.given_back = []
        for claim, outcome in zip(pending, outcomes):  # (the engine commits a unit whole or not at all)
            message = outcome.message if outcome.message.startswith(f"Pod {pod.key}") else f"Pod {pod.key}: {outcome.message}"
            failure = failure_event(claim, outcome.status, message, pod.name)
            if self.failures.get(failure.key) != failure.msg_id:
                plan.failures.append(failure)
        self.pods_waiting.add(step.pod)
        return plan

    def pod_stored(self, plan: PodPlan) -> None:
        for claim in plan.given_back:
            if claim.status is not None and claim.status.allocation is not None:
                self.given_back[claim.key] = claim.status.allocation
            self._forget(claim.key)
        for event in plan.batch:
            if isinstance(event, ev.AllocationCommitted):
                self.unused.pop(event.key, None)
                self._record(event)
                self.made_for[event.key] = plan.pod
                self._stop_waiting(event.key)
        self._pod_done(plan.pod)

    def pod_refused(self, plan: PodPlan) -> None:
        """None of the batch was stored: the engine gives the devices back, what was given back is
        held again (the Pod is tried again)."""
        for event in plan.batch:
            if isinstance(event, ev.AllocationCommitted):
                self.engine.release(event.key)
        for claim in plan.given_back:
            self.engine.restore(self.committed[claim.key].claim)
        self.pods_waiting.add(plan.pod)

    def _unit_nodes(self, pod: ev.PodSubmitted, without: frozenset[str] | set[str] = frozenset()) -> set[str]:
        """The nodes the Pod's committed claims (but `without`) are allocated on (network-attached: none)."""
        nodes = set()
        for name in pod.claims:
            record = self.engine.ledger.claims.get(f"{pod.namespace}/{name}")
            if record is not None and record.node is not None and record.claim not in without and record.claim in self.committed:
                nodes.add(record.node)
        return nodes

    def _cluster_truth(self, claim: ResourceClaim) -> ev.AllocationReleased | None:
        """A committed claim as the cluster holds it now: a release of dralloc's decision when the
        cluster holds another allocation (a status write lost to kube-scheduler) or none any more
        after it had shown one (deallocated by the resourceclaim controller); None when it agrees
        (or dralloc's write has not landed yet)."""
        key = claim.key
        have = _allocation(claim)
        ours = self.committed[key].allocation
        stale = self.given_back.get(key)
        if have is not None and ours is not None and _same(have, ours):
            self.given_back.pop(key, None)  # the cluster has caught up with the re-placement
        if have is not None and stale is not None and _same(have, stale):
            return None  # dralloc's earlier write, seen before its release: not news
        if have is not None:
            if ours is not None and _same(have, ours):
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
        if claim is not None and self.reservations.drop(_unit_key(claim)):  # placed or deleted: it ends now
            self.engine.reserve(self.reservations.others(""))
        self.waiting.pop(key, None)
        self.parked.pop(key, None)
        self.contexts.pop(key, None)
        self.failures.pop(key, None)
        self.messages.pop(key, None)


def _unit_key(claim: ResourceClaim) -> str:
    """What a claim waits as (reservations.Unit.key): its gang, or itself."""
    gang = gang_of(claim)
    return f"gang:{gang[0]}" if gang is not None and gang[1] > 1 else claim.key


def _same_generation(a: ResourceClaim, b: ResourceClaim) -> bool:
    return a.metadata.uid == b.metadata.uid and (a.metadata.generation or 1) == (b.metadata.generation or 1)


def _ended_in_error(decision: ev.AllocationEvent | None, claim: ResourceClaim) -> bool:
    """Is `decision` (the claim's last in ALLOCATIONS) an `error` for this very claim and generation?"""
    return (
        isinstance(decision, ev.AllocationFailed)
        and decision.reason == "error"
        and decision.uid == (claim.metadata.uid or "")
        and decision.generation == (claim.metadata.generation or 1)
    )


def _allocation(claim: ResourceClaim) -> AllocationResult | None:
    return claim.status.allocation if claim.status is not None else None


def _same(a: AllocationResult, b: AllocationResult) -> bool:
    """The same devices, config and node selector (when it was written is not what was written)."""
    return msgspec.structs.replace(a, allocation_timestamp=None) == msgspec.structs.replace(b, allocation_timestamp=None)
