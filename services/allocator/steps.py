"""What the book of decisions (decisions.py) asks the service to do: the steps `Decisions.submitted`
returns (Adopt, Allocate, GangComplete, AllocatePod), the plans of gangs and Pods, and the failure
event of a claim that does not fit. Plain data, no behaviour.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from dralloc.allocator.engine import Outcome
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim


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
    or `failures` (every claim not yet allocated fails with the unit's reason; none holds devices),
    then `evictions` (with moves on: the Pods in its way to evict, evicting.py; their failures say so)."""

    pod: str
    batch: list[ev.AllocationEvent] = field(default_factory=list)
    failures: list[ev.AllocationFailed] = field(default_factory=list)
    evictions: list[ev.EvictionRequested] = field(default_factory=list)
    """The requests to write as one atomic batch after the failures (`Evictions.refused` if not stored)."""
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
    evictions: list[ev.EvictionRequested] = field(default_factory=list)
    """With `unplaced`, for a gang of Pods with moves on: the Pods in its way to evict (evicting.py),
    written as one atomic batch after the members' failures (which tell of them)."""


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
