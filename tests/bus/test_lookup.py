"""Bus.last_message and Bus.stream_state against a real nats-server: what a stream holds, read
without consuming (the allocator's release checks and `dralloc submit --wait` use them)."""

from __future__ import annotations

from datetime import UTC, datetime

from dralloc.bus import Bus
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ObjectMeta, ResourceClaim


def submitted(name: str, generation: int = 1) -> ev.ClaimSubmitted:
    meta = ObjectMeta(name=name, namespace="team-a", uid=f"uid-{name}", generation=generation)
    return ev.ClaimSubmitted(claim=ResourceClaim(metadata=meta))


async def test_the_last_message_on_a_subject_or_none(bus: Bus) -> None:
    first, second = submitted("a", 1), submitted("a", 2)
    assert await bus.last_message("CLAIMS", first.subject) is None  # nothing stored yet: None, not an error
    before = datetime.now(UTC).replace(microsecond=0)
    await bus.publish(first)
    ack = await bus.publish(second)
    await bus.publish(submitted("b"))  # another subject: not what is asked for
    stored = await bus.last_message("CLAIMS", first.subject)
    assert stored is not None
    assert (stored.stream, stored.sequence, stored.subject) == ("CLAIMS", ack.seq, first.subject)
    assert ev.decode(stored.data) == second
    assert stored.headers["Nats-Msg-Id"] == second.msg_id
    assert stored.time is not None and before <= stored.time <= datetime.now(UTC)


async def test_a_streams_state(bus: Bus) -> None:
    empty = await bus.stream_state("CLAIMS")
    assert (empty.messages, empty.last_sequence) == (0, 0)
    assert empty.created is not None and empty.created <= datetime.now(UTC)
    for name in ("a", "b", "c"):
        await bus.publish(submitted(name))
    await bus.publish(submitted("a", 2))  # CLAIMS keeps the latest per claim: still three
    state = await bus.stream_state("CLAIMS")
    assert (state.messages, state.first_sequence, state.last_sequence) == (3, 2, 4)
    assert state.created == empty.created
