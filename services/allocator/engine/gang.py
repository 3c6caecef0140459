"""Gangs: the claims of one job (its pods), allocated all-or-nothing inside one topology domain.

A gang is a list of claims, each allocated as its own unit (its own node,
as its pod will run there), all on nodes of one domain: a multi-node NVLink
clique (GB200 NVL72), or the nodes that share a label value (a rack, a
network block). Claims say they belong together with annotations (or labels)
the allocator service collects on:

    dralloc.dev/gang: <name>          # the job
    dralloc.dev/gang-size: "<N>"      # how many claims to wait for
    dralloc.dev/gang-domain: <key>    # optional: a node label key; default the
                                      # NVLink clique, else dralloc.dev/rack;
                                      # "" for any nodes (all-or-nothing only)

The engine's unit allocation does the work: per domain, each claim is
allocated with the candidate nodes confined to the domain
(`Engine.allocate(..., within=...)`), largest first; if one does not fit, the ones placed so far are
released and the next domain is tried. The engine is single-threaded, so
nobody ever sees a partial gang: it is published whole or not at all.

Domains are tried best fit first with scoring on (the fullest domain that has
room, so whole cliques stay free for the next large job), in node-rank order
with scoring off.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from dralloc.allocator.engine.inventory import iter_bits
from dralloc.allocator.engine.placement import nodes_in_words
from dralloc.schemas.gang import GANG, GANG_DOMAIN, GANG_SIZE
from dralloc.schemas.resource import ResourceClaim

if TYPE_CHECKING:
    from dralloc.allocator.engine.engine import Engine, Outcome
    from dralloc.allocator.engine.ledger import Record
    from dralloc.allocator.engine.plan import ClaimPlan


def gang_of(claim: ResourceClaim) -> tuple[str, int, str | None] | None:
    """(gang name, size, domain label) from the claim's annotations or labels; None if not in a gang.

    A size that is not a positive integer counts as 1 (the claim waits for nobody)."""
    meta = claim.metadata
    marks = {**meta.labels, **meta.annotations}
    name = marks.get(GANG)
    if not name:
        return None
    try:
        size = max(1, int(marks.get(GANG_SIZE, "1")))
    except ValueError:
        size = 1
    return f"{meta.namespace or 'default'}/{name}", size, marks.get(GANG_DOMAIN)


def claim_demand(claim: ResourceClaim) -> int:
    """Devices the claim asks for (an `All` request counts 0; `firstAvailable`: its first)."""
    total = 0
    for request in claim.spec.devices.requests:
        if request.exactly is not None:
            if request.exactly.allocation_mode != "All":
                total += request.exactly.count or 1
        elif request.first_available:
            total += request.first_available[0].count or 1
    return total


def allocate_gang(
    engine: Engine,
    claims: Sequence[ResourceClaim],
    *,
    name: str = "",
    domain_label: str | None = None,
    explain: bool = False,
) -> list[Outcome]:
    """Allocate every claim or none, all on nodes of one domain; one Outcome per claim, in order."""
    from dralloc.allocator.engine.engine import Outcome

    gang = name or "gang"
    placement = engine.placement
    inv = engine.inventory
    if domain_label == "":
        domains = {"all nodes": inv.nodes()}
        of = {n: "all nodes" for n in inv.nodes()}
    else:
        of, domains = placement.topology.domains(domain_label)
    kind = "NVLink clique or rack" if domain_label is None else ("cluster" if domain_label == "" else f"{domain_label} domain")
    held = {c.key: engine.ledger.claims[c.key] for c in claims if c.key in engine.ledger.claims}
    pending = [c for c in claims if c.key not in held]
    if not pending:
        return [_already(c.key, held[c.key]) for c in claims]
    fixed = {of.get(r.node or "") for r in held.values()}
    candidates = [d for d in domains if not held or d in fixed]
    need = sum(claim_demand(c) for c in pending)
    free = engine.ledger.free_local
    room = {d: sum(free.get(n, 0) for n in domains[d]) for d in candidates}
    rank = inv.node_rank
    reserved = placement.reserved_nodes

    def holds_reserved(d: str) -> bool:  # a domain with nodes reserved for a waiting claim: tried last
        return any((reserved >> rank[n]) & 1 for n in domains[d]) if reserved else False

    if placement.scoring:
        # best fit: the fullest domain with room; largest claims first (they are the hardest to fit)
        candidates = sorted(
            (d for d in candidates if room[d] >= need),
            key=lambda d: (holds_reserved(d), room[d], rank[domains[d][0]]),
        )
        pending = sorted(pending, key=lambda c: -claim_demand(c))
    else:
        candidates = sorted(
            (d for d in candidates if room[d] >= need),
            key=lambda d: (holds_reserved(d), rank[domains[d][0]]),
        )
    first_failure: str = ""
    for domain in candidates:
        within = sum(1 << rank[n] for n in domains[domain])
        placed: list[Outcome] = []
        failure: Outcome | None = None
        for claim in pending:
            (outcome,) = engine.allocate([claim], explain=explain, within=within)
            if outcome.status != "allocated":
                failure = outcome
                break
            placed.append(outcome)
        if failure is None:
            by_key = {o.claim: o for o in placed}
            message = f"gang {gang}: all {len(claims)} claims in {kind} {domain}"
            out = []
            for c in claims:
                o = by_key.get(c.key)
                if o is None:
                    o = _already(c.key, held[c.key])
                else:
                    o.message = message
                out.append(o)
            return out
        for outcome in placed:  # all or nothing: give back what this domain took
            engine.release(outcome.claim)
        if failure.status == "error":
            return [
                Outcome(
                    claim=c.key,
                    status="error",
                    message=f"gang {gang}: claim {failure.claim}: {failure.message}",
                )
                for c in claims
            ]
        first_failure = first_failure or f"in {domain}, claim {failure.claim}: {failure.message}"
    if not candidates:
        why = f"no {kind} has {need} free devices" if domains else f"no node is in a {kind}"
    else:
        why = f"{len(candidates)} tried; {first_failure}"
    message = f"gang {gang}: cannot place all {len(pending)} pending claims inside one {kind} ({why}); none holds devices"
    if domain_label != "":
        # the way out a person needs when the fleet has no such domains, or none big enough
        message += f'; to allow any nodes, annotate the claims with {GANG_DOMAIN}: "" (dralloc submit --gang-domain "")'
    return [_already(c.key, held[c.key]) if c.key in held else Outcome(claim=c.key, status="unsatisfiable", message=message) for c in claims]


def reservation_for(engine: Engine, claims: Sequence[ResourceClaim], *, domain_label: str | None = None, avoid: int = 0) -> int:
    """The devices to hold for claims that wait (a bitset for `Engine.reserve`; 0: nowhere): one
    claim's closest node, or, for the members of a gang (more than one claim), the freest nodes
    of the domain closest to holding them all (see `Placement.closest`); `domain_label` as for
    `allocate_gang`. The nodes of the `avoid` ranks are held for earlier claims already. A
    single claim smaller than a node gets nothing (0)."""
    placement = engine.placement
    plans = [engine._plan(claims[0])] if claims else []
    if len(claims) <= 1:
        # only a large claim holds a node for itself: one that takes every device of its kind
        # there (a small one fits in the holes of partly used nodes, which reserving would waste)
        bits = placement.closest(plans, avoid=avoid)
        return bits if bits and claim_demand(claims[0]) >= bits.bit_count() else 0
    if domain_label == "":
        domains = {"all nodes": engine.inventory.nodes()}
    else:
        _, domains = placement.topology.domains(domain_label)
    return placement.closest(plans, len(claims), domains, avoid)


def describe_held_whole(engine: Engine, plans: list[ClaimPlan]) -> list[str]:
    """The nodes held for a claim or gang that waits, whole again, that the unit may not take
    (`Placement.held_whole`: it is smaller than they are), in words for `dralloc explain`; [] for none."""
    held = engine.placement.held_whole(plans)
    if not held:
        return []
    return [
        f"held whole for a claim that waits: {nodes_in_words([engine.inventory.node_names[r] for r in iter_bits(held)])} (every "
        "device free, reserved for a large claim or gang waiting for room; a smaller claim does not break it, and waits)"
    ]


def _already(key: str, record: Record) -> Outcome:
    """The outcome of a member the ledger already holds (committed earlier)."""
    from dralloc.allocator.engine.engine import Outcome

    return Outcome(claim=key, status="allocated", node=record.node, allocation=record.allocation, message="already allocated")
