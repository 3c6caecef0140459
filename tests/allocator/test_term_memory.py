"""A term's engine is freed when the term ends (#17 item 4). Each term freezes its loaded engine
out of the cyclic collector's sight (engine/memory.py) and an engine is cyclic, so before
`Collector.collect` at term end a process that lost and won the lease again kept every earlier term's engine: a
fleet's worth of memory per term. Real nats-server, the allocator service in-process, the lease
taken from it by another holder as a rival allocator would."""

from __future__ import annotations

import asyncio
import gc
import weakref

import pytest

from dralloc.allocator import leader, service
from dralloc.allocator.config import Config
from dralloc.bus import Bus


class Recorded(service.Allocator):
    """The service's Allocator, each term's kept (weakly) with its engine."""

    terms: list[tuple[weakref.ref, weakref.ref]] = []

    def __init__(self, *args, **kwargs) -> None:  # noqa: ANN002, ANN003 - the Allocator's own
        super().__init__(*args, **kwargs)
        Recorded.terms.append((weakref.ref(self), weakref.ref(self.engine)))


@pytest.mark.interpreted  # (a compiled Engine takes no weak reference)
async def test_a_new_term_does_not_keep_the_previous_terms_engine(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(service, "Allocator", Recorded)
    Recorded.terms = []
    stop = asyncio.Event()
    task = asyncio.create_task(service.serve(bus, Config(lease_ttl=1.0), stop))
    try:
        async with asyncio.timeout(30):  # the first term has rebuilt and frozen its engine
            while not (Recorded.terms and gc.get_freeze_count()):
                await asyncio.sleep(0.02)
        first_allocator, first_engine = Recorded.terms[0]
        assert first_engine() is not None
        kv = await bus.key_value(leader.BUCKET)
        entry = await kv.get(leader.KEY)
        await kv.update(leader.KEY, b"rival", last=entry.revision)  # deposed: the term ends; the rival then goes silent
        async with asyncio.timeout(30):  # a second term: the lease taken back once the rival's ttl is over
            while len(Recorded.terms) < 2 or not gc.get_freeze_count():
                await asyncio.sleep(0.02)
        assert first_allocator() is None and first_engine() is None
        assert Recorded.terms[1][1]() is not None  # (the live term's engine, of course, is kept)
    finally:
        stop.set()
        await task
