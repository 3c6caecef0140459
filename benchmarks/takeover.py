"""`dralloc bench takeover --decisions N`: how long a standby takes to rebuild after N decisions.

A real nats-server (`embedded_nats`) with the project's streams, DeviceClasses
and a fleet of H100 nodes. A first allocator decides `live` claims (they stay
allocated, their ClaimSubmitted in CLAIMS). The rest of the N decisions are
history as a leader writes it: claims committed and later released (deleted
long ago), a commit and a release each, written to ALLOCATIONS pipelined.

Measured (`takeover_seconds`): a fresh `Allocator`'s `rebuild()`, the state a
standby must have before it decides its first claim in a new term (INVENTORY,
ALLOCATIONS and CLAIMS replayed, the engine loaded, the ledger restored). The
lease wait before it (`DRALLOC_ALLOCATOR_LEASE_TTL`, 2 s in the pipeline
bench) is a constant and not included. The rebuilt state is checked: every
live claim is restored, nothing else (`restored_live`, `restored_other`).
"""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
from pipeline import CLASSES, claim_event

from dralloc.allocator.service import Allocator
from dralloc.bus import Bus, embedded_nats
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev

PIPELINE = 2000
"""Publishes in flight at once while the history is written."""


async def _publish_all(bus: Bus, events: list[ev.Event]) -> None:
    for start in range(0, len(events), PIPELINE):
        acks = [await bus.send(event, timeout=60.0) for event in events[start : start + PIPELINE]]
        await asyncio.gather(*acks)


def _history(template: ev.AllocationCommitted, pairs: int, start: int) -> list[ev.Event]:
    """`pairs` claims committed (the template's allocation) then released, in that order per claim."""
    events: list[ev.Event] = []
    for k in range(start, start + pairs):
        name, uid = f"gone-{k:07d}", str(uuid.uuid4())
        meta = msgspec.structs.replace(template.claim.metadata, name=name, uid=uid)
        claim = msgspec.structs.replace(template.claim, metadata=meta)
        events.append(ev.AllocationCommitted(claim=claim, node=template.node))
        events.append(ev.AllocationReleased(namespace=meta.namespace or "default", name=name, uid=uid, allocation=claim.status.allocation))
    return events


async def run(decisions: int, *, live: int = 1000, nodes: int = 125) -> dict:
    """Write `decisions` decisions (`live` of them claims still allocated), then time a standby's rebuild."""
    if decisions < live:
        live = decisions
    async with embedded_nats() as url, await Bus.connect(url, name="bench-takeover") as bus:
        await bus.ensure_streams()
        for event in events_from_manifests(load_paths([str(CLASSES)]), print):
            await bus.publish(event)
        for _, slices in build_fleet([{"profile": "h100-sxm", "count": nodes, "prefix": "node"}]):
            for slice_ in slices:
                await bus.publish(ev.ResourceSlicePublished(slice=slice_))
        first = Allocator(bus)
        await first.rebuild()
        for i in range(live):
            claim = claim_event(f"live-{i:05d}")
            await bus.publish(claim)
            await first.on_claim(claim)
        if first.tail is not None:
            await first.tail  # every decision stored
        template = next(iter(first.committed.values()), None)
        written_started = time.perf_counter()
        pairs = (decisions - live) // 2
        if pairs and template is None:
            raise RuntimeError("no live claim was committed: nothing to copy the history from")
        for start in range(0, pairs, 50_000):  # a chunk at a time: the events of a million decisions do not sit in memory
            await _publish_all(bus, _history(template, min(50_000, pairs - start), start))
        write_s = time.perf_counter() - written_started
        info = (await bus.js.stream_info("ALLOCATIONS")).state

        standby = Allocator(bus)
        started = time.perf_counter()
        await standby.rebuild()
        takeover = time.perf_counter() - started
        restored = set(standby.engine.ledger.claims)
        live_keys = {key for key in restored if key.split("/", 1)[1].startswith("live-")}
        return {
            "decisions": info.messages,
            "live_claims": live,
            "history_claims": pairs,
            "nodes": nodes,
            "allocations_stream_messages": info.messages,
            "allocations_stream_mb": round(info.bytes / 2**20, 1),
            "write_history_s": round(write_s, 2),
            "takeover_seconds": round(takeover, 3),
            "restored_live": len(live_keys),
            "restored_other": len(restored - live_keys),
        }

