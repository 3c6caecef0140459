"""Moves in the allocator (opt-in: ``DRALLOC_ALLOCATOR_MOVES``): room for a large claim or gang that
waits in vain, made by re-placing the small claims in its way (engine/moves.py). Pure bookkeeping
beside the book of decisions (decisions.py): no bus, no clock of its own.

When: ``when-refused`` tries moves for a large unit (one claim as large as a node, or a complete gang)
from `MOVE_AT` of its wait on, a gang once its wait is over (`moves_from`; the wait is its reservation's,
reservations.py; at once when it may not wait), with the placement's held-node rules off (`configure`);
``early`` as soon as it waits. ``off`` (the default) never moves anything. A move restarts a
user's workload, so only claims that can be moved safely are: committed by this allocator, smaller
than the unit's claims, not in a gang, not reserved for a Pod and never shown by the cluster (in
Kubernetes a reserved claim's allocation cannot change in place: for a waiting Pod, evicting.py
asks for the Pods in its way to be evicted instead, chosen by the same planner).

What is written: one atomic batch (all stored or none, as a gang's): for each moved claim its release
(the old allocation) and its new commit, annotated ``dralloc.dev/moved`` with the claim it made room
for; then the unit's commits. Subscribers and the status store see the moved claim's new devices.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import msgspec

from dralloc.allocator.engine.gang import claim_demand, gang_of, reservation_for
from dralloc.allocator.engine.moves import MovePlan
from dralloc.allocator.reservations import Unit, gang_unit
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim

if TYPE_CHECKING:
    from dralloc.allocator.decisions import Decisions
    from dralloc.allocator.engine import Engine

MODES = ("off", "when-refused", "early")
"""`DRALLOC_ALLOCATOR_MOVES`: never; when a large unit's wait is over; as soon as it waits."""
MOVE_AT = 5 / 6
"""`when-refused` tries moves from this share of a unit's wait on (25 of 30 minutes), not only at its
end, and with moves on that way the placement's held-node rules are off (`configure`): measured over
`dralloc bench placement` seeds 1-5 and 6-10 it refuses fewer small claims for as many or fewer
large ones (README "Levers measured")."""
MOVED = "dralloc.dev/moved"
"""The annotation a moved claim's new commit carries: why it moved, and for which claim."""


@dataclass(slots=True)
class MoveBatch:
    """One unit's moves, to write as one atomic batch (`batch`), all stored or none."""

    unit: str
    plan: MovePlan
    claims: list[ResourceClaim]
    """The unit's claims (placed by the batch)."""
    moved: list[ev.AllocationCommitted] = field(default_factory=list)
    """The moved claims' commits before the move (restored if the batch is refused)."""
    batch: list[ev.AllocationEvent] = field(default_factory=list)


def moves_from(wait: float, gang: bool) -> float:
    """How far into a unit's wait of `wait` (seconds, or any unit alike) `when-refused` begins to try
    moves: a single claim from `MOVE_AT` of it on, a gang only once it is over. A gang's claims in the
    way are spread over several nodes, and often the last of them leaves in the wait's last minutes,
    so an earlier move restarts work for nothing: measured over `dralloc bench placement` seeds 1-5
    and 6-10, fewer small claims refused for about as many large ones (README "Why small claims are
    refused")."""
    return wait if gang else wait * MOVE_AT


def configure(engine: Engine, mode: str) -> None:
    """Set the engine's placement for moves in `mode`: `when-refused` turns the held-node rules off
    (a held node whole again kept from smaller claims, the smaller claim that must take a held node
    taking the least likely to drain): there a long wait ends in a move, so keeping held GPUs idle
    for it costs small claims more than it saves."""
    engine.placement.held_rules = mode != "when-refused"


def due(book: Decisions, mode: str, now: float) -> list[Unit]:
    """The large units that wait (oldest first) for which moves are due in `mode` at `now`."""
    if mode not in MODES[1:]:
        return []
    units: list[Unit] = []
    seen: set[str] = set()
    for key, claim in book.waiting.items():
        if key not in book.messages:
            continue  # not tried yet, or not unsatisfiable
        gang = gang_of(claim)
        if gang is None or gang[1] <= 1:
            unit = Unit(key, (claim,))
        else:
            name, size, domain = gang
            members = book.gangs.get(name, {})
            if name in seen or book.gang_held.get(name) or len(members) < size:
                continue
            seen.add(name)
            unit = Unit(gang_unit(name), tuple(sorted(members.values(), key=lambda c: c.key)), domain)
        until = book.reservations.deadlines.get(unit.key)
        if mode == "when-refused" and until is not None:
            wait = book.reservations.max_wait(unit.claims[0])
            if now < until - wait + moves_from(wait, len(unit.claims) > 1):
                continue  # still waiting for room to come by itself
        if reservation_for(book.engine, unit.claims, domain_label=unit.domain):
            units.append(unit)  # large: it takes whole nodes (a small claim fits in holes)
    return units


def movable(book: Decisions, unit: Unit) -> dict[str, ResourceClaim]:
    """The committed claims a move may re-place for `unit` (see the module docstring), by key."""
    return smaller(
        unit.claims,
        (c.claim for k, c in book.committed.items() if k not in book.seen and k not in book.made_for and c.allocation is not None),
    )


def smaller(unit: Sequence[ResourceClaim], claims: Iterable[ResourceClaim]) -> dict[str, ResourceClaim]:
    """Of `claims`, those a move may re-place for `unit`, by key: smaller than each of its claims, not
    in a gang, not reserved for a Pod (a move there is an eviction: evicting.py), not the unit's own."""
    least = min(claim_demand(c) for c in unit)
    keys = {c.key for c in unit}
    out = {}
    for claim in claims:
        if claim.key in keys or (claim.status is not None and claim.status.reserved_for) or gang_of(claim) is not None:
            continue
        if claim_demand(claim) < least:
            out[claim.key] = claim
    return out


def describe(engine: Engine, unit: Sequence[ResourceClaim], candidates: Iterable[ResourceClaim], domain: str | None = None) -> list[str]:
    """For `dralloc explain` of a large unit that does not fit: the moves the allocator would make for
    it with moves on (the claims of `candidates` it may move, `smaller`), in words; [] for none."""
    if not reservation_for(engine, unit, domain_label=domain):
        return []  # small: the allocator moves nothing for it
    plan = engine.plan_moves(list(unit), smaller(unit, candidates), domain_label=domain)
    if plan is None:
        return []
    moves = "; ".join(f"{m.claim} (node {m.before.node or '-'} -> {m.after.node or '-'})" for m in plan.moves)
    return [
        f"with moves on (DRALLOC_ALLOCATOR_MOVES), near the end of its wait the allocator would move {len(plan.moves)} "
        f"claim(s) ({plan.devices_moved} devices; each restarts) to make room on node(s) {', '.join(plan.target)}: {moves}"
    ]


def decide(book: Decisions, unit: Unit) -> MoveBatch | None:
    """Plan the unit's moves and apply them to the engine (it holds the new allocations until
    `refused`); the batch to write, or None when no plan makes room."""
    engine = book.engine
    plan = book._as_holder(unit.key, engine.plan_moves, list(unit.claims), movable(book, unit), domain_label=unit.domain)
    if plan is None:
        return None
    outcomes = {o.claim: o for o in engine.apply_moves(plan)}
    out = MoveBatch(unit=unit.key, plan=plan, claims=list(unit.claims))
    for move in plan.moves:
        old = book.committed[move.claim]
        out.moved.append(old)
        meta = old.claim.metadata
        out.batch.append(ev.AllocationReleased(namespace=meta.namespace or "default", name=meta.name, uid=meta.uid or "", allocation=old.allocation))
        why = outcomes[move.claim].message
        claim = msgspec.structs.replace(
            old.claim,
            metadata=msgspec.structs.replace(meta, annotations={**meta.annotations, MOVED: why}),
            status=msgspec.structs.replace(old.claim.status, allocation=move.after.allocation) if old.claim.status is not None else None,
        )
        out.batch.append(ev.AllocationCommitted(claim=claim, node=move.after.node))
    for claim in unit.claims:
        outcome = outcomes[claim.key]
        out.batch.append(ev.AllocationCommitted(claim=book._decided(claim, outcome), node=outcome.node))
    return out


def stored(book: Decisions, moves: MoveBatch) -> None:
    """The batch is stored: the moved claims hold their new allocations, the unit is decided."""
    for event in moves.batch:
        if isinstance(event, ev.AllocationCommitted):
            book._record(event)
            book._stop_waiting(event.key)
    gang = gang_of(moves.claims[0])
    if gang is not None and gang[1] > 1:
        book.gangs.pop(gang[0], None)


def refused(book: Decisions, moves: MoveBatch) -> None:
    """Nothing of the batch was stored: the engine goes back to what the stream holds (the unit holds
    nothing, each moved claim its old devices)."""
    engine = book.engine
    for claim in moves.claims:
        engine.release(claim.key)
    for old in moves.moved:
        engine.release(old.key)
        engine.restore(old.claim)
