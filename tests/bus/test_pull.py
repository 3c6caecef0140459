"""Pulling from a JetStream consumer (`dralloc.bus.pull.Puller`) against a real nats-server: what
arrived is handed out at once, one request stays open across fetches, and a stop hands back what
the open request still delivers."""

from __future__ import annotations

import time

from dralloc.bus import AckPolicy, Bus, ConsumerConfig
from dralloc.bus.pull import Puller
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ObjectMeta, ResourceClaim


def claim(name: str) -> ev.ClaimSubmitted:
    return ev.ClaimSubmitted(claim=ResourceClaim(metadata=ObjectMeta(name=name, namespace="team-a", uid=f"uid-{name}")))


async def subscribe(bus: Bus, durable: str = "puller"):
    config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0, max_deliver=5)
    return await jetstream(bus).pull_subscribe("", durable=durable, stream="CLAIMS", config=config)


def names(messages) -> list[str]:
    return [ev.decode(m.data).claim.metadata.name for m in messages]


async def test_what_arrived_is_handed_out_and_the_request_stays_open(bus: Bus):
    await bus.ensure_streams()
    for name in ("a", "b", "c"):
        await bus.publish(claim(name))
    puller = Puller(await subscribe(bus), batch=100, wait=30.0)

    # Three of the hundred asked for: each fetch hands out what has arrived (all three, or the first
    # when the server's later deliveries are still on the way), and the one request stays open for the
    # rest (nats-py's fetch would hold them until a hundred came or the 30 s were over).
    first = await puller.fetch()
    assert first
    while len(first) < 3:
        more = await puller.fetch()
        assert more
        first += more
    assert names(first) == ["a", "b", "c"]
    assert puller.open == 97  # one request delivered all three: none was renewed
    assert time.monotonic() < puller.ends_at  # handed out while that request is still open

    await bus.publish(claim("d"))
    second = await puller.fetch()  # delivered on the open request: no new one sent
    assert names(second) == ["d"]
    assert puller.open == 96
    for msg in first + second:
        await msg.ack()


async def test_a_request_is_renewed_once_it_has_delivered_its_batch(bus: Bus):
    await bus.ensure_streams()
    for i in range(5):
        await bus.publish(claim(f"c{i}"))
    puller = Puller(await subscribe(bus), batch=2, wait=30.0)
    got = []
    while len(got) < 5:
        batch = await puller.fetch()
        assert len(batch) <= 2
        got += batch
    assert names(got) == [f"c{i}" for i in range(5)]
    for msg in got:
        await msg.ack()


async def test_a_stop_hands_back_what_the_open_request_still_delivers(bus: Bus):
    await bus.ensure_streams()
    await bus.publish(claim("early"))
    sub = await subscribe(bus)
    puller = Puller(sub, batch=10, wait=1.0)
    (early,) = await puller.fetch()
    await early.ack()
    await bus.publish(claim("late"))  # delivered on the open request after the last fetch
    await puller.close()  # the request ends (1 s); what it delivered is handed back, not stranded
    assert puller.open == 0
    await sub.unsubscribe()

    again = Puller(await subscribe(bus), batch=10, wait=5.0)
    (late,) = await again.fetch()  # at once, not after the 30 s ack wait
    assert names([late]) == ["late"]
    assert late.metadata.num_delivered == 2
    await late.ack()
