"""The allocator's intake queue (allocator/intake.py), with no bus: claims put while a batch is being
decided are decided next, in order; what deciding raises reaches every claim of its batch; each
claim's future follows the write that stores its decision."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from dralloc.allocator.intake import Intake, Taken
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim


def taken(name: str) -> Taken:
    claim = msgspec.convert({"metadata": {"name": name, "namespace": "ml", "uid": name}, "spec": {"devices": {"requests": []}}}, ResourceClaim)
    return Taken(ev.ClaimSubmitted(claim=claim), None, 0.0)


async def test_claims_put_while_a_batch_is_decided_come_next_in_order():
    seen: list[list[str]] = []
    gate = asyncio.Event()

    async def decide(batch: list[Taken]) -> None:
        seen.append([t.event.claim.metadata.name for t in batch])
        await gate.wait()
        for t in batch:
            t.settle(None)

    intake = Intake(decide)
    first = intake.put(taken("a"))
    await asyncio.sleep(0)  # the drain takes "a" and waits at the gate
    later = [intake.put(taken("b")), intake.put(taken("c"))]
    gate.set()
    await asyncio.gather(first, *later)
    assert seen == [["a"], ["b", "c"]]


async def test_what_deciding_raises_reaches_every_claim_of_its_batch_and_the_next_batch_goes_on():
    calls = 0

    async def decide(batch: list[Taken]) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("the bus is down")
        for t in batch:
            t.settle(None)

    intake = Intake(decide)
    failing = [intake.put(taken("a")), intake.put(taken("b"))]
    await intake.flush()
    for future in failing:
        with pytest.raises(RuntimeError, match="the bus is down"):
            await future
    await intake.put(taken("c"))  # a later claim is decided normally


async def test_a_claim_is_done_only_once_the_write_after_its_decision_is_stored():
    loop = asyncio.get_running_loop()
    write: asyncio.Future[None] = loop.create_future()
    refused: asyncio.Future[None] = loop.create_future()

    async def decide(batch: list[Taken]) -> None:
        batch[0].settle(write)
        batch[1].settle(refused)

    intake = Intake(decide)
    stored, fenced = intake.put(taken("a")), intake.put(taken("b"))
    await intake.flush()
    assert not stored.done() and not fenced.done()
    write.set_result(None)
    refused.set_exception(RuntimeError("fenced"))
    await stored
    with pytest.raises(RuntimeError, match="fenced"):
        await fenced
