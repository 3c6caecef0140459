"""Reading the fleet's state from the bus for `get` and `top`, without loading it.

One snapshot is the last message per subject of INVENTORY and ALLOCATIONS
(an ephemeral ordered consumer each, in memory, no acks); following it is
the same consumers delivering only new messages. Nothing is written.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable

from dralloc.bus import STREAMS, AckPolicy, Bus, ConsumerConfig, DeliverPolicy, NatsTimeout
from dralloc.client.fleetview import FleetState
from dralloc.schemas import events as ev

VIEW_STREAMS = ("INVENTORY", "ALLOCATIONS")
FETCH_S = 1.0


def _apply(state: FleetState, msg: object) -> None:
    try:
        event = ev.decode(msg.data)  # type: ignore[attr-defined]
    except ev.EventDecodeError:
        return  # a message the services dead-letter; a view skips it
    state.apply(event, msg.metadata.timestamp.timestamp())  # type: ignore[attr-defined]


async def snapshot(bus: Bus, state: FleetState | None = None) -> tuple[FleetState, dict[str, int]]:
    """The latest event per subject of each view stream folded into `state`; the last sequence read per stream."""
    state = state or FleetState()
    last: dict[str, int] = {}
    for stream in VIEW_STREAMS:
        info = await bus.js.stream_info(stream)
        last[stream] = info.state.last_seq
        if not info.state.messages:
            continue
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            filter_subjects=list(STREAMS[stream].subjects or [">"]),
        )
        sub = await bus.js.pull_subscribe("", durable=None, stream=stream, config=config)
        try:
            pending = (await sub.consumer_info()).num_pending or 0
            while pending > 0:
                try:
                    messages = await sub.fetch(min(pending, 512), timeout=FETCH_S)
                except (NatsTimeout, TimeoutError):
                    pending = (await sub.consumer_info()).num_pending or 0
                    continue
                for msg in messages:
                    pending = msg.metadata.num_pending
                    if msg.metadata.sequence.stream <= last[stream]:
                        _apply(state, msg)
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
    return state, last


@contextlib.asynccontextmanager
async def following(bus: Bus, state: FleetState, after: dict[str, int], on_change: Callable[[object], None] | None = None) -> AsyncIterator[asyncio.Event]:
    """Fold every message published after `after` (per stream) into `state` while inside; the
    event yielded is set whenever something changed (the caller clears it)."""
    changed = asyncio.Event()
    subs = []

    async def handler(msg: object) -> None:
        _apply(state, msg)
        if on_change is not None:
            with contextlib.suppress(ev.EventDecodeError):
                on_change(ev.decode(msg.data))  # type: ignore[attr-defined]
        changed.set()

    try:
        for stream in VIEW_STREAMS:
            for subject in STREAMS[stream].subjects or [">"]:
                subs.append(
                    await bus.js.subscribe(
                        subject,
                        stream=stream,
                        ordered_consumer=True,
                        config=ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after[stream] + 1),
                        cb=handler,
                    )
                )
        yield changed
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
