"""The Pods of the book of decisions: a Pod waiting for dralloc has its unit (the claims it uses)
decided once every claim is here, all on one node, the commits written as one atomic batch
(`PodPlan`); a claim the cluster allocates elsewhere brings its unit's other claims after it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dralloc.allocator import evicting
from dralloc.allocator.claims import allocation_of
from dralloc.allocator.engine import Outcome
from dralloc.allocator.engine.gang import gang_of
from dralloc.allocator.gangs import collect
from dralloc.allocator.reservations import pod_unit
from dralloc.allocator.steps import AllocatePod, GangComplete, PodPlan, failure_event
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaimConsumerReference

if TYPE_CHECKING:
    from dralloc.allocator.decisions import Decisions


def pod_submitted(book: Decisions, pod: ev.PodSubmitted) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
    """A Pod waiting for dralloc: its unit (the claims it uses) is decided once every claim is here."""
    book.pods[pod.key] = pod
    return pod_step(book, pod.key)


def pod_deleted(book: Decisions, key: str, uid: str) -> None:
    """The Pod is gone: its unit is forgotten (its claims are released by their own deletion; a
    shared claim stays allocated, as in Kubernetes)."""
    for units in (book.pods, book.decided_pods):
        pod = units.get(key)
        if pod is not None and (not uid or pod.uid == uid):
            del units[key]
    if key not in book.pods:
        book.pods_waiting.discard(key)


def pod_done(book: Decisions, key: str) -> None:
    """Nothing left to decide for the Pod now (kept, in case the cluster takes a claim elsewhere)."""
    book.decided_pods[key] = book.pods.pop(key)
    book.pods_waiting.discard(key)


def pod_using(book: Decisions, claim_key: str) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
    """A claim waiting for a Pod arrived: the first Pod waiting for it whose unit it completes."""
    namespace, name = claim_key.split("/", 1)
    for key, pod in list(book.pods.items()):
        if pod.namespace == namespace and name in pod.claims:
            step = pod_step(book, key)
            if step is not None:
                return step
    return None


def pod_step(book: Decisions, key: str) -> AllocatePod | GangComplete | ev.AllocationFailed | None:
    """AllocatePod once every claim of the Pod is here (committed or waiting for a Pod); None
    while one is missing, or when all are committed already (nothing left to decide). A Pod
    whose one claim still to allocate is a gang member joins its gang (a gang of Pods)."""
    pod = book.pods[key]
    pending = []
    for name in pod.claims:
        claim_key = f"{pod.namespace}/{name}"
        if claim_key in book.committed:
            continue
        claim = book.unused.get(claim_key)
        if claim is None:
            return None  # not here yet: the claim's own event completes the unit
        pending.append(claim)
    if not pending and len(unit_nodes(book, pod)) <= 1:
        pod_done(book, key)  # every claim allocated, on one node: nothing left to decide for it
        return None
    for claim in pending:
        book.reserved[claim.key] = [ResourceClaimConsumerReference(resource="pods", name=pod.name, uid=pod.uid)]
    gang = gang_of(pending[0]) if pending else None
    if len(pending) == 1 and gang is not None and gang[1] > 1:
        del book.unused[pending[0].key]
        pod_done(book, key)
        return collect(book, pending[0], *gang, None)
    return AllocatePod(key)


def decide_pod(book: Decisions, step: AllocatePod, evict_at: float | None = None) -> PodPlan:
    """The engine places the Pod's claims not allocated yet together, on one node: the node of
    its claims already allocated (a shared claim), if any. Allocated: `batch` (the engine holds
    the devices until `pod_stored` or `pod_refused`); not: each claim's failure, the Pod waits, and
    with `evict_at` (moves on: the time now) the evictions to ask for it (`evicting.decide`), which
    its failures tell of."""
    pod = book.pods[step.pod]
    keys = [f"{pod.namespace}/{name}" for name in pod.claims]
    pending = [book.unused[k] for k in keys if k not in book.committed]
    plan = PodPlan(step.pod)
    nodes = unit_nodes(book, pod)
    if len(nodes) > 1:
        # The cluster holds a claim of the unit elsewhere (kube-scheduler's write landed first):
        # what dralloc placed for this Pod is given back and placed again next to it.
        plan.given_back = [book.committed[k].claim for k in keys if book.made_for.get(k) == step.pod and k in book.committed]
        for claim in plan.given_back:
            book.engine.release(claim.key)
            book.reserved[claim.key] = list(claim.status.reserved_for) if claim.status else []
        pending += [msgspec.structs.replace(c, status=None) for c in plan.given_back]
        nodes = unit_nodes(book, pod, without={c.key for c in plan.given_back})
    if len(nodes) > 1:
        message = f"Pod {pod.key}: its claims are already allocated on different nodes ({', '.join(sorted(nodes))}); it can never run"
        outcomes = [Outcome(claim=c.key, status="error", message=message) for c in pending]
    else:
        # (what is held for it while its evictions run is its own: a node whole again is not kept from it)
        outcomes = book._as_holder(pod_unit(step.pod), book.engine.allocate, pending, node=next(iter(nodes), None), together=True)
    if all(o.status == "allocated" for o in outcomes):
        plan.batch = [
            ev.AllocationReleased(namespace=c.metadata.namespace or "default", name=c.metadata.name, uid=c.metadata.uid or "", allocation=allocation_of(c))
            for c in plan.given_back
        ]
        plan.batch += [ev.AllocationCommitted(claim=book._decided(c, o), node=o.node) for c, o in zip(pending, outcomes)]
        return plan
    for claim in plan.given_back:  # no better place: they keep what they had
        book.engine.restore(book.committed[claim.key].claim)
    plan.given_back = []
    if evict_at is not None:
        plan.evictions = evicting.decide(book, step.pod, evict_at)
    for claim, outcome in zip(pending, outcomes):  # (the engine commits a unit whole or not at all)
        message = outcome.message if outcome.message.startswith(f"Pod {pod.key}") else f"Pod {pod.key}: {outcome.message}"
        unit = pod_unit(step.pod)
        failure = failure_event(claim, outcome.status, message + book.evictions.note(unit), pod.name, reserved=book.evictions.shown(unit))
        if book.failures.get(failure.key) != failure.msg_id:
            plan.failures.append(failure)
    book.pods_waiting.add(step.pod)
    return plan


def pod_stored(book: Decisions, plan: PodPlan) -> None:
    for claim in plan.given_back:
        if claim.status is not None and claim.status.allocation is not None:
            book.given_back[claim.key] = claim.status.allocation
        book._forget(claim.key)
    for event in plan.batch:
        if isinstance(event, ev.AllocationCommitted):
            book.unused.pop(event.key, None)
            book._record(event)
            book.made_for[event.key] = plan.pod
            book._stop_waiting(event.key)
    pod_done(book, plan.pod)


def pod_refused(book: Decisions, plan: PodPlan) -> None:
    """None of the batch was stored: the engine gives the devices back, what was given back is
    held again (the Pod is tried again)."""
    for event in plan.batch:
        if isinstance(event, ev.AllocationCommitted):
            book.engine.release(event.key)
    for claim in plan.given_back:
        book.engine.restore(book.committed[claim.key].claim)
    book.pods_waiting.add(plan.pod)


def unit_nodes(book: Decisions, pod: ev.PodSubmitted, without: frozenset[str] | set[str] = frozenset()) -> set[str]:
    """The nodes the Pod's committed claims (but `without`) are allocated on (network-attached: none)."""
    nodes = set()
    for name in pod.claims:
        record = book.engine.ledger.claims.get(f"{pod.namespace}/{name}")
        if record is not None and record.node is not None and record.claim not in without and record.claim in book.committed:
            nodes.add(record.node)
    return nodes
