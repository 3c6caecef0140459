"""A durable consumer's backlog, asked of JetStream and reported to the ``dralloc.consumer.lag``
gauge (`dralloc.metrics.consumer_lag`). Here, not in `dralloc.metrics`: asking is NATS, and the
metrics module stays free of the bus (no import cycle between them)."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING

from dralloc.bus.errors import NatsError
from dralloc.metrics import consumer_lag

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

LAG_EVERY_S = 2.0
"""How often a consumer's backlog is asked for (one JetStream API request each)."""


async def report_lag(bus: Bus, stream: str, consumer: str, stop: asyncio.Event, every: float = LAG_EVERY_S) -> None:
    """Report the durable `consumer`'s backlog on `stream` until `stop` is set; then stop reporting it
    (a standby does not speak for the consumer it no longer reads)."""
    backlog = consumer_lag().backlog
    try:
        while not stop.is_set():
            try:
                info = await bus._js.consumer_info(stream, consumer)
                backlog[(stream, consumer)] = info.num_pending + info.num_ack_pending
            except (NatsError, TimeoutError):  # not created yet, or NATS away: the next round tells
                pass
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), every)
    finally:
        backlog.pop((stream, consumer), None)
