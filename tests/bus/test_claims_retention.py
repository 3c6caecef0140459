"""CLAIMS holds the live claims and the recent deletes, not every claim ever seen (real nats-server)."""

from __future__ import annotations

import asyncio
import dataclasses

import msgspec

from dralloc.bus import STREAMS, Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim


def submitted(name: str, generation: int = 1) -> ev.ClaimSubmitted:
    claim = msgspec.convert(
        {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": generation}, "spec": {"devices": {}}},
        ResourceClaim,
    )
    return ev.ClaimSubmitted(claim=claim)


def deleted(name: str) -> ev.ClaimDeleted:
    return ev.ClaimDeleted(namespace="ml", name=name, uid=f"uid-{name}")


async def send_all(bus: Bus, events: list[ev.Event]) -> None:
    acks = [await bus.send(event) for event in events]
    await asyncio.gather(*acks)


async def claims_stored(bus: Bus) -> int:
    return (await bus.stream_state("CLAIMS")).messages


async def until_stored(bus: Bus, count: int, within: float = 15.0) -> None:
    """Wait (up to `within` s) until CLAIMS holds `count` messages (expired deletes are swept by the server)."""
    async with asyncio.timeout(within):
        while await claims_stored(bus) != count:
            await asyncio.sleep(0.2)


async def test_a_rebuild_reads_the_live_claims_and_the_unexpired_deletes_only(bus: Bus):
    bus.tombstone_ttl = 2.0
    names = [f"c{i}" for i in range(2000)]
    await send_all(bus, [submitted(n) for n in names])
    await send_all(bus, [submitted("c0", generation=2), submitted("c1", generation=2)])  # updated claims
    await send_all(bus, [deleted(n) for n in names[100:]])  # 1,900 deleted, 100 live

    assert await claims_stored(bus) == 2000  # one per claim: 100 live, 1,900 deletes (not 3,902)
    events, last_seq = await bus.replay("CLAIMS")
    assert last_seq == 3902
    assert sum(isinstance(e, ev.ClaimDeleted) for e in events) == 1900
    live = {e.claim.key: e.claim.metadata.generation for e in events if isinstance(e, ev.ClaimSubmitted)}
    assert len(live) == 100 and live["ml/c0"] == 2 and live["ml/c2"] == 1

    await until_stored(bus, 100)  # the deletes expired
    events, _ = await bus.replay("CLAIMS")
    assert sorted(e.claim.key for e in events if isinstance(e, ev.ClaimSubmitted)) == sorted(f"ml/{n}" for n in names[:100])
    assert len(events) == 100


async def test_a_replay_ends_when_the_deletes_it_counted_expire_before_it_reads_them(bus: Bus, monkeypatch):
    bus.tombstone_ttl = 1.0
    await send_all(bus, [submitted("live"), *(deleted(f"d{i}") for i in range(600))])
    subscribe = jetstream(bus).pull_subscribe

    async def subscribe_slowly(*args, **kwargs):
        sub = await subscribe(*args, **kwargs)
        fetch, calls = sub.fetch, 0

        async def fetch_slowly(*a, **k):
            nonlocal calls
            calls += 1
            if calls == 2:  # the first batch read (512 of 601), the rest expires meanwhile
                await until_stored(bus, 1)
            return await fetch(*a, **k)

        sub.fetch = fetch_slowly
        return sub

    monkeypatch.setattr(jetstream(bus), "pull_subscribe", subscribe_slowly)
    events, _ = await bus.replay("CLAIMS")
    assert len(events) == 512 and isinstance(events[0], ev.ClaimSubmitted)


async def test_only_a_delete_carries_a_ttl(bus: Bus):
    await bus.publish(submitted("a"))
    await bus.publish(deleted("b"))
    live = await jetstream(bus).get_last_msg("CLAIMS", submitted("a").subject)
    gone = await jetstream(bus).get_last_msg("CLAIMS", deleted("b").subject)
    assert "Nats-TTL" not in (live.headers or {})
    assert gone.headers and gone.headers["Nats-TTL"] == "86400s"  # the default: a day


async def test_an_existing_claims_stream_with_history_is_upgraded_in_place(nats_url: str):
    async with await Bus.connect(nats_url, name="old") as bus:
        bus.tombstone_ttl = 1.0
        older = dataclasses.replace(STREAMS["CLAIMS"], max_msgs_per_subject=-1, allow_msg_ttl=None)  # as an older version made it
        await jetstream(bus).add_stream(older)
        for event in [submitted("a"), submitted("a", 2), submitted("b"), deleted("b"), submitted("c")]:
            await jetstream(bus).publish(event.subject, ev.encode(event))  # as an older version wrote them: no TTL
        before, _ = await bus.replay("CLAIMS")
        assert await claims_stored(bus) == 5

        await bus.ensure_streams()
        info = await jetstream(bus).stream_info("CLAIMS")
        assert info.config.max_msgs_per_subject == 1 and info.config.allow_msg_ttl
        assert info.state.messages == 3  # the history is trimmed at once to the latest per claim
        after, _ = await bus.replay("CLAIMS")
        assert after == before  # what every reader reads is unchanged

        await bus.publish(deleted("c"))  # a new delete expires
        await until_stored(bus, 2)
        assert [type(e) for e in (await bus.replay("CLAIMS"))[0]] == [ev.ClaimSubmitted, ev.ClaimDeleted]


async def test_a_tombstone_ttl_that_is_not_a_number_is_a_clear_error(nats_url: str, monkeypatch):
    from dralloc.bus import BusError

    monkeypatch.setenv("DRALLOC_TOMBSTONE_TTL", "a day")
    try:
        await Bus.connect(nats_url)
    except BusError as exc:
        assert "DRALLOC_TOMBSTONE_TTL='a day': not a number of seconds" in str(exc)
    else:
        raise AssertionError("connected with a bad DRALLOC_TOMBSTONE_TTL")
