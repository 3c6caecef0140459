"""`Bus.send`'s ack gives up on a store that never answers (one sweeping timer for all acks), against a real nats-server."""

from __future__ import annotations

import asyncio
import time

import pytest

from dralloc.bus import Bus
from dralloc.bus.raw import connection


async def test_an_unanswered_send_raises_timeout_soon_after_its_timeout_and_answered_ones_do_not(bus: Bus):
    silent = await connection(bus).subscribe("nobody.answers")  # (a listener that never replies: no 503 either)
    try:
        started = time.monotonic()
        unanswered = [await bus.send_bytes("nobody.answers", b"x", timeout=0.4) for _ in range(3)]
        later = await bus.send_bytes("nobody.answers", b"x", timeout=1.5)
        for ack in unanswered:
            with pytest.raises(TimeoutError, match="no answer from JetStream within 0.4s"):
                await ack
        assert 0.4 <= time.monotonic() - started < 1.4  # not before its time, at most a sweep after it
        assert not later.done()  # its own, longer timeout is not up yet
        with pytest.raises(TimeoutError, match="within 1.5s"):
            await later
    finally:
        await silent.unsubscribe()


async def test_a_cancelled_wait_for_an_ack_is_dropped_and_the_next_send_is_answered(bus: Bus):
    silent = await connection(bus).subscribe("nobody.answers")
    try:
        ack = await bus.send_bytes("nobody.answers", b"x", timeout=0.3)
        ack.cancel()
        await asyncio.sleep(0.7)  # past its timeout: the sweep drops it without raising into it
        assert ack.cancelled() and not bus._replies
    finally:
        await silent.unsubscribe()
    kv = await bus.key_value("probe")
    put = await bus.send_bytes("$KV.probe.k", b"v")
    assert (await put).seq == 1
    assert (await kv.get("k")).value == b"v"
