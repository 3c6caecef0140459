"""The gangs of the book of decisions: a gang member (annotations `dralloc.dev/gang`, `-size`,
`-domain`) waits, with no decision written, until all its members are here (committed ones count);
then the engine places them inside one domain and their decisions are written as one atomic batch
(`GangPlan`), all stored or none."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from dralloc.allocator import evicting
from dralloc.allocator.claims import allocation_of
from dralloc.allocator.engine.gang import allocate_gang
from dralloc.allocator.reservations import gang_unit
from dralloc.allocator.steps import GangComplete, GangPlan, failure_event
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim

if TYPE_CHECKING:
    from dralloc.allocator.decisions import Decisions


def collect(book: Decisions, claim: ResourceClaim, name: str, size: int, domain: str | None, context: Any) -> ev.AllocationFailed | GangComplete | None:
    """A gang member (annotations `dralloc.dev/gang`, `-size`, `-domain`) waits, with no decision
    written, until all `size` members are here (committed ones count)."""
    if size > book.max_gang:
        return book.failure(claim, "error", f"gang {name}: {size} claims; at most {book.max_gang} are committed all or none")
    members = book.gangs.setdefault(name, {})
    members[claim.key] = claim
    book.waiting[claim.key] = claim
    book.contexts.setdefault(claim.key, context)
    if len(members) + len(book.gang_held.get(name, ())) < size:
        return None
    return GangComplete(name, size, domain)


def decide_gang(book: Decisions, complete: GangComplete, evict_at: float | None = None) -> GangPlan:
    """The engine places the members not committed inside one domain, that of the committed ones
    if any (engine/gang.py). A gang that cannot be completed where its committed members are is
    given back and decided again whole, in the same batch. One that does not fit, none of it
    committed, with `evict_at` (moves on: the time now): the evictions to ask for it if it is a
    gang of Pods (`evicting.decide_gang`)."""
    name, domain = complete.name, complete.domain
    members = book.gangs[name]
    held = [book.committed[key].claim for key in book.gang_held.get(name, ())]
    claims = sorted([*members.values(), *held], key=lambda c: c.key)
    outcomes = book._as_holder(gang_unit(name), allocate_gang, book.engine, claims, name=name, domain_label=domain)
    plan = GangPlan(name, members)
    if held and any(o.status != "allocated" for o in outcomes):
        # No room for the rest where the committed members are. A partial gang never keeps
        # devices: they are given back (in the batch) and the gang is decided whole.
        plan.given_back = held
        for member in held:
            book.engine.release(member.key)
            members[member.key] = msgspec.structs.replace(member, status=None)
        claims = sorted(members.values(), key=lambda c: c.key)
        outcomes = book._as_holder(gang_unit(name), allocate_gang, book.engine, claims, name=name, domain_label=domain)
    plan.placed = all(o.status == "allocated" for o in outcomes)
    if not plan.placed and not plan.given_back:
        plan.unplaced = list(zip(claims, outcomes))  # all wait, none holds devices
        for member, outcome in plan.unplaced:
            if outcome.status == "unsatisfiable":
                book.messages[member.key] = outcome.message
        if evict_at is not None:
            plan.evictions = evicting.decide_gang(book, name, claims, domain, evict_at)
        return plan
    plan.batch = [
        ev.AllocationReleased(namespace=m.metadata.namespace or "default", name=m.metadata.name, uid=m.metadata.uid or "", allocation=allocation_of(m))
        for m in plan.given_back
    ]
    for member, outcome in zip(claims, outcomes):
        if not plan.placed:
            plan.batch.append(failure_event(member, outcome.status, outcome.message, book._pod_of(member.key)))
        elif member.key in members:
            plan.batch.append(ev.AllocationCommitted(claim=book._decided(member, outcome), node=outcome.node))
    return plan


def batch_stored(book: Decisions, plan: GangPlan) -> None:
    for member in plan.given_back:
        book._forget(member.key)
        book.waiting[member.key] = plan.members[member.key]
    for event in plan.batch:
        if isinstance(event, ev.AllocationCommitted):
            book._record(event)
            book._stop_waiting(event.key)
        elif isinstance(event, ev.AllocationFailed):
            book.failures[event.key] = event.msg_id
    if plan.placed:
        del book.gangs[plan.name]


def batch_refused(book: Decisions, plan: GangPlan) -> None:
    """None of the batch was stored (or, if the answer was lost, the term is over and the next one
    reads the stream): the engine and the gang go back to what the stream holds."""
    for key in plan.members:
        book.engine.release(key)
    for member in plan.given_back:
        del plan.members[member.key]
        book.engine.restore(book.committed[member.key].claim)
