"""An allocator term's start: its state rebuilt from the streams.

The current inventory (INVENTORY, last value per subject), the ledger (ALLOCATIONS: the last
decision per claim, from the leader's snapshot of live decisions and the messages after it, or the
whole stream without a usable one: snapshot_store.py; committed claims are restored into the engine)
and the claims still waiting (CLAIMS minus decided and deleted ones). A decision whose claim CLAIMS
no longer holds at all (deleted, and the delete expired before an allocator saw it) is released
then (`Decisions.gone`, `release_gone`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from dralloc.metrics import allocator_metrics
from dralloc.schemas import events as ev

if TYPE_CHECKING:
    from dralloc.allocator.shell import Allocator

log = logging.getLogger("dralloc.allocator")


async def rebuild(allocator: Allocator) -> int:
    """State from the streams; returns the INVENTORY sequence to follow from."""
    # The three streams are read at once (the waits on the server overlap) and applied in order:
    # inventory, decisions, claims. A decision stored meanwhile by anyone else fences this term's
    # first write off, whichever order the reads took.
    async with asyncio.TaskGroup() as reads:
        # (each checked with its stream's leader: a replica behind it would leave the term deciding
        # on decisions, slices or waiting claims it never read: `Bus.replay`, `leader_checked`)
        inventory_read = reads.create_task(allocator.bus.replay("INVENTORY", leader_checked=True))
        decisions_read = reads.create_task(allocator.snapshots.replay())  # the snapshot and the stream after it, or all of it
        claims_read = reads.create_task(allocator.bus.replay("CLAIMS", leader_checked=True))
    inventory, inventory_seq = inventory_read.result()
    for event in inventory:
        if (refused := allocator.book.apply_inventory(event)) is not None:
            log.error("allocator: rebuild: %s", refused)
    decisions, allocator.fence.last_seq = decisions_read.result()
    allocator_metrics().rebuilding()
    allocator_metrics().watch(allocator.observe_once, asyncio.get_running_loop())
    for event in decisions:
        allocator_metrics().decided(event, replayed=True)
        allocator.book.replayed(event)
    claims, _ = claims_read.result()
    for event in claims:
        allocator.book.replayed(event)
    if allocator.moves != "off":  # evictions asked for by an earlier term stay in flight (evicting.py)
        asked, _ = await allocator.bus.replay("ALLOCATIONS", "dra.allocations.*.*.evict")
        requests = [e for e in asked if isinstance(e, ev.EvictionRequested)]
        refusals = [e for e in claims if isinstance(e, ev.EvictionRefused)]  # (heard by an earlier term: not delivered again)
        allocator.book.evictions.replayed(allocator.book, requests, time.time(), refusals)
    released = await release_gone(allocator, allocator.book.gone())
    await allocator.reserve_waiting()  # the waits earlier terms began hold their nodes again, before any claim is decided
    log.info(
        "allocator: rebuilt %d inventory objects, %d allocations, %d waiting claims; released %d deleted long ago",
        len(inventory), len(allocator.committed), len(allocator.waiting), released,
    )  # fmt: skip
    return inventory_seq


async def release_gone(allocator: Allocator, releases: list[ev.AllocationReleased]) -> int:
    """Write the releases of claims deleted while no allocator saw it (`Decisions.gone`); returns how many.

    Each is checked first, so that no live claim's devices are ever taken from it:
    - CLAIMS holds nothing on the claim's subject now (the snapshot skips what came after it: a
      claim updated meanwhile looked absent there, its newer event replacing the one it held);
    - the decision is older than the tombstone TTL (its delete came after it, and has expired);
    - CLAIMS was created before the decision (not recreated empty since, e.g. its storage lost),
      and holds something (not purged: every claim deleted at once is not told from that).
    """
    if not releases:
        return 0
    claims = await allocator.bus.stream_state("CLAIMS")
    if claims.messages == 0:
        log.warning("allocator: CLAIMS is empty (purged?): %d decisions without a claim kept", len(releases))
        return 0
    claims_created = claims.created
    written = 0
    for release in releases:
        if await allocator.bus.last_message("CLAIMS", ev.ClaimDeleted(namespace=release.namespace, name=release.name).subject) is not None:
            continue
        decision = await allocator.bus.last_message("ALLOCATIONS", release.subject)
        decided = decision.time if decision is not None else None
        if decided is None or time.time() - decided.timestamp() < allocator.bus.tombstone_ttl:
            log.warning("allocator: %s is decided but not in CLAIMS, and decided recently: kept", release.key)
            continue
        if claims_created is not None and decided < claims_created:
            log.warning("allocator: %s is decided but not in CLAIMS, created since: kept", release.key)
            continue
        log.info("allocator: %s was deleted while no allocator saw it (its delete expired): releasing it", release.key)
        await allocator.release(release)
        written += 1
    return written
