"""Moves in a cluster: a large Pod that waits gets room by evicting the Pods whose claims are in its
way. Pure bookkeeping beside the book of decisions (decisions.py): no bus, no clock of its own.

A claim reserved for a Pod cannot be re-placed in place (its allocation may not change while it is
reserved; the Pod would run on devices it was not given). So where moves.py re-commits a claim
from files or `submit`, for a Pod's unit the allocator asks the cluster to evict the Pods using
the claims in its way: it chooses those claims with the same planner (`Engine.plan_moves`, the
fewest claims, each of which could be placed elsewhere right now, so their Pods' new copies have
room), and instead of committing new devices for them it writes one `EvictionRequested` per claim
(its Pods, from ``reservedFor``; the Pod it makes room for; the node). The waiting Pod keeps
waiting, the devices it would get there held for it meanwhile as a reservation is
(`Reservations.evicting`: other claims take them last): the status writer evicts through the Eviction API (statuswriter/evictions.py), the
cluster deallocates or deletes the evicted Pods' claims, the ingestor reports it, the allocator
releases them and tries the waiting Pod again; their controllers' new Pods are placed as any other.

While a unit's eviction is in flight (`InFlight`: some of its claims still held, for at most
`EVICTION_PATIENCE`) nothing more is evicted for it, and its failure message says what was asked
and what is held for it until when (`Evictions.note`, `Evictions.shown`: the failure's
``reservedNodes``/``reservedUntil`` as a reservation's, so `dralloc get claims` shows it; the
held devices count in the ``dralloc.devices.reserved`` gauge), as do Events on the Pods (evicted,
or the waiting one when a PodDisruptionBudget refused). The requests carry when they were asked
(``askedAt``) and the devices held, shared out among them (`EvictionRequested.held`, each device
once: a large gang's batch stays small): a new leader reads them back from ALLOCATIONS and holds
their devices again until the same end (`Evictions.replayed`).

A refusal (a PodDisruptionBudget, or a Pod ``kubectl drain`` would not evict) comes back from the
status writer as an `EvictionRefused` (`Evictions.refusal`): the hold ends at once, the waiting
Pod's failure says who refused and why and when it asks again, and it asks again only after a
backoff (`REFUSED_BACKOFF`, doubled with each refusal in a row, at most `EVICTION_PATIENCE`),
planning around the claims refused for a patience (another node, if one can be emptied). The Pod
waits meanwhile as any Pod that does not fit (tried again whenever room changes); a refusal never
heard (the status writer down) ends with the patience. A refusal carries when it was refused
(``refusedAt``: the backoff counts from then) and stays in CLAIMS for `bus.REFUSAL_TTL_S`: a new
leader replays those still there after the requests (`Evictions.replayed`), and each request carries
the refusals in a row heard before it (``refusedBefore``), so both leaders double the backoff as often.
A row lapses `REFUSALS_LAPSE` after the unit's last asking (the TTL: once its refusals expired a new
leader could not count them, so neither does the leader; the backoff starts again from 60 s).

Only a Pod whose claims still to place are none a gang member, and large (one claim, or several
together on one node, take a whole node: `served`; the devices of its claims placed already count, of the
node's kind only) is served, and
only claims reserved for Pods, not in a gang, smaller than it, and not already being evicted for
another unit are evicted. A complete gang of Pods (each member a Pod's claim, none placed) that
takes whole nodes is served the same way (`decide_gang`: the planner places its members inside
one domain; claims smaller than each member are evicted), its requests naming the gang
(`EvictionRequested.gang`), its first member's Pod and every member's (``gangPods``: each is
told of a refusal); what is in flight is kept by unit
(``pod:<ns>/<name>``, ``gang:<ns>/<gang>``, or a claim's own key, `unit_of`), and the hold is the unit's.

A large unit of claims of their own (from files or `submit`, reserved for no Pod: a claim or a
gang of them) blocked by Pods' claims is served too, when its moves are due (moving.py `due`) and
no move in place makes room (`decide_unit`): evicting those Pods is what Kubernetes allows (their
budgets are honoured). No Pod waits: the requests name the claim (``forClaim``), its failure tells
of them, and a refusal is told to the allocator only.

A Pod with a claim placed already (shared with another Pod, or a gang member's) is tied to that
claim's node: the room is made there (`Engine.plan_moves(node=...)`: that node only, the placed
claims staying), the Pods in the way smaller than its claims together.
"""

from __future__ import annotations

import datetime
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from dralloc.allocator.engine.gang import claim_demand, gang_of, reservation_for
from dralloc.allocator.engine.inventory import iter_bits
from dralloc.allocator.engine.moves import MovePlan
from dralloc.allocator.reservations import Unit, gang_unit, pod_unit, unit_parts
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim, ResourceClaimConsumerReference
from dralloc.schemas.validation import name_error

if TYPE_CHECKING:
    from dralloc.allocator.decisions import Decisions
    from dralloc.allocator.engine import Engine

EVICTION_PATIENCE = 300.0
"""Seconds an eviction stays in flight (nothing more evicted for its Pod) while its claims are held:
then it may be asked again (a PodDisruptionBudget may allow it by then), never in a hot loop."""

REFUSALS_LAPSE = 2 * EVICTION_PATIENCE
"""Seconds after a unit's last asking that its row of refusals lapses (the next refusal backs off
`REFUSED_BACKOFF` again): as long as a refusal stays in CLAIMS (`bus.REFUSAL_TTL_S`), so a leader
that takes over counts the same row as its predecessor, which cannot read back a refusal expired."""

REFUSED_BACKOFF = 60.0
"""Seconds after a refusal is heard before the Pod's evictions may be asked again (doubled with each
refusal in a row for the Pod, at most `EVICTION_PATIENCE`): a budget refuses until a Pod it counts
is ready again, which takes a while."""


@dataclass(slots=True)
class InFlight:
    """What was asked for one waiting Pod."""

    claims: dict[str, str]
    """Claim key -> uid of each claim whose Pods are being evicted."""
    node: str
    since: float
    note: str
    devices: int = 0
    """The devices the planner would give the Pod there (a bitset of engine ids), held for it meanwhile."""
    asked_at: float = 0.0
    """The requests' ``askedAt`` (a refusal names the asking it answers)."""
    retry_at: float = 0.0
    """Once a refusal is heard: when it may be asked again (0: at the end of the patience)."""
    refused: list[str] = field(default_factory=list)
    """What was refused (for the failure message)."""

    @property
    def until(self) -> float:
        """When the patience is over (the hold ends then at the latest)."""
        return self.since + EVICTION_PATIENCE

    @property
    def over(self) -> float:
        """When it stops being in flight (its Pod's evictions may be asked again)."""
        return self.retry_at or self.until


@dataclass(slots=True)
class Evictions:
    """Evictions in flight, by the unit they make room for (`unit_of`: ``pod:<ns>/<name>`` for a Pod,
    ``gang:<ns>/<gang>`` for a gang of Pods)."""

    inflight: dict[str, InFlight] = field(default_factory=dict)
    refusals: dict[str, int] = field(default_factory=dict)
    """Unit key -> refusals heard in a row for it (the backoff doubles with each)."""
    lapses: dict[str, float] = field(default_factory=dict)
    """Unit key -> when its row of `refusals` lapses: its last asking + `REFUSALS_LAPSE`."""
    refused_claims: dict[str, float] = field(default_factory=dict)
    """Claim key -> until when it is not asked to go again (a refusal heard): planned around."""

    def note(self, unit: str) -> str:
        """What the waiting unit's failure messages add while its eviction is in flight ("" when none)."""
        found = self.inflight.get(unit)
        return found.note if found is not None else ""

    def shown(self, unit: str) -> tuple[tuple[str, ...], float]:
        """(nodes held, until when) for the failure events of the waiting unit's claims, as a
        reservation's are shown (`Reservations.shown`); ((), 0.0) when nothing is held for it."""
        found = self.inflight.get(unit)
        if found is None or not found.devices:
            return (), 0.0
        return tuple(found.node.split(", ")), found.until

    def busy(self) -> set[str]:
        """Keys of the claims being evicted for some Pod, or refused lately (`refused_claims`)."""
        return {key for found in self.inflight.values() for key in found.claims} | self.refused_claims.keys()

    def settle(self, book: Decisions, now: float) -> None:
        """Forget what is over: the Pod (the gang) placed or gone, its claims all released, or the
        patience (the backoff, after a refusal) spent; a row of refusals once it lapses."""
        for unit, found in list(self.inflight.items()):
            held = any((c := book.committed.get(k)) is not None and c.uid == uid for k, uid in found.claims.items())
            waits = _waits(book, unit)
            if not waits or not held or now >= found.over:
                del self.inflight[unit]
                self._hold(book, unit, 0)
                if not waits or not held:
                    self.refusals.pop(unit, None)  # placed, gone, or its evictions done: a new start
        for key, until in list(self.refused_claims.items()):
            if now >= until or key not in book.committed:
                del self.refused_claims[key]
        for unit, until in list(self.lapses.items()):
            if now >= until:  # (its refusals expired from CLAIMS: a new leader could not count them)
                del self.lapses[unit]
                self.refusals.pop(unit, None)

    def refusal(self, book: Decisions, refused: ev.EvictionRefused, now: float) -> bool:
        """The status writer could not evict a Pod asked for (`EvictionRefused`); returns whether it is
        news (it answers the Pod's eviction in flight: the same asking, the same claim). Then what was
        held for the Pod is let go at once (other claims may take it), its failure message says who
        refused and why, it is asked again only after a backoff, and the claim refused is planned
        around for a patience. A refusal of anything else (an older asking, a Pod since placed, a
        forged one) changes nothing."""
        unit = unit_of(refused)
        found = self.inflight.get(unit)
        if found is None or found.claims.get(refused.key) is None or refused.asked_at != found.asked_at:
            return False
        if refused.uid and found.claims[refused.key] != refused.uid:
            return False
        what = f"Pod {refused.namespace}/{refused.pod} (claim {refused.key})"
        if any(line.startswith(what) for line in found.refused):
            return False  # (the same Pod's refusal told again)
        if found.asked_at <= refused.refused_at <= now:
            now = refused.refused_at  # (when it was refused: the same backoff for a leader that replays it)
        if not found.refused:  # the first refusal of this asking: the backoff begins
            self._back_off(unit, found, now)
        words = " ".join(refused.message.split())[:300]  # (one line, bounded: it goes into an Event)
        found.refused.append(f"{what}: {words or 'refused'}")
        self.refused_claims[refused.key] = now + EVICTION_PATIENCE
        found.devices = 0
        self._hold(book, unit, 0)
        found.note = (
            f"; with moves on, dralloc asked to evict Pods to make room on node {found.node}, and the cluster refused: "
            f"{'; '.join(found.refused)}; nothing is held for it now, and it asks again after {_clock(found.retry_at)} (around the claims refused)"
        )
        return True

    def _hold(self, book: Decisions, unit: str, devices: int) -> None:
        """Hold `devices` for `unit` (0: nothing) as reservations are held: other claims take them last."""
        if devices:
            book.reservations.evicting[unit] = devices
        elif book.reservations.evicting.pop(unit, None) is None:
            return
        book.engine.reserve(book.reservations.others(""))

    def replayed(self, book: Decisions, requests: Iterable[ev.EvictionRequested], now: float, refusals: Iterable[ev.EvictionRefused] = ()) -> None:
        """After a takeover: the evictions an earlier term asked for (ALLOCATIONS' ``.evict`` subjects,
        the last per claim), in flight again as they were asked, so a Pod's evictions are not asked
        for again before the patience is over (`settle` drops those whose claims are gone or whose
        patience is spent), and the devices they held (`EvictionRequested.held`, those the inventory
        still has) held again. Only the requests of the Pod's last asking count (an older asking's
        request for a claim not asked for again is over). A request without ``askedAt`` (an older
        version's), or one dated after `now`, counts from `now`: never held longer than a patience.
        Refusals in a row go on from the last asking's count (``refusedBefore``), lapsing as the
        earlier term's do (`REFUSALS_LAPSE` after that asking). Then the `refusals` CLAIMS still holds
        (they expire after `bus.REFUSAL_TTL_S`, no sooner than the row lapses) are heard again
        (`refusal`, from when each was refused): what a refused asking held stays let go, and it is
        asked again after the same backoff as the earlier term's (doubled as many times)."""
        by_unit: dict[str, list[ev.EvictionRequested]] = {}
        for request in requests:
            by_unit.setdefault(unit_of(request), []).append(request)
        inv = book.engine.inventory
        for unit, asked in by_unit.items():
            since = max(r.asked_at for r in asked)
            asked = [r for r in asked if r.asked_at == since]
            since = min(since, now) if since > 0 else now
            devices = 0
            for request in asked:
                for held in request.held:
                    if (rec := inv.by_key.get((held.driver, held.pool, held.device))) is not None:
                        devices |= 1 << rec.id
            node = asked[-1].node
            if before := max(r.refused_before for r in asked):  # (refusals in a row the earlier term had heard)
                self.refusals[unit] = max(self.refusals.get(unit, 0), before)
            self.lapses[unit] = since + REFUSALS_LAPSE
            note = note_for(asked, node, since + EVICTION_PATIENCE if devices else 0.0)
            self.inflight[unit] = InFlight({r.key: r.uid for r in asked}, node, since, note, devices, asked[-1].asked_at)
            self._hold(book, unit, devices)
        for refused in refusals:
            self.refusal(book, refused, now)

    def refused(self, book: Decisions, unit: str) -> None:
        """The requests were not stored: nothing is in flight for the unit, nothing held for it."""
        self.inflight.pop(unit, None)
        self._hold(book, unit, 0)

    def unsendable(self, book: Decisions, unit: str, reason: str, now: float) -> None:
        """The bus can never store the unit's requests (`PublishRefused`: more than an atomic batch
        holds, or a message over the server's limit): taken as a refusal of the whole asking, what
        was held is let go at once and it is asked again only after the backoff (the claims in its
        way planned around meanwhile), so neither a retry in a hot loop nor a term ended by a write
        that would be refused again after the rebuild."""
        found = self.inflight.get(unit)
        if found is None:
            return
        self._back_off(unit, found, now)
        found.devices = 0
        self._hold(book, unit, 0)
        found.note = (
            f"; with moves on, dralloc planned to evict Pods to make room on node {found.node}, but could not ask: "
            f"{reason[:300]}; nothing is held for it now, and it tries again after {_clock(found.retry_at)}"
        )

    def _back_off(self, unit: str, found: InFlight, now: float) -> None:
        """One more refusal of `unit` in a row: it is asked again only `backoff(count)` after `now`."""
        count = self.refusals[unit] = self.refusals.get(unit, 0) + 1
        found.retry_at = now + backoff(count)


def backoff(count: int) -> float:
    """Seconds before a unit refused `count` times in a row is asked for again: `REFUSED_BACKOFF` doubled
    with each refusal after the first, at most `EVICTION_PATIENCE` (any count: no float overflow)."""
    return min(EVICTION_PATIENCE, REFUSED_BACKOFF * 2 ** min(max(count, 1) - 1, 32))


def unit_of(event: ev.EvictionRequested | ev.EvictionRefused) -> str:
    """The unit an eviction's request (or its refusal) makes room for: its gang's
    (`reservations.gang_unit`), its Pod's (`reservations.pod_unit`), or its claim's (``<ns>/<claim>``)."""
    if event.gang:
        return gang_unit(f"{event.for_namespace}/{event.gang}")
    if event.for_claim:
        return f"{event.for_namespace}/{event.for_claim}"
    return pod_unit(f"{event.for_namespace}/{event.for_pod}")


def _waits(book: Decisions, unit: str) -> bool:
    """Whether the unit still waits to be placed (a Pod not placed, deleted or ungated; a gang not
    placed, with members still here; a claim of its own not placed or deleted)."""
    kind, key = unit_parts(unit)
    if kind == "pod":
        return key in book.pods
    if kind == "gang":
        return bool(book.gangs.get(key))
    return key in book.waiting


HELD_WORDS = "; an eviction hold:"
"""How a failure message tells of the devices held for a Pod while its evictions run (`note_for`)."""


def note_for(requests: Sequence[ev.EvictionRequested], node: str, held_until: float = 0.0) -> str:
    """What a waiting Pod's failure message adds while `requests` are in flight for it; `held_until`:
    when the devices held for it meanwhile are let go at the latest (0: none held)."""
    names = ", ".join(f"{r.namespace}/{p.name}" for r in requests for p in r.pods)
    told = ": see this Pod's Events" if requests and requests[0].for_pod else ""  # (a claim of its own has no Events)
    note = (
        f"; with moves on, dralloc asked to evict Pod(s) {names} (claim(s) {', '.join(r.key for r in requests)}) "
        f"to make room on node {node}; it waits for them to go (a PodDisruptionBudget may refuse{told})"
    )
    if held_until:
        note += f"{HELD_WORDS} node {node} held for it while they go (other claims take its devices last) until {_clock(held_until)}"
    return note


def _clock(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def pod_consumers(claim: ResourceClaim) -> list[ResourceClaimConsumerReference] | None:
    """The Pods a claim is reserved for; None when it is reserved for nothing, or for anything but Pods."""
    refs = claim.status.reserved_for if claim.status is not None else []
    if not refs or any(r.resource != "pods" or r.api_group for r in refs):
        return None
    return list(refs)


def evictable(unit: Sequence[ResourceClaim], claims: Iterable[ResourceClaim], *, gang: bool = False) -> dict[str, ResourceClaim]:
    """Of `claims` (allocated), those whose Pods may be evicted for the Pod whose claims to place are
    `unit`, by key: reserved only for Pods, not in a gang, smaller than the unit (its claims'
    devices together; for a `gang`'s members, each placed on its own node: than each), not its own."""
    least = min(claim_demand(c) for c in unit) if gang else sum(claim_demand(c) for c in unit)
    own = {c.key for c in unit}
    out = {}
    for claim in claims:
        if claim.key not in own and gang_of(claim) is None and pod_consumers(claim) is not None and claim_demand(claim) < least:
            out[claim.key] = claim
    return out


def movable(book: Decisions, unit: Sequence[ResourceClaim], busy: set[str], *, gang: bool = False) -> dict[str, ResourceClaim]:
    """The committed claims whose Pods may be evicted for `unit` (`evictable`), but those being
    evicted for another unit (`busy`), by key."""
    return evictable(unit, (c.claim for k, c in book.committed.items() if k not in busy and c.allocation is not None), gang=gang)


def served(engine: Engine, claims: Sequence[ResourceClaim], placed: Sequence[ResourceClaim] = ()) -> bool:
    """Whether a Pod whose claims still to place are `claims` is one evictions serve: none a gang
    member, and large: it takes a whole node (one claim: `gang.reservation_for`; several, placed
    together on one node, or beside its claims `placed` already (shared, or a gang member's: their
    devices of the kind the node closest to fitting the largest still to place offers count, a NIC
    beside GPUs does not): their devices together at least as many as that node has of its kind).
    A small unit fits in holes as they come."""
    if not claims or any((gang := gang_of(c)) is not None and gang[1] > 1 for c in claims):
        return False
    if len(claims) == 1 and not placed:
        return bool(reservation_for(engine, list(claims)))
    largest = max(claims, key=claim_demand)
    node = engine.placement.closest([engine._plan(largest)])  # (what reservation_for asks for one claim)
    if not node:
        return False
    inv = engine.inventory
    kinds = {rec.kind for i in iter_bits(node) if (rec := inv.devices[i]) is not None}
    records = [r for c in placed if (r := engine.ledger.claims.get(c.key)) is not None]
    held = sum(1 for r in records for e in r.entries if (rec := inv.by_key.get(e.device)) is not None and rec.kind in kinds)
    return sum(claim_demand(c) for c in claims) + held >= node.bit_count()


def describe(
    engine: Engine, unit: Sequence[ResourceClaim], candidates: Iterable[ResourceClaim], placed: Sequence[ResourceClaim] = (), node: str | None = None
) -> list[str]:
    """For `dralloc explain` of a Pod that does not fit (its claims still to place: `unit`; those placed
    already: `placed`, on `node`, which ties it there): the evictions the allocator would ask for with
    moves on (`decide`), among the allocated `candidates`; [] for none."""
    if not served(engine, unit, placed):
        return []
    candidates = list(candidates)
    plan = engine.plan_moves(list(unit), evictable([*unit, *placed], candidates), together=True, node=node)
    return _described(plan, candidates)


def describe_gang(engine: Engine, gang: str, claims: Sequence[ResourceClaim], candidates: Iterable[ResourceClaim], domain: str | None) -> list[str]:
    """For `dralloc explain` of a complete gang of Pods (`gang`: ``<ns>/<name>``; `claims`: its members,
    none placed) that does not fit: the evictions the allocator would ask for it with moves on
    (`decide_gang`), among the allocated `candidates`; [] for none."""
    if not claims or name_error(gang.split("/", 1)[-1]) is not None or not reservation_for(engine, claims, domain_label=domain):
        return []
    candidates = list(candidates)
    plan = engine.plan_moves(list(claims), evictable(claims, candidates, gang=True), domain_label=domain)
    return _described(plan, candidates, whom=f" for gang {gang}")


def describe_unit(engine: Engine, claims: Sequence[ResourceClaim], candidates: Iterable[ResourceClaim], domain: str | None) -> list[str]:
    """For `dralloc explain` of a large unit of claims of their own (a claim, or a gang of them) that
    does not fit and that no move in place makes room for: the evictions of the Pods in its way the
    allocator would ask for once its moves are due (`decide_unit`), among the allocated `candidates`;
    [] for none."""
    if not claims or not reservation_for(engine, claims, domain_label=domain):
        return []
    candidates = list(candidates)
    movable_claims = evictable(claims, candidates, gang=len(claims) > 1)
    if not movable_claims:
        return []
    return _described(engine.plan_moves(list(claims), movable_claims, domain_label=domain), candidates, when="once its moves are due, ")


def _described(plan: MovePlan | None, candidates: Sequence[ResourceClaim], *, whom: str = "", when: str = "") -> list[str]:
    """`plan`'s evictions in words for `dralloc explain` (the claims it moves among `candidates`; the room
    made `whom`, e.g. " for gang ml/job"; asked `when`); [] for no plan."""
    if plan is None:
        return []
    by_key = {c.key: c for c in candidates}
    pods = [f"{(c.metadata.namespace or 'default')}/{p.name}" for m in plan.moves for c in [by_key[m.claim]] for p in pod_consumers(c) or []]
    return [
        f"with moves on (DRALLOC_ALLOCATOR_MOVES), {when}the allocator would ask to evict Pod(s) {', '.join(pods)} "
        f"(claim(s) {', '.join(m.claim for m in plan.moves)}; each restarts elsewhere) to make room{whom} on node {', '.join(plan.target)}; "
        "a PodDisruptionBudget may refuse"
    ]


def decide(book: Decisions, pod_key: str, now: float) -> list[ev.EvictionRequested]:
    """For a Pod whose unit did not fit: the evictions to ask for, at time `now` ([] for none: not
    served, one in flight already, or no plan makes room). The book records them as in flight;
    `Evictions.refused` if they are not stored. Engine work (a plan), changing nothing in the engine."""
    evictions = book.evictions
    evictions.settle(book, now)
    pod = book.pods.get(pod_key)
    if pod is None or pod_unit(pod_key) in evictions.inflight:
        return []
    keys = [f"{pod.namespace}/{name}" for name in pod.claims]
    placed = [book.committed[k].claim for k in keys if k in book.committed]
    if any(k not in book.committed and k not in book.unused for k in keys):
        return []  # (a claim not here: the Pod is not decided)
    claims = [book.unused[k] for k in keys if k not in book.committed]
    records = [r for c in placed if (r := book.engine.ledger.claims.get(c.key)) is not None]
    nodes = {r.node for r in records if r.node is not None}
    if len(nodes) > 1 or not served(book.engine, claims, placed):
        return []  # (on two nodes already: it can never run)
    node = next(iter(nodes), None)  # (its claims placed on a node tie it there: the room is made there, around them)
    plan = book.engine.plan_moves(claims, movable(book, [*claims, *placed], evictions.busy()), together=True, node=node)
    if plan is None:
        return []
    return _ask(book, pod_unit(pod_key), plan, pod.namespace, now, pod=pod.name)


def decide_gang(book: Decisions, gang: str, claims: Sequence[ResourceClaim], domain: str | None, now: float) -> list[ev.EvictionRequested]:
    """For a complete gang of Pods (`gang`: ``<ns>/<name>``; `claims`: its members, none placed) that
    did not fit: the evictions to ask for, at time `now`, as `decide` asks for a Pod's. Served: every
    member reserved for a Pod (a gang of claims from files or `submit` is moves.py's), the gang large
    (it takes whole nodes, `gang.reservation_for`, as moves.py's gangs), its name a name an event may
    carry. Evicted: claims reserved for Pods, not in a gang, smaller than each member
    (`evictable(gang=True)`), the plan the moves planner's for a gang (its members inside one domain).
    The requests name the first member's Pod as the one room is made for, the gang
    (`EvictionRequested.gang`) and every member's Pod (``gangPods``: each one's Events tell of refusals)."""
    evictions = book.evictions
    evictions.settle(book, now)
    unit = gang_unit(gang)
    namespace, name = gang.split("/", 1)
    pods = [book.reserved.get(c.key) for c in claims]
    if not claims or unit in evictions.inflight or book.gang_held.get(gang) or name_error(name) is not None:
        return []
    if not all(refs and refs[0].resource == "pods" for refs in pods):
        return []  # not a gang of Pods
    if not reservation_for(book.engine, claims, domain_label=domain):
        return []  # small: its members fit in holes as they come
    plan = book.engine.plan_moves(claims, movable(book, claims, evictions.busy(), gang=True), domain_label=domain)
    if plan is None:
        return []
    members = [refs[0].name for refs in pods]  # type: ignore[index]  # (all checked above)
    return _ask(book, unit, plan, namespace, now, pod=members[0], gang=name, gang_pods=members)


def decide_unit(book: Decisions, unit: Unit, now: float) -> list[ev.EvictionRequested]:
    """For a large unit of claims of their own (from files or `submit`: a claim, or a gang of them) whose
    moves are due (moving.py `due`) and that no move in place makes room for (`moving.decide` found no
    plan): the evictions of the Pods in its way to ask for, at time `now`, as `decide` asks for a Pod's
    (claims reserved for Pods, not in a gang, smaller than each of its claims). Kubernetes allows it (an
    eviction honours the Pods' budgets); no Pod waits, so the requests name the claim (``forClaim``:
    the first one, and the gang) and the refusals are told only to the allocator. [] for none: a unit
    with a Pod's claim (`decide`, `decide_gang` serve those), one in flight already, or no plan."""
    evictions = book.evictions
    evictions.settle(book, now)
    claims = list(unit.claims)
    if not claims or unit.key in evictions.inflight or any(book.reserved.get(c.key) for c in claims):
        return []
    gang = gang_of(claims[0])
    name = gang[0].split("/", 1)[1] if gang is not None and gang[1] > 1 else ""
    if name and name_error(name) is not None:
        return []  # (a gang name no event may carry)
    movable_claims = movable(book, claims, evictions.busy(), gang=len(claims) > 1)
    if not movable_claims:
        return []  # (no Pod's claim to evict, e.g. no Pods at all: moves.py's plan stands alone, not planned twice)
    plan = book._as_holder(unit.key, book.engine.plan_moves, claims, movable_claims, domain_label=unit.domain)
    if plan is None:
        return []
    first = claims[0].metadata
    return _ask(book, unit.key, plan, first.namespace or "default", now, claim=first.name, gang=name)


def _ask(
    book: Decisions,
    unit: str,
    plan: MovePlan,
    namespace: str,
    now: float,
    *,
    pod: str = "",
    claim: str = "",
    gang: str = "",
    gang_pods: Sequence[str] = (),
) -> list[ev.EvictionRequested]:
    """The requests that carry out `plan` for `unit` (made for the Pod `namespace`/`pod`, or the claim
    `namespace`/`claim`; of `gang` if any, `gang_pods` its members' Pods, each told of a refusal),
    recorded as in flight, the devices the plan gives the unit held for it meanwhile. The requests
    share those devices out (``held``: about an equal part each, all of them together): a large
    gang's hundreds of requests each carrying its thousands of devices made a batch of tens of MB,
    each message a few hundred KB, nearing the bus's 1 MB limit on one message."""
    node = ", ".join(plan.target)
    inv = book.engine.inventory
    devices = 0
    held = []
    for record in plan.placed:
        for entry in record.entries:
            if (rec := inv.by_key.get(entry.device)) is not None:
                devices |= 1 << rec.id
                held.append(ev.HeldDevice(driver=rec.key[0], pool=rec.key[1], device=rec.key[2]))
    waiting = f"Pod {namespace}/{pod}" if pod else f"claim {namespace}/{claim}"
    waiting = f"gang {namespace}/{gang} ({waiting})" if gang else waiting
    share = -(-len(held) // max(1, len(plan.moves)))  # (each request carries a share: the batch holds each device once)
    requests = []
    for i, move in enumerate(plan.moves):
        moved = book.committed[move.claim].claim
        meta = moved.metadata
        requests.append(
            ev.EvictionRequested(
                namespace=meta.namespace or "default",
                name=meta.name,
                uid=meta.uid or "",
                pods=pod_consumers(moved) or [],
                for_namespace=namespace,
                for_pod=pod,
                node=node,
                message=f"{waiting} waits for room on node {node}: dralloc moves (DRALLOC_ALLOCATOR_MOVES)",
                held=held[i * share : (i + 1) * share],
                asked_at=now,
                gang=gang,
                for_claim=claim,
                gang_pods=list(gang_pods),
                refused_before=min(book.evictions.refusals.get(unit, 0), ev.EVICTION_REFUSALS_MAX),
            )
        )
    note = note_for(requests, node, now + EVICTION_PATIENCE if devices else 0.0)
    book.evictions.lapses[unit] = now + REFUSALS_LAPSE
    book.evictions.inflight[unit] = InFlight({r.key: r.uid for r in requests}, node, now, note, devices, now)
    book.evictions._hold(book, unit, devices)
    return requests
