"""A claim published right behind its DeviceClass (`dralloc submit -f` of a file holding both) is not
decided `error: device class ... not found` while the allocator's inventory reader lags: the
allocator reads INVENTORY as far as it is stored before deciding a claim naming a class it does not
know (allocator/catchup.py). The race is made certain: the inventory reader is held back on the
class until the claim is either decided or waiting for it. A class that does not exist is still an
error, with no wait. Real nats-server, the allocator service in-process."""

from __future__ import annotations

import asyncio
import uuid

import msgspec
import pytest

from dralloc.allocator import service
from dralloc.allocator.catchup import InventoryMark, class_names, names_unknown_class
from dralloc.allocator.config import Config
from dralloc.bus import Bus
from dralloc.bus.raw import connection
from dralloc.schemas import events as ev
from dralloc.schemas.resource import DeviceClass, ResourceClaim

LATE = "late.example.com"


def device_class(name: str) -> DeviceClass:
    return msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "DeviceClass", "metadata": {"name": name},
            "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]},
        },
        DeviceClass,
    )  # fmt: skip


def claim_of(name: str, class_name: str) -> ev.ClaimSubmitted:
    claim = msgspec.convert(
        {
            "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4()), "generation": 1},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": class_name, "count": 1}}]}},
        },
        ResourceClaim,
    )  # fmt: skip
    return ev.ClaimSubmitted(claim=claim)


class HeldBack(service.Allocator):
    """The allocator whose inventory reader stops at the class `LATE` until `release` is set."""

    last: HeldBack | None = None

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - the Allocator's own
        super().__init__(*args, **kwargs)
        self.release = asyncio.Event()
        self.holding = asyncio.Event()
        HeldBack.last = self

    async def on_inventory(self, event: ev.Event) -> None:
        if isinstance(event, ev.DeviceClassPublished) and event.device_class.metadata.name == LATE:
            self.holding.set()
            await self.release.wait()
        await super().on_inventory(event)


@pytest.fixture
async def leading(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    """The allocator service leading over `bus` (its Allocator a `HeldBack`), with every ALLOCATIONS
    event it writes collected as it is stored; yields (allocator, decisions)."""
    monkeypatch.setattr(service, "Allocator", HeldBack)
    decisions: list[ev.Event] = []

    async def collect(msg) -> None:  # noqa: ANN001 - a core NATS message
        decisions.append(ev.decode(msg.data))

    sub = await connection(bus).subscribe("dra.allocations.>", cb=collect)
    stop = asyncio.Event()
    task = asyncio.create_task(service.serve(bus, Config(lease_ttl=1.0), stop))
    await bus.publish(claim_of("warm", "gpu.nvidia.com"))
    async with asyncio.timeout(30):  # the term is reading both streams
        while not any(isinstance(d, ev.AllocationCommitted) and d.key == "ml/warm" for d in decisions):
            await asyncio.sleep(0.02)
    allocator = HeldBack.last
    assert allocator is not None and allocator.inventory_mark is not None
    try:
        yield allocator, decisions
    finally:
        allocator.release.set()
        stop.set()
        await task
        await sub.unsubscribe()


def of(decisions: list[ev.Event], name: str) -> list[str]:
    return [type(d).__name__ for d in decisions if d.key == f"ml/{name}"]


async def test_a_claim_right_behind_its_class_is_not_decided_before_the_class_is_read(leading, bus: Bus):
    allocator, decisions = leading
    await bus.publish(ev.DeviceClassPublished(device_class=device_class(LATE)))
    await bus.publish(claim_of("behind", LATE))
    mark = allocator.inventory_mark
    async with asyncio.timeout(30):  # the reader holds the class; the claim is either decided (the bug) or waits for it
        while not (of(decisions, "behind") or (allocator.holding.is_set() and mark.waits)):
            await asyncio.sleep(0.02)
    assert of(decisions, "behind") == []  # no `device class ... not found` written while the class was held
    allocator.release.set()
    async with asyncio.timeout(30):
        while not of(decisions, "behind"):
            await asyncio.sleep(0.02)
    await asyncio.sleep(0.2)  # (a second decision, were there one, is stored right behind the first)
    assert of(decisions, "behind") == ["AllocationCommitted"]
    assert mark.waits == 1


async def test_a_class_that_does_not_exist_is_an_error_without_waiting(leading, bus: Bus):
    allocator, decisions = leading
    await bus.publish(claim_of("nowhere", "missing.example.com"))
    async with asyncio.timeout(30):
        while not of(decisions, "nowhere"):
            await asyncio.sleep(0.02)
    failed = [d for d in decisions if isinstance(d, ev.AllocationFailed) and d.key == "ml/nowhere"]
    assert len(failed) == 1 and failed[0].reason == "error" and "'missing.example.com' not found" in failed[0].message
    assert allocator.inventory_mark.waits == 0  # everything INVENTORY held was read already: no wait


async def test_the_mark_waits_for_the_sequence_and_the_claims_naming_an_unknown_class():
    mark = InventoryMark(3)
    reached = asyncio.ensure_future(mark.reach(5))
    mark.read(4)
    await asyncio.sleep(0)
    assert not reached.done()
    mark.read(2)  # (never backwards)
    mark.read(5)
    await asyncio.wait_for(reached, 5)
    assert mark.seq == 5
    known = {"gpu.nvidia.com": object()}
    assert list(class_names(claim_of("a", LATE).claim)) == [LATE]
    assert names_unknown_class([claim_of("a", "gpu.nvidia.com").claim, claim_of("b", LATE).claim], known)
    assert not names_unknown_class([claim_of("a", "gpu.nvidia.com").claim], known)
