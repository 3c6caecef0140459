"""Issue #11's input attacks (names, adopted allocations, selectors) against the services as processes.

The behaviour is implemented in schemas/ (names, nesting), allocator/decisions.py (adoption)
and the engine's CEL budget; these tests hold it to what a hostile input must not achieve.
"""

from __future__ import annotations

import asyncio

import pytest
from hostile import HOSTILE, Harness, attack, committed_to

from dralloc.schemas import events as ev

pytestmark = pytest.mark.asyncio(loop_scope="module")


async def test_names_the_api_server_refuses_are_never_allocated(h: Harness):
    await attack(h, "odd-names")
    await h.allocations.read_new()
    keys = {getattr(s.event, "key", "") for s in h.allocations.seen if isinstance(s.event, ev.AllocationCommitted)}
    assert not [k for k in keys if k.startswith(f"{HOSTILE}/") or k.startswith("team-a")], keys


async def test_an_allocation_naming_a_running_claims_device_is_not_adopted(h: Harness):
    held = await h.holders()
    await attack(h, "adopted-conflict")  # verify: no device held by two live claims
    victim = sorted(held.items())[0][1][0]
    async with asyncio.timeout(10):
        while True:
            await h.allocations.read_new()
            decided = [s.event for s in h.allocations.seen if getattr(s.event, "key", "") == "other-team/squatter"]
            if decided:
                break
            await asyncio.sleep(0.2)
    if isinstance(decided[0], ev.AllocationFailed):
        assert "running-" in decided[0].message or "held" in decided[0].message  # names the holder
    else:
        assert victim not in (await h.holders()).get("other-team/squatter", ())


async def test_an_expensive_selector_ends_in_error_without_stalling_other_claims(h: Harness):
    await attack(h, "slow-selector")  # verify: a valid claim decided within 10 s meanwhile
    async with asyncio.timeout(60):
        while True:
            await h.allocations.read_new()
            decided = [s.event for s in h.allocations.seen if getattr(s.event, "key", "") == f"{HOSTILE}/slow"]
            if decided:
                break
            await asyncio.sleep(0.5)
    assert isinstance(decided[0], ev.AllocationFailed) and decided[0].reason == "error"
    assert not await committed_to(h, HOSTILE, "slow")
