"""Reservations for what waits: pure bookkeeping beside the book of decisions (no bus, no clock).

A large claim (one that takes every device of its kind on a node) or a complete gang that does
not fit now waits, as every claim that does not fit does; for up to its maximum wait it also
holds the node (a gang: the nodes of one domain) closest to fitting it, so that what leaves
there is not taken by small claims: the engine tries nodes holding reserved devices last
(`Engine.reserve`), so other claims take them only when nothing else fits. Waiting units are
served oldest first: each holds what is closest to fitting it apart from what older ones hold.

The maximum wait is the claim's annotation (or label) ``dralloc.dev/max-wait`` ("600", "600s",
"10m", "1h30m"; "0" for none), else the allocator's default (``DRALLOC_ALLOCATOR_MAX_WAIT``).
A reservation ends when its unit is placed, deleted, or its wait is over (the claim still waits,
holding nothing). It lives in the streams: the AllocationFailed written for each waiting claim
carries the nodes held and when the wait ends (`reservedNodes`, `reservedUntil`), so a new
leader resumes the same waits after a takeover (the nodes are chosen again from the same state).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.gang import describe_held_whole, reservation_for
from dralloc.allocator.engine.inventory import iter_bits
from dralloc.schemas.resource import ResourceClaim

MAX_WAIT = "dralloc.dev/max-wait"
_DURATION = re.compile(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?")
RESERVED_WORDS = "; waiting for room, node"
"""How a failure message tells of a reservation (`words`; a rebuild takes the message without it)."""
LONGEST_WAIT = 7 * 24 * 3600.0
"""A wait longer than a week is taken as a week (a reservation must end)."""


def parse_wait(text: str) -> float:
    """Seconds of a wait: "600", "600s", "10m", "1h30m" (Go-style, h/m/s); ValueError naming the text."""
    match = _DURATION.fullmatch(text.strip())
    if not text.strip() or match is None:
        raise ValueError(f"{MAX_WAIT}: {text[:40]!r} is not a duration like 600, 600s, 10m or 1h30m")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    return min(LONGEST_WAIT, hours * 3600 + minutes * 60 + seconds)


@dataclass(frozen=True, slots=True)
class Unit:
    """What waits as one: a claim, or a complete gang (`key`: `gang_unit`)."""

    key: str
    claims: tuple[ResourceClaim, ...]
    domain: str | None = None
    """A gang's domain label (gang.py)."""


@dataclass(frozen=True, slots=True)
class Reservation:
    nodes: tuple[str, ...]
    devices: int
    """Bitset of the engine's device ids held."""
    until: float
    """When the wait is over (seconds since the epoch)."""


_POD, _GANG = "pod:", "gang:"


def pod_unit(pod: str) -> str:
    """The unit key of the Pod keyed `pod` (namespace/name): apart from a claim of the same name (a claim
    placed alone is its own unit, keyed namespace/name too), as a gang's are (`gang_unit`)."""
    return f"{_POD}{pod}"


def gang_unit(gang: str) -> str:
    """The unit key of the gang `gang` (namespace/name, as `gang.gang_of` names it): ``gang:<ns>/<name>``."""
    return f"{_GANG}{gang}"


def unit_parts(unit: str) -> tuple[str, str]:
    """What a unit key (`pod_unit`, `gang_unit`, or a claim's own key) names: ("pod" | "gang" | "claim",
    namespace/name)."""
    for kind, prefix in (("pod", _POD), ("gang", _GANG)):
        if unit.startswith(prefix):
            return kind, unit[len(prefix) :]
    return "claim", unit


class Reservations:
    """Who holds what (see the module docstring)."""

    def __init__(self, engine: Engine, default_wait: float = 0.0) -> None:
        self.engine = engine
        self.default_wait = default_wait
        self.held: dict[str, Reservation] = {}
        """Unit key -> its reservation."""
        self.deadlines: dict[str, float] = {}
        """Unit key -> when its wait is over; kept while it waits, also once over (no new reservation)."""
        self.replayed: dict[str, float] = {}
        """Claim key -> `reservedUntil` of its last failure in ALLOCATIONS (a wait begun by an earlier term)."""
        self.problems: dict[str, str] = {}
        """Claim key -> why its max-wait annotation was not used (told in its failure message)."""
        self.evicting: dict[str, int] = {}
        """`pod_unit(pod key)` -> the devices held for the Pod while the Pods in its way are evicted
        (evicting.py); kept apart from `held` (which `plan` makes anew), counted by `others` as any
        reservation."""

    def max_wait(self, claim: ResourceClaim) -> float:
        """Seconds the claim may hold a reservation (its annotation, else the default)."""
        meta = claim.metadata
        text = meta.annotations.get(MAX_WAIT, meta.labels.get(MAX_WAIT))
        if text is None:
            return self.default_wait
        try:
            wait = parse_wait(text)
        except ValueError as exc:
            self.problems[claim.key] = str(exc)
            return self.default_wait
        self.problems.pop(claim.key, None)
        return wait

    def shown(self, unit: str) -> tuple[tuple[str, ...], float]:
        """(nodes held, when the wait is over: 0 for no wait) for a failure event of the unit's claims."""
        reservation = self.held.get(unit)
        return (reservation.nodes if reservation is not None else ()), self.deadlines.get(unit, 0.0)

    def others(self, unit: str) -> int:
        """The devices every other unit holds (what `unit` avoids; its own it may take first)."""
        bits = 0
        for key, reservation in self.held.items():
            if key != unit:
                bits |= reservation.devices
        for key, devices in self.evicting.items():
            if key != unit:
                bits |= devices
        return bits

    def plan(self, units: list[Unit], now: float) -> list[str]:
        """Reserve for the `units` waiting (oldest first) at time `now`; returns the keys of the
        units whose reservation began, moved or ended (their failures are written again). Units
        not listed any more (placed, deleted, a gang no longer complete) hold nothing."""
        before = self.held
        self.held = {}
        listed = {u.key for u in units}
        for key in [k for k in self.deadlines if k not in listed]:
            del self.deadlines[key]
        avoid = 0
        placement = self.engine.placement
        for unit in units:
            until = self.deadlines.get(unit.key)
            if until is None and (replayed := [self.replayed[c.key] for c in unit.claims if c.key in self.replayed]):
                until = self.deadlines[unit.key] = max(replayed)  # a wait an earlier term began
            if until is not None and now >= until:
                continue  # the wait is over: it keeps waiting, holding nothing
            wait = min(self.max_wait(c) for c in unit.claims) if until is None else 0.0
            if until is None and wait <= 0:
                continue
            devices = reservation_for(self.engine, unit.claims, domain_label=unit.domain, avoid=avoid)
            if not devices:
                continue  # small, or no node could ever hold it
            if until is None:
                until = self.deadlines[unit.key] = now + wait  # the wait begins with its first reservation
            placement.reserve(devices)  # (for its node ranks; the engine holds nothing between calls)
            avoid |= placement.reserved_nodes
            inv = self.engine.inventory
            held_nodes = {d.local_node or "" for i in iter_bits(devices) if (d := inv.devices[i]) is not None}
            nodes = tuple(sorted(held_nodes, key=lambda n: inv.node_rank.get(n, 0)))
            self.held[unit.key] = Reservation(nodes, devices, until)
        placement.reserve(0)
        for key in [c.key for u in units for c in u.claims]:
            self.replayed.pop(key, None)  # its wait is this book's now
        changed = [k for k in listed if _nodes(before.get(k)) != _nodes(self.held.get(k))]
        changed += [k for k in before if k not in listed]
        return changed

    def drop(self, unit: str) -> bool:
        """The unit is placed or deleted: its reservation ends now; False if it held none."""
        self.deadlines.pop(unit, None)
        return self.held.pop(unit, None) is not None

    def per_node(self) -> dict[str, int]:
        """Node -> devices held there (for the `dralloc.devices.reserved` gauge): by waiting units, and
        for Pods while the Pods in their way are evicted (`evicting`)."""
        inv = self.engine.inventory
        out: dict[str, int] = {}
        devices = 0
        for bits in [r.devices for r in list(self.held.values())] + list(self.evicting.values()):
            devices |= bits  # (a device held twice counts once)
        for i in iter_bits(devices):
            rec = inv.devices[i] if i < len(inv.devices) else None
            if rec is not None and rec.local_node is not None:
                out[rec.local_node] = out.get(rec.local_node, 0) + 1
        return out

    def kept_from(self, claim: ResourceClaim) -> str:
        """For the failure message of a claim refused for now: the held nodes, whole again, that it
        may not take because it is smaller than they are (`gang.describe_held_whole`); "" for none."""
        engine = self.engine
        if not engine.placement.reserved_nodes:
            return ""
        lines = describe_held_whole(engine, [engine._plan(claim)])
        return "; " + lines[0] if lines else ""

    def next_deadline(self) -> float | None:
        """When the next reservation held ends (None: none held)."""
        return min((r.until for r in self.held.values()), default=None)

    def words(self, unit: str) -> str:
        """The reservation in a failure message ("" when none)."""
        reservation = self.held.get(unit)
        if reservation is None:
            return ""
        nodes = reservation.nodes
        shown = ", ".join(nodes[:4]) + (f" and {len(nodes) - 4} more" if len(nodes) > 4 else "")
        return f"{RESERVED_WORDS}{'s' if len(nodes) > 1 else ''} {shown} reserved for it (other claims take them last) until {_clock(reservation.until)}"


def _nodes(reservation: Reservation | None) -> tuple[str, ...]:
    """The nodes a failure event names (a change of them is written; the deadline never moves)."""
    return () if reservation is None else reservation.nodes


def _clock(epoch: float) -> str:
    import datetime

    return datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
