"""Waiting claims tried again: after each burst of inventory changes or releases, and when a
reservation's end comes (reservations.py). Claims decided as errors wait again only after the
inventory changed (`Decisions.unpark`)."""

from __future__ import annotations

import asyncio
import logging
import time
from typing import TYPE_CHECKING

from dralloc import telemetry

if TYPE_CHECKING:
    from dralloc.allocator.shell import Allocator

log = logging.getLogger("dralloc.allocator")


async def retry_waiting(allocator: Allocator, stop: asyncio.Event, delay: float) -> None:
    """Try the waiting claims again after each burst of inventory changes or releases."""
    while not stop.is_set():
        changed = asyncio.ensure_future(allocator.room_changed.wait())
        stopped = asyncio.ensure_future(stop.wait())
        deadline = allocator.book.reservations.next_deadline()  # a reservation's end is written when it comes
        timeout = None if deadline is None else max(0.0, deadline - time.time()) + 0.01
        await asyncio.wait({changed, stopped}, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        changed.cancel()
        stopped.cancel()
        if stop.is_set():
            return
        await asyncio.sleep(delay)
        allocator.room_changed.clear()
        if allocator.inventory_changed:  # a burst of inventory is in
            allocator.inventory_changed = False
            allocator.book.unpark()  # claims decided as errors are tried again only now
        async with allocator.lock:
            for key, claim in list(allocator.waiting.items()):
                if stop.is_set():
                    return
                with telemetry.tracer().start_as_current_span("retry allocation", context=allocator.book.contexts.get(key)):
                    try:
                        await allocator.retry(claim)
                    except Exception as exc:  # the bus is down: the next change retries again
                        log.warning("allocator: retrying %s failed: %s", key, exc)
            for key in sorted(allocator.book.pods_waiting):
                if stop.is_set():
                    return
                allocator.book.pods_waiting.discard(key)
                if key not in allocator.book.pods:
                    continue
                with telemetry.tracer().start_as_current_span("retry allocation", attributes={"dralloc.pod": key}):
                    try:
                        await allocator.decide_step(allocator.book.pod_submitted(allocator.book.pods[key]))
                        if allocator.tail is not None:
                            await allocator.tail
                    except Exception as exc:  # the bus is down: the next change retries again
                        allocator.book.pods_waiting.add(key)
                        log.warning("allocator: retrying Pod %s failed: %s", key, exc)
            try:
                await allocator.make_moves()  # (opt-in: the large units whose wait is over, moving.py)
                await allocator.reserve_waiting()
            except Exception as exc:  # the bus is down: the next change tries again
                log.warning("allocator: writing reservations failed: %s", exc)
