"""The lease and the fence against a real nats-server, in one process so each step is deterministic."""

from __future__ import annotations

import asyncio
import time

import pytest
from pipeline import claim_event

from dralloc.allocator import leader
from dralloc.allocator.service import Allocator, Fenced
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev


async def stored(bus: Bus) -> list[ev.Event]:
    last = (await bus.stream_state("ALLOCATIONS")).last_sequence
    return [ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data) for seq in range(1, last + 1)]


def devices(event: ev.Event) -> set[str]:
    assert isinstance(event, ev.AllocationCommitted) and event.allocation
    return {r.device for r in event.allocation.devices.results}


async def test_a_write_from_a_stale_view_is_refused_by_the_server(bus: Bus):
    old, new = Allocator(bus), Allocator(bus)
    await old.rebuild()
    await new.rebuild()
    await new.on_claim(claim_event("x", gpus=4))
    # `old` still believes the node is empty: its decision would hand out x's GPUs again.
    with pytest.raises(Fenced, match="moved past sequence"):
        await old.retry(claim_event("y", gpus=8).claim)
    assert old.term.is_set()  # its term is over: its state cannot be trusted
    assert [type(e) for e in await stored(bus)] == [ev.AllocationCommitted]
    assert "bench/y" not in old.committed

    # A fresh term rebuilds from the stream and decides correctly.
    successor = Allocator(bus)
    await successor.rebuild()
    await successor.on_claim(claim_event("y", gpus=4))
    x, y = await stored(bus)
    assert isinstance(y, ev.AllocationCommitted) and not devices(x) & devices(y)


async def test_a_leader_whose_lease_ran_out_writes_nothing(bus: Bus):
    lease = leader.Lease(await bus.key_value(leader.BUCKET), ttl=0.3)
    assert await lease.acquire(asyncio.Event())
    allocator = Allocator(bus, lease=lease)
    await allocator.rebuild()
    await allocator.on_claim(claim_event("x"))
    await asyncio.sleep(0.4)  # never renewed (a stalled process)
    with pytest.raises(Fenced, match="lease lost"):
        await allocator.retry(claim_event("y").claim)
    assert [e.key for e in await stored(bus)] == ["bench/x"]


async def test_a_standby_takes_the_lease_only_after_the_holder_went_silent_for_ttl(bus: Bus):
    kv = await bus.key_value(leader.BUCKET)
    holder, standby = leader.Lease(kv, ttl=1.0), leader.Lease(kv, ttl=1.0)
    assert await holder.acquire(asyncio.Event())
    term = asyncio.Event()
    keeping = asyncio.create_task(holder.keep(term))
    waiting = asyncio.create_task(standby.acquire(asyncio.Event()))
    await asyncio.sleep(2.5)  # 2.5 ttl: renewals keep the standby out
    assert not waiting.done() and holder.held

    keeping.cancel()  # the holder goes silent
    silent_at = time.monotonic()
    assert await waiting
    assert time.monotonic() - silent_at >= 1.0 - holder.ttl / 3  # not before the lease could have run out
    assert standby.epoch > holder.epoch

    # The old holder's next renewal finds it deposed and ends its term.
    term = asyncio.Event()
    await asyncio.wait_for(holder.keep(term), 5)
    assert term.is_set() and not holder.held


async def test_resigning_hands_the_lease_over_at_once(bus: Bus):
    kv = await bus.key_value(leader.BUCKET)
    holder, standby = leader.Lease(kv, ttl=30.0), leader.Lease(kv, ttl=30.0)
    assert await holder.acquire(asyncio.Event())
    waiting = asyncio.create_task(standby.acquire(asyncio.Event()))
    await asyncio.sleep(0.2)
    await holder.resign()
    assert await asyncio.wait_for(waiting, 5)  # far sooner than the 30 s ttl
    assert standby.held
