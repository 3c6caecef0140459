"""A claim submitted with a `status.allocation` naming another claim's devices (another namespace's)
against a real allocator process on a real nats-server (one H100 node: tests/fault/conftest.py):
it fails with the holder named, and no device is held twice, also after a restart. The rules
themselves: tests/allocator/test_adoption.py."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
from pipeline import Service, claim_event

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import AllocationResult, ResourceClaim, ResourceClaimStatus


def _allocated_as(claim: ResourceClaim, allocation: AllocationResult | None, name: str, namespace: str) -> ResourceClaim:
    meta = msgspec.structs.replace(claim.metadata, name=name, namespace=namespace, uid=f"uid-{name}")
    return msgspec.structs.replace(claim, metadata=meta, status=ResourceClaimStatus(allocation=allocation))


async def test_a_real_allocator_commits_no_device_twice_for_an_allocation_written_by_hand(bus: Bus, tmp_path: Path):
    url = bus.connected_url
    assert url is not None, "the test's bus is connected"
    allocator = Service("allocator", ["allocator", "--nats-url", url], {"DRALLOC_ALLOCATOR_LEASE_TTL": "2"}, tmp_path)
    await allocator.start()
    try:

        async def decision(namespace: str, name: str) -> ev.Event:
            async with asyncio.timeout(30):
                while True:
                    try:
                        return ev.decode((await jetstream(bus).get_last_msg("ALLOCATIONS", ev.subject("allocations", namespace, name))).data)
                    except Exception:  # noqa: BLE001 - not decided yet
                        await asyncio.sleep(0.1)

        first = claim_event("a", gpus=8)  # the whole node
        await bus.publish(first)
        held = await decision("bench", "a")
        assert isinstance(held, ev.AllocationCommitted)
        thief = ev.ClaimSubmitted(claim=_allocated_as(first.claim, held.allocation, "thief", "team-b"))
        await bus.publish(thief)
        refused = await decision("team-b", "thief")
        assert isinstance(refused, ev.AllocationFailed) and refused.reason == "error"
        assert "is already allocated to claim bench/a" in refused.message
        # The allocator goes on, and its ledger after a restart still has the node full.
        await allocator.stop()
        await allocator.start()
        await bus.publish(claim_event("after", gpus=1))
        after = await decision("bench", "after")
        assert isinstance(after, ev.AllocationFailed) and after.reason == "unsatisfiable"
        assert allocator.pid is not None
    finally:
        await allocator.stop()
