"""Reservations live in the streams (real nats-server, allocator service objects): the failure
written for a large waiting claim names the nodes held and when the wait ends; a successor
rebuilds the same reservation from ALLOCATIONS, keeps the wait's end, and small claims it decides
avoid the held node; the reservation ends with the claim's placement or deletion."""

from __future__ import annotations

import time

from conftest import decisions, submitted

from dralloc.allocator.service import Allocator
from dralloc.bus import Bus
from dralloc.metrics import allocator_metrics
from dralloc.schemas import events as ev
from dralloc.statuswriter.service import apply
from dralloc.statuswriter.sinks import KVSink, read_all


def deleted(event: ev.ClaimSubmitted) -> ev.ClaimDeleted:
    meta = event.claim.metadata
    return ev.ClaimDeleted(namespace="ml", name=meta.name, uid=meta.uid or "")


async def decide(allocator: Allocator, bus: Bus, event: ev.Event) -> None:
    await bus.publish(event)
    await allocator.on_claim(event)


async def test_a_reservation_is_written_rebuilt_by_a_successor_and_ends_with_the_claim(fleet_bus: Bus):
    bus = fleet_bus
    first = Allocator(bus)
    await first.rebuild()
    six_a, six_b = submitted("six-a", 6), submitted("six-b", 6)  # n-0 and n-1 keep 2 GPUs free each
    big = submitted("big", 8, {"dralloc.dev/max-wait": "10m"})
    began = time.time()
    for event in (six_a, six_b, big):
        await decide(first, bus, event)
    failure = (await decisions(bus))[-1]
    assert isinstance(failure, ev.AllocationFailed) and failure.key == "ml/big"
    assert failure.reserved_nodes == ["n-0"] and began + 600 <= failure.reserved_until <= time.time() + 600
    assert "node n-0 reserved for it" in failure.message
    written = len(await decisions(bus))
    # `dralloc get claims` shows it: the status writer keeps the failure's message
    kv = await bus.key_value("reservation-status")
    for event in await decisions(bus):
        await apply(KVSink(kv), event)
    (status,) = [s for s in await read_all(kv) if s.claim == "ml/big"]
    assert status.state == "unsatisfiable" and "node n-0 reserved for it" in status.message

    # The leader is gone; a successor rebuilds from the streams: the same node, the same end.
    successor = Allocator(bus)
    await successor.rebuild()
    held = successor.book.reservations.held["ml/big"]
    assert (held.nodes, held.until) == (("n-0",), failure.reserved_until)
    assert len(await decisions(bus)) == written  # nothing new to say: the stream already says it
    await successor.observe_once()  # what its observe loop hands the metrics while they are read
    gauge = allocator_metrics()._observe_reserved(None)  # dralloc.devices.reserved
    assert [(o.value, dict(o.attributes)) for o in gauge] == [(8, {"node": "n-0"})]

    # A small claim decided by the successor avoids the held node (best fit alone would take n-0).
    small = submitted("small", 2)
    await decide(successor, bus, small)
    commit = (await decisions(bus))[-1]
    assert isinstance(commit, ev.AllocationCommitted) and commit.key == "ml/small" and commit.node == "n-1"

    # six-a leaves: the big claim is retried, placed on its node, and its reservation ends.
    await decide(successor, bus, deleted(six_a))
    await successor.retry(big.claim)
    placed = (await decisions(bus))[-1]
    assert isinstance(placed, ev.AllocationCommitted) and placed.key == "ml/big" and placed.node == "n-0"
    assert successor.book.reservations.held == {} and successor.engine.placement.reserved == 0
    await successor.observe_once()
    assert allocator_metrics()._observe_reserved(None) == []


async def test_a_deleted_claim_holds_nothing_and_a_successor_rebuilds_no_reservation(fleet_bus: Bus):
    bus = fleet_bus
    first = Allocator(bus)
    await first.rebuild()
    six_a, six_b = submitted("six-a", 6), submitted("six-b", 6)
    big = submitted("big", 8, {"dralloc.dev/max-wait": "10m"})
    for event in (six_a, six_b, big):
        await decide(first, bus, event)
    assert first.book.reservations.held["ml/big"].nodes == ("n-0",)
    await decide(first, bus, deleted(big))
    assert first.book.reservations.held == {} and first.engine.placement.reserved == 0

    successor = Allocator(bus)
    await successor.rebuild()
    assert successor.book.reservations.held == {} and "ml/big" not in successor.waiting
