"""Moves (defragmentation): make room for a large claim or gang by re-placing the few claims in its way.

A large claim (every device of its kind on one node) or a gang can be refused while its family
has enough free devices in total, only scattered: the node (or the domain's nodes) closest to
fitting still holds a claim or two. No placement rule makes those leave sooner (README
"Placement", the diagnosis under `bench placement`); moving them does. A move restarts a user's
workload (in Kubernetes its Pod is evicted and scheduled again), so it is a policy the operator
turns on (the allocator's `DRALLOC_ALLOCATOR_MOVES`, `dralloc bench placement --moves`).

`plan` finds, for a unit that does not fit, the *target*: one node (a gang: nodes of one domain)
whose claims that hold devices the unit could use can ALL be re-placed elsewhere right now, each
with its own spec and constraints and never onto the target, choosing the target that moves the
fewest claims, then the fewest devices, then the lowest node rank. It tries each candidate
target on the engine itself (release the claims in the way, allocate each elsewhere, allocate
the unit on the target) and puts every record back before it answers, so the engine's state is
what it was (`MovePlan` holds the allocations the search found). `apply` commits a plan
atomically: it checks that nothing changed since the plan was made and that no device would be
given twice, then replaces the moved claims' records and adds the unit's, or changes nothing.

Pure: no clock, no I/O; deterministic for a given engine state and `movable` mapping.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from dralloc.allocator.engine.gang import allocate_gang, claim_demand
from dralloc.allocator.engine.inventory import DevKey, iter_bits
from dralloc.allocator.engine.ledger import Record
from dralloc.schemas.resource import ResourceClaim

if TYPE_CHECKING:
    from dralloc.allocator.engine.engine import Engine, Outcome

MAX_TARGETS = 32
"""Tries per plan (a candidate node for a claim; for a gang, a node added to a domain's target or the
gang placed there), cheapest first: each try is a few engine allocations, and a plan is sought only
for a unit that was refused."""


class StalePlan(Exception):
    """The engine changed since the plan was made (or it would give a device twice): nothing applied."""


@dataclass(frozen=True, slots=True)
class Move:
    """One claim re-placed: its record before and after (the ledger's, with the allocation)."""

    claim: str
    before: Record
    after: Record


@dataclass(frozen=True, slots=True)
class MovePlan:
    """What `apply` commits: the moves, then the unit's claims on the target."""

    unit: tuple[str, ...]
    """The claims the moves make room for (one, or a gang's members), by key."""
    target: tuple[str, ...]
    """The node(s) emptied of the moved claims (in rank order)."""
    moves: tuple[Move, ...]
    placed: tuple[Record, ...]
    """The unit's claims as they will be held on the target."""
    stamp: tuple[int, int, int]
    """The engine's state when the plan was made (`_stamp`): `apply` refuses a plan made in another."""

    @property
    def devices_moved(self) -> int:
        """Devices the moved claims held (each re-placed with as many)."""
        return sum(_devices(m.before) for m in self.moves)


def plan(
    engine: Engine,
    claims: Sequence[ResourceClaim],
    movable: Mapping[str, ResourceClaim],
    *,
    domain_label: str | None = None,
    lost: Mapping[str, float] | None = None,
    together: bool = False,
    node: str | None = None,
) -> MovePlan | None:
    """A plan that makes room for `claims` (one claim, or a gang's members, all or none in one
    domain of `domain_label` as for `gang.allocate_gang`; with `together`, a Pod's claims, all on
    one node as `Engine.allocate(together=True)` places them; with `node` (one claim, or `together`),
    on that node only: a Pod tied to it by a claim placed there, which stays) by moving claims of `movable` (key ->
    the claim as allocated: its spec is what a move must satisfy again); claims in the way that are
    not in `movable` are never moved. `lost` (key -> what moving that claim costs, e.g. the GPU
    time it has served, lost when it restarts): among targets that move as many claims, the one
    whose claims cost least (missing keys cost 0); None: the fewest devices moved, as without it.
    None: the unit fits without moves, a member is already allocated, or no target can be emptied.
    The engine's state is left as it was."""
    if not claims or any(c.key in engine.ledger.claims for c in claims):
        return None
    keys = {c.key for c in claims}
    movable = {k: c for k, c in movable.items() if k not in keys}
    if _fits(engine, claims, domain_label, together, node):
        return None
    if len(claims) > 1 and not together:
        return _gang_plan(engine, claims, movable, domain_label, lost)
    for ranks, blockers in _single_targets(engine, claims, movable, lost, node)[:MAX_TARGETS]:
        found = _try(engine, claims, ranks, blockers, movable)
        if found is not None:
            return found
    return None


def apply(engine: Engine, moves: MovePlan) -> list[Outcome]:
    """Commit `moves` atomically: one Outcome per moved claim (its new allocation, the message
    naming the claim it made room for), then one per claim of the unit. Raises StalePlan, changing
    nothing, when the engine changed since the plan was made or a device would be held twice."""
    from dralloc.allocator.engine.engine import Outcome

    ledger = engine.ledger
    if _stamp(engine) != moves.stamp:
        raise StalePlan("the engine changed since the moves were planned")
    if any(ledger.claims.get(m.claim) is not m.before for m in moves.moves) or any(r.claim in ledger.claims for r in moves.placed):
        raise StalePlan("a claim of the plan is not held as it was when the moves were planned")
    for m in moves.moves:
        ledger.remove(m.claim)
    taken: set[DevKey] = set()
    clash = ""
    for record in (*(m.after for m in moves.moves), *moves.placed):
        for entry in record.entries:
            if entry.kind != "exclusive":
                continue
            if entry.device in taken or entry.device in ledger.exclusive:
                clash = clash or "/".join(entry.device)
            taken.add(entry.device)
    if clash:
        for m in moves.moves:
            ledger.add(m.before)
        raise StalePlan(f"device {clash} would be given twice")
    for m in moves.moves:
        ledger.add(m.after)
    for record in moves.placed:
        ledger.add(record)
    target = ", ".join(moves.target)
    unit = f"claim {moves.unit[0]}" if len(moves.unit) == 1 else f"the gang of claims {', '.join(moves.unit)}"
    out = [
        Outcome(
            claim=m.claim,
            status="allocated",
            node=m.after.node,
            allocation=m.after.allocation,
            message=f"moved from node {m.before.node or '-'} to node {m.after.node or '-'} to make room for {unit} (dralloc moves)",
        )
        for m in moves.moves
    ]
    moved = ", ".join(m.claim for m in moves.moves)
    out += [
        Outcome(
            claim=r.claim,
            status="allocated",
            node=r.node,
            allocation=r.allocation,
            message=f"placed on node {r.node or '-'} after moving {len(moves.moves)} claim(s) off node(s) {target}: {moved}",
        )
        for r in moves.placed
    ]
    return out


# --- targets -----------------------------------------------------------------------------------

Target = tuple[int, frozenset[str]]
"""(node ranks to empty, the claims in the way there)."""


def _single_targets(
    engine: Engine, claims: Sequence[ResourceClaim], movable: Mapping[str, ResourceClaim], lost: Mapping[str, float] | None, only: str | None = None
) -> list[Target]:
    """Every node that could hold the claim once the claims in its way leave, all of them movable,
    cheapest first: fewest claims, then (with `lost`) least cost, then fewest devices they hold, then rank.
    `only`: that node alone, its claims in the way the movable ones (what else holds devices there
    stays, e.g. the Pod's own claim placed there: the try finds whether the unit fits beside it)."""
    need = sum(claim_demand(c) for c in claims)
    costed = []
    for node in engine.inventory.node_names if only is None else [only]:
        found = _in_way(engine, claims, node, need)
        if found is None:
            continue
        blockers, wanted = found
        if only is not None:
            blockers = frozenset(b for b in blockers if b in movable)
        if not blockers or any(b not in movable for b in blockers):
            continue
        rank = engine.inventory.node_rank[node]
        costed.append(((len(blockers), _lost(lost, blockers), _held(engine, blockers), rank), (1 << rank, blockers)))
    return [t for _, t in sorted(costed, key=lambda c: c[0])]


def _gang_plan(
    engine: Engine, claims: Sequence[ResourceClaim], movable: Mapping[str, ResourceClaim], domain_label: str | None, lost: Mapping[str, float] | None
) -> MovePlan | None:
    """The cheapest plan over the domains (fewest claims moved, then with `lost` least cost, then
    devices, then the domain's lowest rank): per domain, a target built node by node, cheapest first (as `_single_targets`,
    for one member's share of the demand), taking a node only if the claims in the way of every node
    taken so far can still all be moved off them (a try of the moves alone), until the gang fits."""
    inv = engine.inventory
    if domain_label == "":
        domains = {"all nodes": inv.nodes()}
    else:
        _, domains = engine.placement.topology.domains(domain_label)
    need = sum(claim_demand(c) for c in claims)
    each = max(1, min(claim_demand(c) for c in claims))
    best: tuple[tuple[int, float, int, int], MovePlan] | None = None
    tries = 0
    for nodes in domains.values():
        usable = []
        for node in nodes:
            found = _in_way(engine, claims[:1], node, each)
            if found is None or any(b not in movable for b in found[0]):
                continue
            blockers, wanted = found
            usable.append(((len(blockers), _lost(lost, blockers), _held(engine, blockers), inv.node_rank[node]), node, blockers, wanted))
        usable.sort(key=lambda u: u[0])
        if sum(u[3] for u in usable) < need:
            continue
        ranks, blockers, room = 0, frozenset[str](), 0
        for cost, _node, theirs, wanted in usable:
            if tries >= MAX_TARGETS:
                break
            more = blockers | theirs
            bit = 1 << cost[3]
            if theirs - blockers:
                tries += 1
                if _try(engine, (), ranks | bit, more, movable) is None:
                    continue  # what is in this node's way has nowhere to go (beside the others')
            ranks, blockers, room = ranks | bit, more, room + wanted
            if room < need or not blockers:
                continue
            tries += 1
            found_plan = _try(engine, claims, ranks, blockers, movable)
            if found_plan is not None:
                key = (len(found_plan.moves), _lost(lost, blockers), found_plan.devices_moved, min(iter_bits(ranks)))
                if best is None or key < best[0]:
                    best = (key, found_plan)
                break  # (a member may need a node of its own: otherwise one node more, and try again)
    # the tries after the best one moved the ledger's change count on, not its state: stamp it now
    return replace(best[1], stamp=_stamp(engine)) if best is not None else None


def _in_way(engine: Engine, claims: Sequence[ResourceClaim], node: str, need: int) -> tuple[frozenset[str], int] | None:
    """(the claims holding devices on `node` that the claims' requests match, how many such devices
    the node has) or None when it has fewer than `need` (it could never hold them)."""
    inv, ledger = engine.inventory, engine.ledger
    mask = inv.local.get(node)
    if not mask:
        return None
    wanted = 0
    for claim in claims:
        plan = engine._plan(claim)
        if plan.error:
            return None
        for request in plan.requests:
            for alt in request.alts:
                wanted |= engine.verdicts.get(alt, mask).matched & mask
    if wanted.bit_count() < need:
        return None
    blockers: set[str] = set()
    for i in iter_bits(wanted):
        rec = inv.devices[i]
        if rec is None:
            continue
        holder = ledger.exclusive.get(rec.key)
        if holder is not None:
            blockers.add(holder)
        for holder_share, _ in ledger.shares.get(rec.key, {}).values():
            blockers.add(holder_share)
    return frozenset(blockers), wanted.bit_count()


def _lost(lost: Mapping[str, float] | None, claims: frozenset[str]) -> float:
    """What moving the claims costs by `lost` (0 without it: the order falls to devices held)."""
    return sum(lost.get(k, 0.0) for k in claims) if lost else 0.0


def _held(engine: Engine, claims: frozenset[str]) -> int:
    """Devices the claims hold (a move re-places as many)."""
    return sum(_devices(engine.ledger.claims[k]) for k in claims if k in engine.ledger.claims)


def _devices(record: Record) -> int:
    return sum(1 for e in record.entries if e.kind != "admin")


# --- tries -------------------------------------------------------------------------------------


def _fits(engine: Engine, claims: Sequence[ResourceClaim], domain_label: str | None, together: bool = False, node: str | None = None) -> bool:
    """Whether the unit fits as things are (on `node`, if given: then nothing is worth moving); what it took is given back."""
    kinds = engine.placement.kinds
    keep, kinds.keep = kinds.keep, None
    try:
        if len(claims) == 1 or together:
            outcomes = engine.allocate(claims, together=together, node=node)
        else:
            outcomes = allocate_gang(engine, claims, domain_label=domain_label)
        for outcome in outcomes:
            if outcome.status == "allocated":
                engine.release(outcome.claim)
    finally:
        kinds.keep = keep
    return all(o.status == "allocated" for o in outcomes)


def _try(engine: Engine, claims: Sequence[ResourceClaim], ranks: int, blockers: frozenset[str], movable: Mapping[str, ResourceClaim]) -> MovePlan | None:
    """Release the claims in the way on the target `ranks`, allocate each of them elsewhere (largest
    first), then the unit inside the target (largest first); put every record back as it was; the
    plan when every allocation succeeded, else None."""
    ledger = engine.ledger
    kinds = engine.placement.kinds
    before = {k: ledger.claims[k] for k in sorted(blockers)}
    everywhere = (1 << len(engine.inventory.node_names)) - 1
    elsewhere = everywhere & ~ranks
    moved: dict[str, Record] = {}
    placed: dict[str, Record] = {}
    keep, kinds.keep = kinds.keep, None  # a try is not a placement: keep_whole's clock does not tick
    try:
        for key in before:
            ledger.remove(key)
        for key in sorted(before, key=lambda k: (-claim_demand(movable[k]), k)):
            (outcome,) = engine.allocate([movable[key]], within=elsewhere)
            if outcome.status != "allocated":
                return None
            moved[key] = ledger.claims[key]
        for claim in sorted(claims, key=lambda c: (-claim_demand(c), c.key)):
            (outcome,) = engine.allocate([claim], within=ranks)
            if outcome.status != "allocated":
                return None
            placed[claim.key] = ledger.claims[claim.key]
    finally:
        for key in (*placed, *moved):
            ledger.remove(key)
        for record in before.values():
            ledger.add(record)
        kinds.keep = keep
    names = engine.inventory.node_names
    return MovePlan(
        unit=tuple(c.key for c in claims),
        target=tuple(names[r] for r in iter_bits(ranks)),
        moves=tuple(Move(claim=k, before=before[k], after=moved[k]) for k in before),
        placed=tuple(placed[c.key] for c in claims),
        stamp=_stamp(engine),
    )


def _stamp(engine: Engine) -> tuple[int, int, int]:
    """The engine's state as far as a plan's validity goes: the inventory's version and the ledger's
    count of device changes (both only grow)."""
    ledger = engine.ledger
    return (engine.inventory.version, ledger.touched_base + len(ledger.touched), ledger.remote_changes)
