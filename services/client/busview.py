"""Reading the fleet's state from the bus for `get` and `top`, without loading it.

One snapshot is the last message per subject of INVENTORY and ALLOCATIONS
(an ephemeral ordered consumer each, in memory, no acks); following it is
the same consumers delivering only new messages. Nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator

from dralloc.bus import Bus, StoredMessage
from dralloc.client.fleetview import FleetState
from dralloc.schemas import events as ev

VIEW_STREAMS = ("INVENTORY", "ALLOCATIONS")


def _apply(state: FleetState, msg: StoredMessage) -> None:
    try:
        event = ev.decode(msg.data)
    except ev.EventDecodeError:
        return  # a message the services dead-letter; a view skips it
    state.apply(event, msg.time.timestamp() if msg.time is not None else 0.0)


async def snapshot(bus: Bus, state: FleetState | None = None) -> tuple[FleetState, dict[str, int]]:
    """The latest event per subject of each view stream folded into `state`; the last sequence read per stream."""
    view = state or FleetState()
    last: dict[str, int] = {}
    for stream in VIEW_STREAMS:
        held = await bus.stream_state(stream)
        last[stream] = held.last_sequence
        if held.messages:
            await bus.scan(stream, lambda msg: _apply(view, msg), last_per_subject=True, upto=held.last_sequence)
    return view, last


@contextlib.asynccontextmanager
async def following(bus: Bus, state: FleetState, after: dict[str, int]) -> AsyncIterator[asyncio.Event]:
    """Fold every message published after `after` (per stream) into `state` while inside; the
    event yielded is set whenever something changed (the caller clears it)."""
    changed = asyncio.Event()

    def handler(msg: StoredMessage) -> None:
        _apply(state, msg)
        changed.set()

    async with contextlib.AsyncExitStack() as stack:
        for stream in VIEW_STREAMS:
            await stack.enter_async_context(bus.follow(stream, handler, after=after[stream]))
        yield changed
