"""When a claim's allocation as the cluster holds it is the one dralloc wrote.

A contract between the status writer, which writes `status.allocation` and later clears only its
own, and the allocator, which reads claims back from the cluster and releases a decision the
cluster no longer holds. Both must agree, or a write the API server changed on its way in reads
as someone else's allocation: the writer refuses to clear it, and the allocator releases its own
decision and decides the claim again, writing the same allocation, round after round.

The API server changes an allocation on its way in two ways: it sets `allocationTimestamp`, and
it drops the result fields of a feature gate that is off (its status strategy's
`dropDisabledStatusFields`), unless the claim used them before. A slice written while a gate was
on keeps its fields after the gate is turned off, so dralloc can allocate a device with binding
conditions, or a share of one, that the server then strips from the status.
"""

from __future__ import annotations

import msgspec

from dralloc.schemas.resource import AllocationResult, DeviceRequestAllocationResult

GATED_RESULT_FIELDS: dict[str, object] = {
    "admin_access": None,  # DRAAdminAccess
    "share_id": None,  # DRAConsumableCapacity
    "consumed_capacity": {},  # DRAConsumableCapacity
    "binding_conditions": [],  # DRADeviceBindingConditions
    "binding_failure_conditions": [],  # DRADeviceBindingConditions
    "skip_node_operations": [],  # DRAOptionalNodeOperations (1.37)
}
"""A device result's fields an API server drops when their feature gate is off, with the value a
dropped one reads as."""


def same_allocation(cluster: AllocationResult, ours: AllocationResult) -> bool:
    """Whether `cluster` (a claim's allocation as the API server holds it) is `ours` as written: the
    same devices in the same order, config and node selector. When it was written is not compared,
    and a field of `GATED_RESULT_FIELDS` that `ours` has and the cluster's result lacks counts as
    dropped by the server, not as a difference; a field only the cluster's has is a difference."""
    if cluster.node_selector != ours.node_selector or cluster.devices.config != ours.devices.config:
        return False
    have, want = cluster.devices.results, ours.devices.results
    if len(have) != len(want):
        return False
    return all(theirs == mine or theirs == _as_kept(theirs, mine) for theirs, mine in zip(have, want, strict=True))


def _as_kept(theirs: DeviceRequestAllocationResult, mine: DeviceRequestAllocationResult) -> DeviceRequestAllocationResult:
    """`mine` without the gated fields the cluster's result lacks."""
    dropped = {name: empty for name, empty in GATED_RESULT_FIELDS.items() if getattr(theirs, name) == empty and getattr(mine, name) != empty}
    return msgspec.structs.replace(mine, **dropped) if dropped else mine
