"""Bus.scan, Bus.follow, Bus.subject_counts and Bus.stream_config against a real nats-server: a
stream's messages read once (a replay, `dralloc get`'s snapshot, the allocator's tail after its
snapshot) or as they arrive (`dralloc top`), nothing acked or kept; and what a stream holds."""

from __future__ import annotations

import asyncio

import pytest

from dralloc.bus import Bus, ReplicaBehind, StoredMessage
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev


def failed(name: str, generation: int) -> ev.AllocationFailed:
    return ev.AllocationFailed(namespace="ml", name=name, uid=f"uid-{name}", generation=generation, reason="unsatisfiable", message=f"try {generation}")


async def history(bus: Bus) -> list[tuple[str, int]]:
    """ALLOCATIONS (which keeps every decision): a1, b1, a2, c1, b2 at sequences 1 to 5."""
    for name, generation in (("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2)):
        await bus.publish(failed(name, generation))
    return [("a", 1), ("b", 1), ("a", 2), ("c", 1), ("b", 2)]


def decoded(messages: list[StoredMessage]) -> list[tuple[int, str, int]]:
    out = []
    for msg in messages:
        event = ev.decode(msg.data)
        assert isinstance(event, ev.AllocationFailed) and msg.subject == event.subject and msg.stream == "ALLOCATIONS"
        out.append((msg.sequence, event.name, event.generation))
    return out


async def test_a_scan_reads_every_message_in_order_or_the_last_per_subject(bus: Bus) -> None:
    await history(bus)
    every: list[StoredMessage] = []
    await bus.scan("ALLOCATIONS", every.append)
    assert decoded(every) == [(1, "a", 1), (2, "b", 1), (3, "a", 2), (4, "c", 1), (5, "b", 2)]
    assert all(msg.time is not None and msg.headers.get("Nats-Msg-Id") for msg in every)
    latest: list[StoredMessage] = []
    await bus.scan("ALLOCATIONS", latest.append, last_per_subject=True)
    assert decoded(latest) == [(3, "a", 2), (4, "c", 1), (5, "b", 2)]


async def test_a_scan_keeps_to_its_subjects_and_its_range(bus: Bus) -> None:
    await history(bus)
    seen: list[StoredMessage] = []
    await bus.scan("ALLOCATIONS", seen.append, subjects=[failed("b", 1).subject])
    assert decoded(seen) == [(2, "b", 1), (5, "b", 2)]
    seen.clear()
    await bus.scan("ALLOCATIONS", seen.append, start_seq=2, upto=4)  # the allocator's tail after a snapshot
    assert decoded(seen) == [(2, "b", 1), (3, "a", 2), (4, "c", 1)]
    seen.clear()
    await bus.scan("ALLOCATIONS", seen.append, last_per_subject=True, upto=4)  # a replay up to a snapshot's sequence
    assert decoded(seen) == [(3, "a", 2), (4, "c", 1)]  # b's last (5) is past it, and an earlier one is not its last


async def test_a_scan_of_an_empty_stream_returns_at_once(bus: Bus) -> None:
    seen: list[StoredMessage] = []
    await asyncio.wait_for(bus.scan("ALLOCATIONS", seen.append, last_per_subject=True), 10)
    assert seen == []


async def test_follow_delivers_only_what_comes_after_its_sequence_while_inside(bus: Bus) -> None:
    await history(bus)
    seen: list[StoredMessage] = []
    arrived = asyncio.Event()

    def take(msg: StoredMessage) -> None:
        seen.append(msg)
        if len(seen) == 3:
            arrived.set()

    async with bus.follow("ALLOCATIONS", take, after=4):
        await bus.publish(failed("d", 1))
        await bus.publish(failed("a", 3))
        await asyncio.wait_for(arrived.wait(), 10)
    assert decoded(seen) == [(5, "b", 2), (6, "d", 1), (7, "a", 3)]
    await bus.publish(failed("e", 1))  # after the block: not delivered
    await asyncio.sleep(0.5)
    assert len(seen) == 3


async def test_subject_counts_and_stream_config(bus: Bus) -> None:
    await history(bus)
    counts = await bus.subject_counts("ALLOCATIONS", "dra.allocations.ml.>")
    assert counts == {failed("a", 1).subject: 2, failed("b", 1).subject: 2, failed("c", 1).subject: 1}
    assert await bus.subject_counts("ALLOCATIONS", "dra.allocations.other.>") == {}
    config = await bus.stream_config("ALLOCATIONS")
    assert config.name == "ALLOCATIONS" and config.subjects == ["dra.allocations.>"]
    state = await bus.stream_state("ALLOCATIONS")
    assert state.messages == 5 and state.bytes > 5 * len(failed("a", 1).subject)


async def test_the_connection_as_the_bus_reports_it(bus: Bus) -> None:
    assert bus.is_connected and not bus.is_closed
    assert bus.max_payload >= 1024 * 1024  # nats-server's default is 1 MiB
    assert bus.connected_url is not None and bus.connected_url.startswith("nats://")
    answer = await bus.request("$JS.API.STREAM.NAMES", b"{}")
    assert b"ALLOCATIONS" in answer
    other = await Bus.connect(bus.connected_url, name="closing")
    await other.close()
    assert other.is_closed and not other.is_connected


async def test_a_bucket_is_read_whole_its_latest_values_and_no_deleted_or_purged_key(bus: Bus) -> None:
    from dralloc.bus import kv_items

    kv = await bus.key_value("read-whole", history=3)
    assert await kv_items(kv) == []
    for key, value in (("a", b"1"), ("b", b"1"), ("a", b"2"), ("c", b"1"), ("d", b"1"), ("e.f", b"1")):
        await kv.put(key, value)
    await kv.delete("b")
    await kv.purge("c")
    # every key with its last value, in the order the stream last wrote them; b and c are gone
    assert await kv_items(kv) == [("a", b"2"), ("d", b"1"), ("e.f", b"1")]
    await kv.put("b", b"again")
    assert sorted(await kv_items(kv)) == [("a", b"2"), ("b", b"again"), ("d", b"1"), ("e.f", b"1")]
    # read 50 at a time, 1,250 times in all: each read's consumer is gone when it returns (left to
    # expire, 1,000 of them made the server refuse the next consumer on the stream)
    for _ in range(25):
        reads = await asyncio.gather(*(kv_items(kv) for _ in range(50)))
        assert all(sorted(r) == [("a", b"2"), ("b", b"again"), ("d", b"1"), ("e.f", b"1")] for r in reads)
    assert (await bus.stream_state("KV_read-whole")).consumers == 0


async def test_first_after_is_the_next_message_the_leader_holds(bus: Bus) -> None:
    await bus.ensure_streams()
    await history(bus)  # a1 b1 a2 c1 b2 at 1-5
    assert [await bus.first_after("ALLOCATIONS", seq, 5) for seq in (0, 2, 4, 5)] == [1, 3, 5, None]
    assert await bus.first_after("ALLOCATIONS", 0, 5, failed("c", 1).subject) == 4  # on that subject only
    assert await bus.first_after("ALLOCATIONS", 4, 5, failed("c", 1).subject) is None
    await jetstream(bus).delete_msg("ALLOCATIONS", 4)
    assert await bus.first_after("ALLOCATIONS", 3, 5) == 5  # (a deleted message is not held)
    assert await bus.first_after("ALLOCATIONS", 0, 3) == 1 and await bus.first_after("ALLOCATIONS", 3, 3) is None  # not past `upto`
    with pytest.raises(ValueError, match="up to a sequence"):  # (nothing to check a read against)
        await bus.scan("ALLOCATIONS", print, leader_checked=True)


def lagging(monkeypatch, holds: int, reads: int) -> list[int]:
    """Make the first `reads` scans' consumers deliver only sequences up to `holds` (a consumer on
    a replica behind its leader); returns the list counting the scans made."""
    from dralloc.bus import read

    real, scans = read.scan_js, []

    async def scan_js(js, stream: str, on_message, **options) -> None:
        scans.append(1)
        behind = len(scans) <= reads
        await real(js, stream, lambda msg: None if behind and msg.sequence > holds else on_message(msg), **options)

    monkeypatch.setattr(read, "scan_js", scan_js)
    return scans


async def test_a_replay_checked_with_the_leader_reads_again_when_a_replica_was_behind(bus: Bus, monkeypatch) -> None:
    from dralloc.bus import replay

    monkeypatch.setattr(replay, "READ_AGAIN_S", 0.01)
    await bus.ensure_streams()
    await history(bus)
    scans = lagging(monkeypatch, holds=3, reads=1)
    events, last = await bus.replay("ALLOCATIONS", leader_checked=True)
    assert [(e.name, e.generation) for e in events] == [("a", 2), ("c", 1), ("b", 2)] and last == 5
    assert len(scans) == 2  # read again once
    # Behind at every read: refused, never a short answer with the leader's sequence.
    lagging(monkeypatch, holds=3, reads=100)
    with pytest.raises(ReplicaBehind, match="read to sequence 3, its leader holds 4"):
        await bus.replay("ALLOCATIONS", leader_checked=True)
    # Unchecked (a reader that neither fences nor follows from the sequence): what was delivered
    # (here the subjects' last messages up to 3: a2).
    events, last = await bus.replay("ALLOCATIONS")
    assert [(e.name, e.generation) for e in events] == [("a", 2)] and last == 5


async def test_a_checked_replay_of_a_stream_whose_last_messages_were_deleted_is_complete(bus: Bus) -> None:
    await bus.ensure_streams()
    await history(bus)
    for seq in (4, 5):
        await jetstream(bus).delete_msg("ALLOCATIONS", seq)
    events, last = await bus.replay("ALLOCATIONS", leader_checked=True)  # nothing after 3 is held: no second read, no refusal
    assert [(e.name, e.generation) for e in events] == [("b", 1), ("a", 2)] and last == 5
