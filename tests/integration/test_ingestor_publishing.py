"""The ingestor's pipelined publishing (`dralloc.ingestor.publishing`) against a real nats-server:
every event stored once and in order per subject, through a server restart too."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

from dralloc.bus import Bus, LocalServer
from dralloc.ingestor import service as ingestor
from dralloc.ingestor.publishing import WINDOW
from dralloc.manifest_events import SourceEvent
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ObjectMeta, ResourceClaim


def submitted(name: str, uid: str | None = None) -> ev.ClaimSubmitted:
    return ev.ClaimSubmitted(claim=ResourceClaim(metadata=ObjectMeta(name=name, namespace="team-a", uid=uid or f"uid-{name}", generation=1)))


def deleted(name: str, uid: str | None = None) -> ev.ClaimDeleted:
    return ev.ClaimDeleted(namespace="team-a", name=name, uid=uid or f"uid-{name}")


class ListSource:
    """A source yielding `events`, calling `between(i)` before the i-th."""

    def __init__(self, events: list[SourceEvent], between=None) -> None:
        self.items, self.between = events, between

    async def events(self, stop: asyncio.Event) -> AsyncIterator[SourceEvent]:
        for i, event in enumerate(self.items):
            if self.between is not None:
                await self.between(i)
            yield event


async def last_per_subject(bus: Bus) -> dict[str, ev.Event]:
    claims, _ = await bus.replay("CLAIMS")
    return {event.subject: event for event in claims}


async def test_a_subject_repeated_in_a_burst_ends_at_its_last_event(bus: Bus):
    await bus.ensure_streams()
    # Submitted, deleted and submitted again (the same uid and generation: the same Nats-Msg-Id as the
    # first, within the duplicate window) amid more claims than one window holds.
    burst: list[SourceEvent] = [submitted(f"c{i}") for i in range(WINDOW + 40)]
    burst[10:10] = [submitted("again"), deleted("again"), submitted("again")]
    burst.append(deleted("gone"))
    burst.insert(0, submitted("gone"))
    await ingestor.serve(bus, ingestor.Config(paths=["-"]), asyncio.Event(), source=ListSource(burst))

    last = await last_per_subject(bus)
    assert isinstance(last["dra.claims.team-a.again"], ev.ClaimSubmitted)  # news after a delete, not a duplicate
    assert "dra.claims.team-a.gone" not in last or isinstance(last["dra.claims.team-a.gone"], ev.ClaimDeleted)
    assert {f"dra.claims.team-a.c{i}" for i in range(WINDOW + 40)} <= set(last)
    # Published again: every event is a duplicate of what is stored, nothing new is stored.
    before = (await bus.stream_state("CLAIMS")).last_sequence
    await ingestor.serve(bus, ingestor.Config(paths=["-"]), asyncio.Event(), source=ListSource(burst[-5:]))
    assert (await bus.stream_state("CLAIMS")).last_sequence == before


async def test_every_event_is_stored_once_through_a_server_restart(tmp_path: Path):
    server = LocalServer(tmp_path)
    await server.start()
    try:
        bus = await Bus.connect(server.url, name="ingestor")
        try:
            await bus.ensure_streams()

            async def restart_midway(i: int) -> None:
                if i == 300:
                    await server.restart()  # events on their way are lost or stored; either way retried

            names = [f"c{i}" for i in range(600)]
            source = ListSource([submitted(n) for n in names], restart_midway)
            await asyncio.wait_for(ingestor.serve(bus, ingestor.Config(paths=["-"]), asyncio.Event(), source=source), 60)
            claims, _ = await bus.replay("CLAIMS")
            stored = [event.claim.metadata.name for event in claims]
            assert sorted(stored) == sorted(names)  # every one, none twice (one message per subject)
            assert (await bus.stream_state("CLAIMS")).last_sequence == len(names)  # and never stored twice
        finally:
            await bus.close()
    finally:
        await server.stop()
