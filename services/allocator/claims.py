"""Small facts about claims the book of decisions asks again and again (pure)."""

from __future__ import annotations

from dralloc.allocator.engine.gang import gang_of
from dralloc.allocator.reservations import gang_unit
from dralloc.schemas import events as ev
from dralloc.schemas.resource import AllocationResult, ResourceClaim


def unit_key(claim: ResourceClaim) -> str:
    """What a claim waits as (reservations.Unit.key): its gang, or itself."""
    gang = gang_of(claim)
    return gang_unit(gang[0]) if gang is not None and gang[1] > 1 else claim.key


def same_generation(a: ResourceClaim, b: ResourceClaim) -> bool:
    """The same object (uid) at the same generation (its spec unchanged)."""
    return a.metadata.uid == b.metadata.uid and (a.metadata.generation or 1) == (b.metadata.generation or 1)


def ended_in_error(decision: ev.AllocationEvent | None, claim: ResourceClaim) -> bool:
    """Is `decision` (the claim's last in ALLOCATIONS) an `error` for this very claim and generation?"""
    return (
        isinstance(decision, ev.AllocationFailed)
        and decision.reason == "error"
        and decision.uid == (claim.metadata.uid or "")
        and decision.generation == (claim.metadata.generation or 1)
    )


def allocation_of(claim: ResourceClaim) -> AllocationResult | None:
    """The allocation the claim arrived with (`status.allocation`), if any."""
    return claim.status.allocation if claim.status is not None else None
