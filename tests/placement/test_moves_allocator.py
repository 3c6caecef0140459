"""Moves in the allocator service (services/allocator/moving.py; real nats-server): opt-in, a large claim
whose wait is over gets room by moving the small claim in its way; the release, the moved claim's new
commit (naming the claim it made room for) and the large claim's commit are one atomic batch, which the
status writer and a successor see; a batch not stored leaves the engine as the stream has it."""

from __future__ import annotations

import asyncio
from pathlib import Path

import msgspec
import pytest
from conftest import decisions, submitted
from test_reservations import NOW, gang_fleet
from test_reservations import claim as gang_claim

from dralloc.allocator import moving
from dralloc.allocator.config import Config
from dralloc.allocator.decisions import Decisions
from dralloc.allocator.engine import Engine
from dralloc.allocator.reservations import Unit
from dralloc.allocator.service import Allocator
from dralloc.bus import Bus
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.resource import AllocationResult, ResourceClaimConsumerReference, ResourceClaimStatus
from dralloc.statuswriter.service import apply
from dralloc.statuswriter.sinks import KVSink, read_all

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"


async def decide(allocator: Allocator, bus: Bus, event: ev.Event) -> None:
    await bus.publish(event)
    await allocator.on_claim(event)


async def scattered(allocator: Allocator, bus: Bus, wait: str) -> ev.ClaimSubmitted:
    """n-0: a 4-GPU claim (4 free); n-1: a 2-GPU claim (6 free); then an 8-GPU claim that may wait
    `wait`: 10 GPUs free, none whole."""
    x, y, z = submitted("x", 4), submitted("y", 4), submitted("z", 2)
    for event in (x, y, z):
        await decide(allocator, bus, event)
    await decide(allocator, bus, ev.ClaimDeleted(namespace="ml", name="x", uid=x.claim.metadata.uid or ""))
    assert {k: c.node for k, c in allocator.book.committed.items()} == {"ml/y": "n-0", "ml/z": "n-1"}
    big = submitted("big", 8, {"dralloc.dev/max-wait": wait})
    await decide(allocator, bus, big)
    assert isinstance((await decisions(bus))[-1], ev.AllocationFailed)
    return big


def holders(allocator: Allocator) -> dict[str, str | None]:
    return {key: record.node for key, record in allocator.engine.ledger.claims.items()}


async def test_moves_are_off_by_default(fleet_bus: Bus):
    bus = fleet_bus
    allocator = Allocator(bus)
    await allocator.rebuild()
    await scattered(allocator, bus, "0")
    written = len(await decisions(bus))
    await allocator.make_moves()
    assert len(await decisions(bus)) == written and Config().moves == "off"


async def test_when_its_wait_is_over_the_small_claim_in_the_way_moves_in_one_batch(fleet_bus: Bus):
    bus = fleet_bus
    allocator = Allocator(bus, moves="when-refused")
    await allocator.rebuild()
    await scattered(allocator, bus, "1s")
    written = len(await decisions(bus))
    await allocator.make_moves()
    assert len(await decisions(bus)) == written  # it still waits for room to come by itself
    await asyncio.sleep(1.1)
    await allocator.make_moves()
    released, moved, placed = (await decisions(bus))[written:]
    assert isinstance(released, ev.AllocationReleased) and released.key == "ml/z" and released.allocation is not None
    assert isinstance(moved, ev.AllocationCommitted) and moved.key == "ml/z" and moved.node == "n-0"
    assert "to make room for claim ml/big" in moved.claim.metadata.annotations[moving.MOVED]
    assert isinstance(placed, ev.AllocationCommitted) and placed.key == "ml/big" and placed.node == "n-1"
    assert holders(allocator) == {"ml/y": "n-0", "ml/z": "n-0", "ml/big": "n-1"}
    assert "ml/big" not in allocator.waiting

    # the status store shows the moved claim's new devices
    kv = await bus.key_value("moves-status")
    for event in await decisions(bus):
        await apply(KVSink(kv), event)
    status = {s.claim: s for s in await read_all(kv)}
    assert status["ml/z"].state == "allocated" and status["ml/big"].state == "allocated"
    z_devices = {r.device for r in moved.allocation.devices.results}  # type: ignore[union-attr]
    y_devices = {r.device for r in allocator.book.committed["ml/y"].allocation.devices.results}  # type: ignore[union-attr]
    assert not z_devices & y_devices  # both on n-0, no device twice

    # a successor rebuilds the same: z on n-0 with its new devices, big on n-1
    successor = Allocator(bus)
    await successor.rebuild()
    assert holders(successor) == {"ml/y": "n-0", "ml/z": "n-0", "ml/big": "n-1"}
    assert successor.engine.allocation_of("ml/z") == moved.allocation


async def test_early_moves_as_soon_as_it_waits(fleet_bus: Bus):
    bus = fleet_bus
    allocator = Allocator(bus, moves="early")
    await allocator.rebuild()
    await scattered(allocator, bus, "10m")
    await allocator.make_moves()
    assert holders(allocator)["ml/big"] == "n-1"


async def test_a_batch_not_stored_leaves_the_engine_as_the_stream_has_it(fleet_bus: Bus):
    bus = fleet_bus
    allocator = Allocator(bus, moves="early")
    await allocator.rebuild()
    await scattered(allocator, bus, "10m")
    before = {k: msgspec.to_builtins(r.allocation) for k, r in allocator.engine.ledger.claims.items()}
    written = len(await decisions(bus))

    async def refuse(*_args, **_kwargs):
        raise RuntimeError("the stream refused the batch")

    allocator.fence.send_batch = refuse  # type: ignore[method-assign]
    with pytest.raises(RuntimeError):
        await allocator.make_moves()
    assert {k: msgspec.to_builtins(r.allocation) for k, r in allocator.engine.ledger.claims.items()} == before
    assert len(await decisions(bus)) == written and "ml/big" in allocator.waiting
    assert allocator.book.committed["ml/z"].node == "n-1"


def test_claims_reserved_for_a_pod_or_in_a_gang_are_not_moved():
    book = Decisions(max_gang=8)
    pod = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    claims = [
        submitted("small", 1).claim,
        submitted("pod", 1).claim,
        submitted("member", 1, {"dralloc.dev/gang": "g", "dralloc.dev/gang-size": "2"}).claim,
        submitted("large", 8).claim,
    ]
    for claim in claims:
        allocation = msgspec.convert(
            {"devices": {"results": [{"request": "gpu", "driver": "d", "pool": "p", "device": claim.metadata.name}]}}, AllocationResult
        )
        status = ResourceClaimStatus(allocation=allocation, reserved_for=pod if claim.metadata.name == "pod" else [])
        book.committed[claim.key] = ev.AllocationCommitted(claim=msgspec.structs.replace(claim, status=status))
    assert set(moving.movable(book, Unit("ml/big", (submitted("big", 8).claim,)))) == {"ml/small"}
    book.seen.add("ml/small")  # the cluster has shown its allocation: a Kubernetes claim, never moved
    assert moving.movable(book, Unit("ml/big", (submitted("big", 8).claim,))) == {}


def test_only_large_units_whose_wait_is_over_are_due():
    book = Decisions(max_gang=8)
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        book.apply_inventory(event)
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 2, "prefix": "n"}]):
        for s in slices:
            book.apply_inventory(ev.ResourceSlicePublished(slice=s))
    for name, gpus in (("six-a", 6), ("six-b", 6)):
        outcome, commit = book.allocate(submitted(name, gpus).claim)
        assert commit is not None
        book.commit_written(commit)
    big, small = submitted("big", 8, {"dralloc.dev/max-wait": "10m"}).claim, submitted("three", 3).claim
    for claim in (big, small):
        assert book.allocate(claim)[0].status == "unsatisfiable"
    book.reserve_waiting(1000.0)
    assert moving.due(book, "when-refused", 1000.0) == []  # big still waits; three is small
    assert [u.key for u in moving.due(book, "early", 1000.0)] == ["ml/big"]
    # when-refused: from MOVE_AT (5/6) of its 10-minute wait on, 500 s in
    assert moving.due(book, "when-refused", 1499.0) == []
    assert [u.key for u in moving.due(book, "when-refused", 1500.0)] == ["ml/big"]
    assert [u.key for u in moving.due(book, "when-refused", 1600.0)] == ["ml/big"]
    assert moving.due(book, "off", 1600.0) == []


def test_a_gangs_moves_are_due_only_when_its_wait_is_over():
    # (test_reservations.gang_fleet: two cliques of two 4-GPU trays, no room for a gang of two trays)
    book = gang_fleet()
    marks = {"dralloc.dev/gang": "train", "dralloc.dev/gang-size": "2", "dralloc.dev/max-wait": "5m"}
    steps = [book.submitted(gang_claim(f"train-{i}", 4, marks)) for i in range(2)]
    assert not book.decide_gang(steps[-1]).placed
    book.reserve_waiting(NOW)
    assert [u.key for u in moving.due(book, "early", NOW)] == ["gang:ml/train"]
    # when-refused: not from MOVE_AT (250 s into its 5 minutes) as a single claim, only at its end
    assert moving.moves_from(300.0, gang=False) == pytest.approx(250.0) and moving.moves_from(300.0, gang=True) == 300.0
    assert moving.due(book, "when-refused", NOW + 250.0) == []
    assert moving.due(book, "when-refused", NOW + 299.0) == []
    assert [u.key for u in moving.due(book, "when-refused", NOW + 300.0)] == ["gang:ml/train"]


def test_the_setting_is_off_unless_set_and_a_wrong_one_is_refused_naming_it(monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv("DRALLOC_ALLOCATOR_MOVES", raising=False)
    assert Config.from_env().moves == "off"
    monkeypatch.setenv("DRALLOC_ALLOCATOR_MOVES", "when-refused")
    assert Config.from_env().moves == "when-refused"
    monkeypatch.setenv("DRALLOC_ALLOCATOR_MOVES", "always")
    with pytest.raises(ValueError, match="unknown DRALLOC_ALLOCATOR_MOVES 'always': use off or when-refused or early"):
        Config.from_env()


def test_when_refused_turns_the_held_node_rules_off_and_only_it():
    engine = Engine()
    for mode, rules in (("when-refused", False), ("early", True), ("off", True)):
        moving.configure(engine, mode)
        assert engine.placement.held_rules is rules
