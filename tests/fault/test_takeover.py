"""Active + standby allocators as real processes: takeover after kill -9, fencing after a pause."""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pipeline
from pipeline import Stack, StreamReader, check, offer, settle

from dralloc.bus import Bus
from dralloc.schemas import events as ev


async def leader_change(stack: Stack, bus: Bus, old: int | None, timeout: float = 15.0) -> int:
    async with asyncio.timeout(timeout):
        while (pid := await stack.leader_pid(bus)) in (None, old):
            await asyncio.sleep(0.1)
    return pid


def epochs(stored: list[pipeline.Stored]) -> list[int]:
    """Dralloc-Epoch of every decision, in stream order."""
    return [int(s.headers["Dralloc-Epoch"]) for s in stored if isinstance(s.event, ev.AllocationCommitted)]


async def test_standby_takes_over_after_the_leader_is_killed():
    async with Stack(nodes=8, allocators=2) as stack, await Bus.connect(stack.nats.url, name="test") as bus:
        await stack.ready(bus)
        first = await stack.leader_pid(bus)
        await offer(bus, [f"before-{i}" for i in range(10)], 50, asyncio.Event())
        assert (await settle(bus, {f"before-{i}" for i in range(10)}, 15)).lost == 0
        standby = next(s for s in stack.allocators_() if s.pid != first)

        killed_at = time.monotonic()
        await next(s for s in stack.allocators_() if s.pid == first).kill()
        await offer(bus, [f"after-{i}" for i in range(10)], 50, asyncio.Event())
        second = await leader_change(stack, bus, first)
        verdict = await settle(bus, {f"after-{i}" for i in range(10)}, 15)
        took = time.monotonic() - killed_at

        assert second == standby.pid
        assert verdict.lost == 0 and verdict.duplicated == 0, verdict.duplicates
        assert took < 12, f"the standby needed {took:.1f}s"  # lease ttl 2 s in the stack + rebuild; ack_wait is 10 s
        decisions = StreamReader(bus, "ALLOCATIONS")
        await decisions.read_new()
        seen = epochs(decisions.seen)
        assert len(set(seen)) == 2 and seen == sorted(seen)  # two terms, the new one's epoch above the old
        claims = StreamReader(bus, "CLAIMS")
        await claims.read_new()
        whole = check(claims.seen, decisions.seen)
        assert whole.double_allocated_devices == 0 and whole.duplicated == 0 and whole.lost == 0


async def test_a_paused_leader_is_deposed_and_never_commits_after_its_successor():
    async with Stack(nodes=8, allocators=2) as stack, await Bus.connect(stack.nats.url, name="test") as bus:
        await stack.ready(bus)
        first = await stack.leader_pid(bus)
        assert first is not None
        os.kill(first, signal.SIGSTOP)  # a stalled leader: GC pause, swapped out, stopped by a debugger
        try:
            # Claims arrive while it hangs; the stopped process may hold some of them unacked.
            await offer(bus, [f"during-{i}" for i in range(20)], 40, asyncio.Event())
            second = await leader_change(stack, bus, first)
            await settle(bus, {f"during-{i}" for i in range(20)}, 15)
        finally:
            os.kill(first, signal.SIGCONT)
        # The old leader wakes up believing nothing happened; more claims keep coming.
        await offer(bus, [f"after-{i}" for i in range(20)], 40, asyncio.Event())
        verdict = await settle(bus, {f"during-{i}" for i in range(20)} | {f"after-{i}" for i in range(20)}, 15)
        await asyncio.sleep(1.0)  # time for any late write of the old leader to land (it must not)

        assert await stack.leader_pid(bus) == second
        assert verdict.lost == 0 and verdict.duplicated == 0, verdict.duplicates
        decisions, claims = StreamReader(bus, "ALLOCATIONS"), StreamReader(bus, "CLAIMS")
        await decisions.read_new()
        await claims.read_new()
        seen = epochs(decisions.seen)
        assert seen == sorted(seen), "a decision of an older epoch was stored after a newer one"
        assert check(claims.seen, decisions.seen).double_allocated_devices == 0
