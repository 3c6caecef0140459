"""`dralloc bench takeover --decisions N`: how long a standby takes to rebuild after N decisions.

A real nats-server (`embedded_nats`) with the project's streams, DeviceClasses
and a fleet of H100 nodes. A first allocator (the leader) decides `live` claims
(they stay allocated, their ClaimSubmitted in CLAIMS). The rest of the N
decisions are history as a leader writes it: claims committed and later
released (deleted long ago), a commit and a release each, written to
ALLOCATIONS pipelined, `PIPELINE` in flight, each stored write handed to the
leader's compacted record (`Snapshots.stored`) as its own writes are.

The leader writes its snapshot of live decisions (`snapshot_store.py`) `tail`
decisions before the end: by default `Policy.most_unsnapshotted`, the most the
leader's count trigger leaves unsnapshotted, so the standby replays the longest tail
the policy allows (`--tail 0`: a clean handover; `--no-snapshot`: none, the
whole stream is replayed, as before snapshots).

Measured (`takeover_seconds`): a fresh `Allocator`'s `rebuild()`, the state a
standby must have before it decides its first claim in a new term (INVENTORY,
the snapshot and the ALLOCATIONS after it, CLAIMS, the engine loaded, the
ledger restored). The lease wait before it (`DRALLOC_ALLOCATOR_LEASE_TTL`, 2 s
in the pipeline bench) is a constant and not included. The rebuilt state is
checked: every live claim is restored, nothing else (`restored_live`,
`restored_other`); `loaded_from` says whether the snapshot was used.
"""

from __future__ import annotations

import asyncio
import time
import uuid

import msgspec
from pipeline import CLASSES, claim_event

from dralloc.allocator.service import Allocator, Config
from dralloc.bus import Bus, PubAck, embedded_nats
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev

PIPELINE = 4000
"""Publishes in flight at once while the history is written."""
CHUNK = 20_000
"""History pairs made at a time: the events of a million decisions do not sit in memory."""


def _history(template: ev.AllocationCommitted, pairs: int, start: int) -> list[ev.AllocationEvent]:
    """`pairs` claims committed (the template's allocation) then released, in that order per claim."""
    events: list[ev.AllocationEvent] = []
    claim, meta = template.claim, template.claim.metadata
    allocation = claim.status.allocation if claim.status is not None else None
    for k in range(start, start + pairs):
        name, uid = f"gone-{k:07d}", str(uuid.uuid4())
        copy = msgspec.structs.replace(claim, metadata=msgspec.structs.replace(meta, name=name, uid=uid))
        events.append(ev.AllocationCommitted(claim=copy, node=template.node))
        events.append(ev.AllocationReleased(namespace=meta.namespace or "default", name=name, uid=uid, allocation=allocation))
    return events


async def _write(bus: Bus, leader: Allocator, events: list[ev.AllocationEvent], first: int) -> None:
    """Write `events` pipelined (`first`: the index of the first one in the whole history, for its
    message id); each stored write goes to the leader's compacted record, as the leader's own do."""

    async def stored(ack: asyncio.Future[PubAck], event: ev.AllocationEvent) -> None:
        leader.snapshots.stored((await ack).seq, (event,))

    for start in range(0, len(events), PIPELINE):
        pending = []
        for i, event in enumerate(events[start : start + PIPELINE], start=first + start):
            ack = await bus.send_bytes(event.subject, ev.encode(event), headers={"Nats-Msg-Id": f"history:{i}"}, timeout=60.0)
            pending.append(stored(ack, event))
        await asyncio.gather(*pending)


async def run(decisions: int, *, live: int = 1000, nodes: int = 125, tail: int | None = None, snapshot: bool = True) -> dict:
    """Write `decisions` decisions (`live` of them claims still allocated; the leader's last snapshot
    `tail` decisions before the end), then time a standby's rebuild."""
    live = min(live, decisions)
    policy = Config.from_env().snapshot  # (DRALLOC_ALLOCATOR_SNAPSHOT_EVERY)
    tail = policy.most_unsnapshotted(live) if tail is None else tail
    async with embedded_nats() as url, await Bus.connect(url, name="bench-takeover") as bus:
        await bus.ensure_streams()
        for event in events_from_manifests(load_paths([str(CLASSES)]), print):
            await bus.publish(event)
        for _, slices in build_fleet([{"profile": "h100-sxm", "count": nodes, "prefix": "node"}]):
            for slice_ in slices:
                await bus.publish(ev.ResourceSlicePublished(slice=slice_))
        leader = Allocator(bus, snapshot=policy)
        await leader.rebuild()
        for i in range(live):
            claim = claim_event(f"live-{i:05d}")
            await bus.publish(claim)
            await leader.on_claim(claim)
        if leader.tail is not None:
            await leader.tail  # every decision stored
        template = next(iter(leader.committed.values()), None)
        written_started = time.perf_counter()
        pairs = (decisions - live) // 2
        if template is None:
            if pairs:
                raise RuntimeError("no live claim was committed: nothing to copy the history from")
            pairs = 0
        history = 2 * pairs
        snapshot_at = max(0, history - tail)  # history events written before the leader's last snapshot
        snapshot_s = None
        for start in range(0, pairs, CHUNK):
            assert template is not None  # (pairs is 0 without one)
            events = _history(template, min(CHUNK, pairs - start), start)
            first = 2 * start
            cut = min(max(snapshot_at - first, 0), len(events))
            if snapshot and snapshot_s is None and first + cut == snapshot_at:
                await _write(bus, leader, events[:cut], first)
                began = time.perf_counter()
                await leader.snapshots.write()
                snapshot_s = time.perf_counter() - began
                await _write(bus, leader, events[cut:], first + cut)
            else:
                await _write(bus, leader, events, first)
        if snapshot and snapshot_s is None:  # (no history: the snapshot covers the live claims)
            began = time.perf_counter()
            await leader.snapshots.write()
            snapshot_s = time.perf_counter() - began
        write_s = time.perf_counter() - written_started
        info = await bus.stream_state("ALLOCATIONS")

        standby = Allocator(bus)
        started, cpu = time.perf_counter(), time.process_time()
        await standby.rebuild()
        takeover, cpu = time.perf_counter() - started, time.process_time() - cpu
        restored = set(standby.engine.ledger.claims)
        live_keys = {key for key in restored if key.split("/", 1)[1].startswith("live-")}
        head = leader.snapshots.head
        return {
            "decisions": info.messages,
            "live_claims": live,
            "history_claims": pairs,
            "nodes": nodes,
            "allocations_stream_messages": info.messages,
            "allocations_stream_mb": round(info.bytes / 2**20, 1),
            "write_history_s": round(write_s, 2),
            "loaded_from": standby.snapshots.loaded_from,
            "snapshot_seq": head.seq if head is not None and snapshot else None,
            "snapshot_bytes": head.size if head is not None and snapshot else None,
            "snapshot_write_s": round(snapshot_s, 3) if snapshot_s is not None else None,
            "tail_messages": standby.snapshots.tail_messages if standby.snapshots.loaded_from == "snapshot" else info.messages,
            "takeover_seconds": round(takeover, 3),
            "takeover_cpu_s": round(cpu, 3),  # (this process's: the wall clock counts others' work on a shared machine)
            "restored_live": len(live_keys),
            "restored_other": len(restored - live_keys),
        }
