"""`Bus.consume`'s `decode` (a consumer reads messages its own way) and `context` (no span made current
for a handler that carries no trace on, while nothing records), against a real nats-server."""

from __future__ import annotations

import asyncio

from opentelemetry import trace

from dralloc import telemetry
from dralloc.bus import MAX_IN_FLIGHT, Bus, decode_event
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ObjectMeta, ResourceClaim


def claim(name: str) -> ev.ClaimSubmitted:
    return ev.ClaimSubmitted(claim=ResourceClaim(metadata=ObjectMeta(name=name, namespace="team-a", uid=f"uid-{name}")))


async def consume_until(bus: Bus, count: int, **kwargs) -> list:
    """Consume CLAIMS with `kwargs` until `count` events were handled; (event, trace id current in the handler)."""
    seen: list = []

    async def handler(event) -> None:
        seen.append((event, trace.get_current_span().get_span_context().trace_id))

    stop = asyncio.Event()
    task = asyncio.create_task(bus.consume("CLAIMS", handler, stop, **{"durable": None, **kwargs}))
    try:
        async with asyncio.timeout(10):
            while len(seen) < count:
                await asyncio.sleep(0.02)
    finally:
        stop.set()
        await task
    return seen


async def dead_letter_reasons(bus: Bus) -> dict[str, str]:
    found: dict[str, str] = {}
    sub = await jetstream(bus).subscribe("dra.deadletter.>", stream="DEADLETTER", ordered_consumer=True)
    try:
        while True:
            msg = await sub.next_msg(timeout=0.5)
            found[msg.headers["Dralloc-Subject"]] = msg.headers["Dralloc-Reason"]
    except Exception:
        pass
    await sub.unsubscribe()
    return found


async def test_a_consumer_reads_with_its_own_decode_and_what_it_refuses_is_dead_lettered_with_its_reason(bus: Bus):
    await bus.publish(claim("kept"))
    await bus.publish(claim("refused"))
    await bus.publish(claim("after"))

    def names_only(stream: str, subject: str, data: bytes) -> str:
        event = decode_event(stream, subject, data)
        if event.claim.metadata.name == "refused":
            raise ev.EventDecodeError("this reader refuses it")
        return event.claim.metadata.name

    seen = await consume_until(bus, 2, decode=names_only)
    assert [name for name, _ in seen] == ["kept", "after"]  # the handler is given what decode returned
    assert (await dead_letter_reasons(bus)) == {"dra.claims.team-a.refused": "this reader refuses it"}


async def test_the_default_decode_refuses_an_event_stored_under_another_subject(bus: Bus):
    await jetstream(bus).publish("dra.claims.team-a.other", ev.encode(claim("named")))
    await bus.publish(claim("after"))
    seen = await consume_until(bus, 1)
    assert [event.claim.metadata.name for event, _ in seen] == ["after"]
    assert "names another object" in (await dead_letter_reasons(bus))["dra.claims.team-a.other"]


async def test_without_context_no_span_is_current_while_nothing_records_and_with_it_the_publishers_trace_is(bus: Bus):
    telemetry.setup("test")  # (a provider that records nothing, as every service has unless OTEL_* says otherwise)
    assert not telemetry.recording()
    await bus.publish(claim("a"))
    published = (await jetstream(bus).get_msg("CLAIMS", seq=1)).headers["traceparent"].split("-")[1]

    with_context = await consume_until(bus, 1)
    without = await consume_until(bus, 1, context=False)
    assert with_context[0][1] == int(published, 16)  # the handler continues the publisher's trace
    assert without[0][1] == 0  # nothing current: no span was made for it
    assert without[0][0] == with_context[0][0]


async def test_the_server_holds_back_no_earlier_than_the_consumers_own_limit_of_unacked_messages(bus: Bus):
    # JetStream's default max_ack_pending (1,000) is below MAX_IN_FLIGHT: it, not ours, was the limit in force
    await bus.publish(claim("a"))
    await consume_until(bus, 1, durable="limits")
    info = await jetstream(bus).consumer_info("CLAIMS", "limits")
    assert info.config.max_ack_pending == MAX_IN_FLIGHT
