"""Pipelined decisions behind the fence, against a real nats-server: a write in flight is stored only
on top of its own term's previous write."""

from __future__ import annotations

import asyncio

import pytest
from pipeline import claim_event

from dralloc.allocator.service import Allocator, Fenced
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev


async def stored_keys(bus: Bus) -> list[str]:
    last = (await bus.stream_state("ALLOCATIONS")).last_sequence
    return [ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data).key for seq in range(1, last + 1)]


async def test_several_decisions_in_flight_are_stored_in_order_and_acked_together(bus: Bus):
    allocator = Allocator(bus)
    await allocator.rebuild()
    pending = [await allocator.take_claim(claim_event(f"c{i}")) for i in range(5)]
    assert all(p is not None for p in pending)
    assert sum(not p.done() for p in pending) > 1  # sent before the first was stored
    await asyncio.gather(*pending)
    assert await stored_keys(bus) == [f"bench/c{i}" for i in range(5)]


async def test_the_write_behind_a_refused_one_is_refused_even_where_the_sequence_fits(bus: Bus):
    old, new = Allocator(bus), Allocator(bus)
    await old.rebuild()
    await new.rebuild()
    await new.on_claim(claim_event("x", gpus=4))  # the stream is now one past what `old` has seen
    # `old` pipelines two decisions made from its stale view. The first expects the old end of the
    # stream and is refused; the second expects the end to be one further, which it now is (x):
    # only its expected last message id (the first write's, unique to old's term) refuses it.
    first = await old.take_claim(claim_event("y", gpus=4))
    second = await old.take_claim(claim_event("z", gpus=4))
    results = await asyncio.gather(first, second, return_exceptions=True)
    assert all(isinstance(r, Fenced) for r in results), results
    assert old.term.is_set() and not old.committed
    assert await stored_keys(bus) == ["bench/x"]
    with pytest.raises(Fenced, match="term over"):
        await old.on_claim(claim_event("w"))
