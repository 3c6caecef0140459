"""A claim delivered again once its decision is stored (a redelivery after a late ack, a new term's
consumer handing back what the last one never acked, the same claim published again), against a
real nats-server: it is acked with nothing written, and the leader keeps its term."""

from __future__ import annotations

import msgspec
from pipeline import claim_event

from dralloc.allocator.service import Allocator
from dralloc.bus import Bus, StoredMessage
from dralloc.schemas import events as ev
from dralloc.schemas.resource import DeviceClass, ResourceClaim


async def decisions(bus: Bus) -> list[ev.Event]:
    """Every message of ALLOCATIONS, in order."""
    stored: list[StoredMessage] = []
    await bus.scan("ALLOCATIONS", stored.append)
    return [ev.decode(message.data) for message in stored]


async def test_a_redelivered_claim_whose_failure_is_stored_writes_nothing_in_this_term_or_the_next(bus: Bus):
    fits, too_big = claim_event("fits"), claim_event("too-big", gpus=16)  # one node of 8 GPUs
    leader = Allocator(bus)
    await leader.rebuild()
    for event in (fits, too_big):
        await leader.on_claim(event)
    first = await decisions(bus)
    assert [type(d) for d in first] == [ev.AllocationCommitted, ev.AllocationFailed]

    for event in (fits, too_big):  # redelivered: the ack came too late
        await leader.on_claim(event)
    assert await decisions(bus) == first and not leader.term.is_set()

    successor = Allocator(bus)  # the next term: the consumer hands back what was never acked
    await successor.rebuild()
    for event in (too_big, fits):
        await successor.on_claim(event)
    assert await decisions(bus) == first and not successor.term.is_set()
    assert "bench/too-big" not in successor.committed and "bench/too-big" in successor.waiting  # it still waits for room


def device_class(name: str, driver: str) -> DeviceClass:
    return msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]},
        },
        DeviceClass,
    )  # fmt: skip


def of_class(name: str, class_name: str) -> ev.ClaimSubmitted:
    event = claim_event(name)
    claim = event.claim
    request = msgspec.structs.replace(
        claim.spec.devices.requests[0], exactly=msgspec.structs.replace(claim.spec.devices.requests[0].exactly, device_class_name=class_name)
    )
    devices = msgspec.structs.replace(claim.spec.devices, requests=[request])
    return ev.ClaimSubmitted(claim=msgspec.structs.replace(claim, spec=msgspec.structs.replace(claim.spec, devices=devices)))


async def test_a_claim_whose_decision_flips_back_is_written_again_and_redelivered_in_between_writes_nothing(bus: Bus):
    """A claim's failure changes with the inventory and back (a class not known, known but matching
    nothing, gone again): the same failure is news again and is written, without ending the term;
    delivered again in between, the claim is acked with nothing written."""
    event = of_class("later", "later.example.com")
    claim: ResourceClaim = event.claim
    leader = Allocator(bus)
    await leader.rebuild()

    await leader.on_claim(event)  # the class is not known: an error
    await leader.on_inventory(ev.DeviceClassPublished(device_class=device_class("later.example.com", "nothing.example.com")))
    leader.book.unpark()  # (what the retry round does after an inventory change)
    await leader.retry(claim)  # known, matches no device: unsatisfiable
    await leader.on_claim(event)  # redelivered meanwhile
    await leader.on_inventory(ev.DeviceClassRemoved(name="later.example.com"))
    leader.book.unpark()
    await leader.retry(claim)  # not known again: the first failure again

    written = await decisions(bus)
    assert [(type(d), getattr(d, "reason", None)) for d in written] == [
        (ev.AllocationFailed, "error"),
        (ev.AllocationFailed, "unsatisfiable"),
        (ev.AllocationFailed, "error"),
    ]
    assert written[0] == written[2]
    assert not leader.term.is_set()
