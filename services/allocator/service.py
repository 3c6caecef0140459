"""The allocator service: the only writer of allocation decisions; a thin shell over the engine.

    dralloc run allocator

Several allocator processes may run: one leads (the lease in `dralloc.allocator.leader`), the others
wait as standbys and take over, from the streams, within ``lease_ttl`` seconds of the leader going
silent. Each term (`_lead`) rebuilds its state from the streams (rebuild.py), then follows
INVENTORY with an ephemeral consumer and CLAIMS with the durable consumer ``allocator``, handing
their events to the `Allocator` (shell.py: claims in, decisions out); it retries waiting claims
(retry.py) and writes the snapshot of live decisions now and then (snapshot_store.py). Every
decision is written behind the fence (fence.py): a refused write ends the term, and the next term
(this process or another) rebuilds from the streams.

The parts: config.py (settings), shell.py (the Allocator), intake.py (claims taken, decided in
batches), fence.py (fenced, pipelined writes), rebuild.py, retry.py, decisions.py (the book: what
to decide, pure), reservations.py, leader.py (the lease), snapshot.py / snapshot_store.py.

Environment: ``DRALLOC_ALLOCATOR_ACK_WAIT`` (seconds), ``DRALLOC_ALLOCATOR_MAX_DELIVER``,
``DRALLOC_ALLOCATOR_LEASE_TTL`` (seconds, default 3), ``DRALLOC_ALLOCATOR_SNAPSHOT_EVERY`` (decisions between
snapshots, at least; default 1000), ``DRALLOC_ALLOCATOR_MAX_WAIT`` (how long a
large waiting claim or gang holds a reservation unless its ``dralloc.dev/max-wait`` says; "600",
"10m"; default 0: only claims that say so; reservations.py), ``DRALLOC_CEL_BUDGET`` (cost units a claim's
selector evaluations may spend, default 5,000,000; engine.py), ``DRALLOC_CEL_BUDGET_SECONDS``
(CPU seconds of the engine thread they may take, default 2: time spent waiting for a busy CPU does not count),
``DRALLOC_ALLOCATOR_KEEP_WHOLE`` (whole nodes kept for large claims per unit of recent large demand, 0 to 10;
default 0: off; engine/keep_whole.py), ``DRALLOC_ALLOCATOR_MOVES`` (``off``, the default; ``when-refused``:
a large claim or gang whose wait is over gets room by moving small claims; ``early``: as soon as it waits; moving.py).
"""

from __future__ import annotations

import asyncio
import gc
import logging
import time

from dralloc.allocator import leader
from dralloc.allocator.catchup import InventoryMark
from dralloc.allocator.config import Config
from dralloc.allocator.engine import Engine, compiled
from dralloc.allocator.engine.memory import Collector
from dralloc.allocator.fence import Fenced
from dralloc.allocator.shell import Allocator
from dralloc.bus import Bus, report_lag

__all__ = ["Allocator", "Config", "Fenced", "serve"]
"""The service's public face: `dralloc run allocator` uses `Config` and `serve`; tests drive `Allocator`."""

log = logging.getLogger("dralloc.allocator")


async def serve(bus: Bus, config: Config, stop: asyncio.Event, *, engine: Engine | None = None) -> None:
    """Wait for the leader lease, lead until it is lost or a write is fenced off, and again; resign on stop."""
    lease = leader.Lease(await bus.key_value(leader.BUCKET), ttl=config.lease_ttl)
    log.info("allocator: engine %s", "compiled (the native build)" if compiled() else "interpreted")
    collector = Collector()  # the process's collector policy, across its terms
    try:
        while await lease.acquire(stop):
            # The CEL time budget on the engine thread's own CPU clock, not the wall clock: a starved
            # allocator (a busy machine) must not fail good claims for time it spent waiting to run.
            engine = engine or Engine(cel_budget=config.cel_budget, cel_seconds=(time.thread_time, config.cel_seconds), keep_whole=config.keep_whole)
            allocator = Allocator(bus, engine, lease=lease, max_wait=config.max_wait, snapshot=config.snapshot, moves=config.moves, collector=collector)
            engine = None  # a later term rebuilds a fresh engine from the streams
            try:
                await _lead(bus, config, stop, allocator, collector)
            except Exception as exc:  # NATS went away mid-term, or a refused write: the next term rebuilds
                log.warning("allocator: term of epoch %d ended: %s", lease.epoch, exc)
                await asyncio.sleep(0.2)
            else:
                log.info("allocator: term of epoch %d ended", lease.epoch)
            del allocator  # the term's engine is garbage now, but frozen (cyclic: only the collector frees it)
            if not stop.is_set():  # (on the way out the process's end frees it)
                collector.collect()
    finally:
        await lease.resign()


async def _lead(bus: Bus, config: Config, stop: asyncio.Event, allocator: Allocator, collector: Collector) -> None:
    """One term: rebuild from the streams, then decide until `stop` or the term ends."""
    term = allocator.term
    assert allocator.lease is not None
    async with asyncio.TaskGroup() as tasks:
        tasks.create_task(allocator.lease.keep(term))  # renewing already while the rebuild runs
        tasks.create_task(report_lag(bus, "CLAIMS", "allocator", term))
        tasks.create_task(_end_term_on(stop, term))
        tasks.create_task(_interrupt_on(term, allocator))
        gc.disable()  # the rebuild makes the fleet's objects: collections meanwhile only walk them again
        try:
            inventory_seq = await allocator.rebuild()
        finally:
            gc.enable()
        collector.loaded()
        allocator.inventory_mark = mark = InventoryMark(inventory_seq)
        tasks.create_task(
            bus.consume("INVENTORY", allocator.on_inventory, term, durable=None, name="allocator-inventory", start_seq=inventory_seq + 1, seen=mark.read)
        )
        tasks.create_task(allocator.retry_waiting(term, config.retry_after))
        tasks.create_task(allocator.warm_engine(term))
        tasks.create_task(allocator.snapshots.keep(term, lambda: allocator.lease is not None and allocator.lease.held, final=stop.is_set))
        if allocator.waiting:
            allocator.room_changed.set()  # claims left waiting by a previous term: try them now
        tasks.create_task(bus.consume("CLAIMS", allocator.take_claim, term, durable="allocator", ack_wait=config.ack_wait, max_deliver=config.max_deliver))


async def _interrupt_on(term: asyncio.Event, allocator: Allocator) -> None:
    """When the term ends (a stop, a lost lease), engine work still running in its thread is
    abandoned at the next device (the term's engine is not used again): SIGTERM exits promptly."""
    await term.wait()
    allocator.engine.interrupt()


async def _end_term_on(stop: asyncio.Event, term: asyncio.Event) -> None:
    waiters = {asyncio.ensure_future(stop.wait()), asyncio.ensure_future(term.wait())}
    try:
        await asyncio.wait(waiters, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for waiter in waiters:
            waiter.cancel()
    term.set()
