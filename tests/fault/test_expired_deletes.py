"""CLAIMS keeps the latest event per claim and a delete expires (bus.TOMBSTONE_TTL_S): the
allocator still frees every deleted claim's devices, including one whose delete expired while no
allocator was running, and the status writer ends right. Real nats-server, one process, one
H100 node (8 GPUs; tests/fault/conftest.py)."""

from __future__ import annotations

import asyncio

from pipeline import claim_event

from dralloc.allocator.rebuild import release_gone
from dralloc.allocator.service import Allocator
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.statuswriter.service import apply
from dralloc.statuswriter.sinks import KVSink, read_all


async def decisions(bus: Bus) -> list[ev.Event]:
    last = (await bus.stream_state("ALLOCATIONS")).last_sequence
    return [ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data) for seq in range(1, last + 1)]


def deleted(claim: ev.ClaimSubmitted) -> ev.ClaimDeleted:
    meta = claim.claim.metadata
    return ev.ClaimDeleted(namespace=meta.namespace or "default", name=meta.name, uid=meta.uid or "")


async def until_gone(bus: Bus, event: ev.Event, within: float = 15.0) -> None:
    """Wait until CLAIMS holds nothing on the event's subject (its delete expired)."""
    async with asyncio.timeout(within):
        while (await jetstream(bus).stream_info("CLAIMS", subjects_filter=event.subject)).state.subjects:
            await asyncio.sleep(0.2)


async def test_a_delete_that_expired_while_no_allocator_ran_frees_the_devices_at_the_next_rebuild(bus: Bus):
    bus.tombstone_ttl = 1.0
    x, y, z = claim_event("x", gpus=4), claim_event("y", gpus=4), claim_event("z", gpus=4)
    first = Allocator(bus)
    await first.rebuild()
    for claim in (x, y, z):  # x and y fill the node; z fails
        await bus.publish(claim)
        await first.on_claim(claim)
    assert [type(e) for e in await decisions(bus)] == [ev.AllocationCommitted, ev.AllocationCommitted, ev.AllocationFailed]

    # The allocator is gone; x and z are deleted, and their deletes expire before one runs again.
    for claim in (x, z):
        await bus.publish(deleted(claim))
    await until_gone(bus, x)
    await until_gone(bus, z)

    successor = Allocator(bus)
    await successor.rebuild()
    assert set(successor.committed) == {"bench/y"}
    assert set(successor.engine.ledger.claims) == {"bench/y"}  # x's GPUs are free again
    released = {e.key: e.uid for e in (await decisions(bus))[3:] if isinstance(e, ev.AllocationReleased)}
    assert released == {"bench/x": x.claim.metadata.uid, "bench/z": z.claim.metadata.uid}

    w = claim_event("w", gpus=4)
    await bus.publish(w)
    await successor.on_claim(w)
    assert isinstance((await decisions(bus))[-1], ev.AllocationCommitted)
    assert set(successor.engine.ledger.claims) == {"bench/y", "bench/w"}

    again = Allocator(bus)  # the next rebuild has nothing more to release
    await again.rebuild()
    assert len(await decisions(bus)) == 6 and set(again.committed) == {"bench/y", "bench/w"}

    # The status writer, reading ALLOCATIONS in order, ends with the live claims only.
    kv = await bus.key_value("retention-status")
    sink = KVSink(kv)
    for event in await decisions(bus):
        await apply(sink, event)
    assert {(s.claim, s.state) for s in await read_all(kv)} == {("bench/y", "allocated"), ("bench/w", "allocated")}


async def test_the_rebuild_keeps_a_decision_it_cannot_prove_deleted(bus: Bus):
    bus.tombstone_ttl = 1.0
    x, y = claim_event("x", gpus=4), claim_event("y", gpus=4)
    first = Allocator(bus)
    await first.rebuild()
    await bus.publish(x)
    await first.on_claim(x)
    await first.on_claim(y)  # decided, never in CLAIMS (as if CLAIMS lost it): not proof of a delete
    successor = Allocator(bus)
    await successor.rebuild()
    before = await decisions(bus)
    assert len(before) == 2 and set(successor.committed) == {"bench/x", "bench/y"}  # y: decided just now

    # The rebuild's snapshot skips events stored after it: a claim updated meanwhile looked absent
    # there (its newer event replaced the one the snapshot held); it is live, not gone.
    await asyncio.sleep(1.2)  # both decisions older than the TTL
    assert await release_gone(successor, successor.book.gone(dict(successor.committed), present={"bench/y"})) == 0

    # CLAIMS purged, or recreated since the decisions (its storage lost): nothing is proven deleted.
    await jetstream(bus).purge_stream("CLAIMS")
    purged = Allocator(bus)
    await purged.rebuild()
    assert await decisions(bus) == before and set(purged.committed) == {"bench/x", "bench/y"}
    await jetstream(bus).delete_stream("CLAIMS")
    await bus.ensure_streams()
    await bus.publish(claim_event("new"))  # (not empty: the creation time is what keeps x and y)
    again = Allocator(bus)
    await again.rebuild()
    assert await decisions(bus) == before and set(again.committed) == {"bench/x", "bench/y"}


async def test_the_allocator_never_decides_a_claim_deleted_before_it_saw_it(bus: Bus):
    x, y = claim_event("x", gpus=4), claim_event("y", gpus=4)
    for event in (x, deleted(x), y):
        await bus.publish(event)
    allocator = Allocator(bus)
    await allocator.rebuild()
    stop = asyncio.Event()
    consumer = asyncio.create_task(bus.consume("CLAIMS", allocator.take_claim, stop, durable="allocator"))
    try:
        async with asyncio.timeout(10):
            while "bench/y" not in allocator.committed:
                await asyncio.sleep(0.05)
    finally:
        stop.set()
        await consumer
    # Only the delete of x was left in CLAIMS: no commit and release for it, just y's commit.
    assert [(type(e), e.key) for e in await decisions(bus)] == [(ev.AllocationCommitted, "bench/y")]


async def test_the_rebuild_releases_under_the_allocators_own_nats_user(monkeypatch, tmp_path):
    """infra/nats/auth.conf lets the allocator's user make the rebuild's checks (no permission
    violation, which would stall every rebuild until it timed out)."""
    from pathlib import Path

    from pipeline import NatsServer

    auth = Path(__file__).resolve().parents[2] / "infra" / "nats" / "auth.conf"
    (tmp_path / "auth.conf").write_text(auth.read_text())
    passwords = {f"DRALLOC_{s.upper()}_NATS_PASSWORD": f"secret-{s}" for s in ("discovery", "ingestor", "allocator", "statuswriter", "admin")}
    server = NatsServer(tmp_path, "include ./auth.conf\n", passwords)
    await server.start()
    try:
        monkeypatch.setenv("DRALLOC_TOMBSTONE_TTL", "1")
        monkeypatch.setenv("NATS_USER", "admin")
        monkeypatch.setenv("NATS_PASSWORD", "secret-admin")
        async with await Bus.connect(server.url, name="admin") as admin:
            await admin.ensure_streams()
            x = claim_event("x")
            await admin.publish(x)
            await admin.publish(ev.AllocationCommitted(claim=x.claim, node="n-0"))  # as an earlier allocator wrote it
            await admin.publish(claim_event("y"))  # (a live claim: CLAIMS is not empty)
            await admin.publish(deleted(x))
            await until_gone(admin, x)
            monkeypatch.setenv("NATS_USER", "allocator")
            monkeypatch.setenv("NATS_PASSWORD", "secret-allocator")
            async with await Bus.connect(server.url, name="allocator") as bus:
                allocator = Allocator(bus)
                async with asyncio.timeout(10):
                    await allocator.rebuild()
            assert [type(e) for e in await decisions(admin)] == [ev.AllocationCommitted, ev.AllocationReleased]
            assert not allocator.committed
    finally:
        await server.stop()
