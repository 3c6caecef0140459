"""Claims the allocator takes from the consumer are queued and decided together (allocator/intake.py),
against a real nats-server: what is taken at once is decided in the order taken, each claim once."""

from __future__ import annotations

import asyncio

import pytest
from pipeline import claim_event

from dralloc.allocator import shell
from dralloc.allocator.service import Allocator
from dralloc.bus import Bus, StoredMessage
from dralloc.schemas import events as ev


async def decisions(bus: Bus) -> list[ev.Event]:
    stored: list[StoredMessage] = []
    await bus.scan("ALLOCATIONS", stored.append)
    return [ev.decode(message.data) for message in stored]


async def test_claims_taken_at_once_are_decided_in_order_and_each_acked_once_its_decision_is_stored(bus: Bus):
    allocator = Allocator(bus)
    await allocator.rebuild()
    taken = [claim_event(f"c{i}", gpus=3) for i in range(3)]  # one node of 8 GPUs: the third does not fit
    pending = [await allocator.take_claim(event) for event in taken]
    assert all(p is not None for p in pending)
    await asyncio.gather(*pending)
    written = await decisions(bus)
    assert [(type(d).__name__, d.key) for d in written] == [
        ("AllocationCommitted", "bench/c0"),
        ("AllocationCommitted", "bench/c1"),
        ("AllocationFailed", "bench/c2"),
    ]


async def test_a_claim_taken_twice_at_once_is_committed_once(bus: Bus):
    allocator = Allocator(bus)
    await allocator.rebuild()
    event = claim_event("twice", gpus=4)
    pending = [await allocator.take_claim(event), await allocator.take_claim(event)]
    await asyncio.gather(*pending)
    written = await decisions(bus)
    assert [type(d).__name__ for d in written] == ["AllocationCommitted"]
    assert not allocator.term.is_set()


async def test_a_delete_taken_behind_its_claim_waits_for_the_claim_and_releases_it(bus: Bus):
    allocator = Allocator(bus)
    await allocator.rebuild()
    submitted = claim_event("brief", gpus=8)
    claim = submitted.claim
    deleted = ev.ClaimDeleted(namespace=claim.metadata.namespace or "default", name=claim.metadata.name, uid=claim.metadata.uid or "")
    first = await allocator.take_claim(submitted)
    second = await allocator.take_claim(deleted)
    await asyncio.gather(*(p for p in (first, second) if p is not None))
    assert [type(d).__name__ for d in await decisions(bus)] == ["AllocationCommitted", "AllocationReleased"]
    assert not allocator.engine.ledger.claims  # its devices are free again


async def test_a_backlog_is_written_hop_by_hop_not_after_all_of_it_is_decided(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(shell, "HOP_NS", 0)  # every hop to the engine's thread ends after one claim
    allocator = Allocator(bus)
    await allocator.rebuild()
    sent_before: list[int] = []  # per claim, the decisions sent when the engine took it up
    allocate = allocator.book.allocate

    def noting(claim, context=None):  # type: ignore[no-untyped-def]
        sent_before.append(allocator.fence.last_seq)
        return allocate(claim, context)

    monkeypatch.setattr(allocator.book, "allocate", noting)
    pending = [await allocator.take_claim(claim_event(f"c{i}", gpus=1)) for i in range(4)]  # taken at once: one run
    await asyncio.gather(*pending)
    first = sent_before[0]
    assert sent_before == [first, first + 1, first + 2, first + 3]  # each decided after the one before it was sent
    assert [type(d).__name__ for d in await decisions(bus)] == ["AllocationCommitted"] * 4


async def test_a_hop_is_cut_by_the_engine_threads_cpu_time_not_the_clock(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    # a loaded machine: the engine's thread waits (for a CPU, for the GIL) without working; the hop still holds HOP_NS of work
    import time

    monkeypatch.setattr(shell, "HOP_NS", 10_000_000)
    allocator = Allocator(bus)
    await allocator.rebuild()
    sent_before: list[int] = []
    allocate = allocator.book.allocate

    def waiting(claim, context=None):  # type: ignore[no-untyped-def]
        sent_before.append(allocator.fence.last_seq)
        time.sleep(0.006)  # 6 ms of the clock, ~no CPU
        return allocate(claim, context)

    monkeypatch.setattr(allocator.book, "allocate", waiting)
    pending = [await allocator.take_claim(claim_event(f"c{i}", gpus=1)) for i in range(4)]  # taken at once: one run
    await asyncio.gather(*pending)
    assert len(set(sent_before)) == 1  # all four in one hop (by the clock: two hops of two)
    assert [type(d).__name__ for d in await decisions(bus)] == ["AllocationCommitted"] * 4
