"""Where allocation decisions end up: the `StatusSink` protocol and the local store (JetStream KV).

A sink receives every allocation event in stream order and must make it
durable before returning (the status writer acks the message afterwards, so
a sink also sees an event again after a crash: it must be idempotent).
Sinks: `KVSink` here, `KubernetesSink` in ``kubernetes.py`` (patches the
claim's ``status``).
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable
from typing import Any, Protocol

import msgspec

from dralloc.bus import MAX_IN_FLIGHT, Bus, KeyValue
from dralloc.schemas import events as ev
from dralloc.schemas.status import DEFAULT_BUCKET, Allocated, ClaimStatus, UnreadableStatus, decode_status, kv_key, status_of
from dralloc.statusstore import read_all, read_all_checked, read_status
from dralloc.statuswriter.reading import read_decision

__all__ = [  # the record format lives in schemas.status, its reads in statusstore; these names stay importable from here
    "DEFAULT_BUCKET",
    "ClaimStatus",
    "KVSink",
    "StatusSink",
    "UnreadableStatus",
    "decode_status",
    "kv_key",
    "read_all",
    "read_all_checked",
    "read_status",
    "status_of",
]

log = logging.getLogger("dralloc.statuswriter")


class StatusSink(Protocol):
    """Optionally also ``async def close()``: called once when the status writer stops.

    A method returns once the event's effect is durable, or returns an awaitable that completes
    then (the status writer acks the event only then, and goes on with the next meanwhile)."""

    async def committed(self, event: ev.AllocationCommitted) -> Awaitable[Any] | None: ...
    async def failed(self, event: ev.AllocationFailed) -> Awaitable[Any] | None: ...
    async def released(self, event: ev.AllocationReleased) -> Awaitable[Any] | None: ...


REMEMBERED = 4 * MAX_IN_FLIGHT
"""Claims whose stored state a `KVSink` keeps besides those it is still writing (the newest
first): a check of one of them reads no bucket. The window of unacked events several times over;
a check of an older claim (a release hours after its commit) reads its record (one KV get)."""


class KVSink:
    """The latest state per claim in a JetStream KV bucket (key ``namespace/name``); released claims are deleted.

    With `bus` (the status writer's), a put is sent without waiting for the store: the status
    writer acks the event once it is stored, and several are in flight at once. Puts leave in
    stream order, so the bucket ends at the right state; what this sink wrote is remembered
    (`written`), so a check of the current state never reads the bucket behind a put in flight.
    Once a claim's last put is stored the bucket holds what was written, so the memory is bounded:
    past a limit, only the claims with a put in flight and the `remembered` newest are
    kept (a check of another reads its record); a released claim is forgotten (the bucket has none).
    """

    decode = staticmethod(read_decision)
    """Commits are read as only what a record is made of (`reading.read_decision`)."""
    traced = False
    """Its writes (KV puts) carry no trace context: the consumer makes no span current for them while nothing records."""

    def __init__(self, kv: KeyValue, bus: Bus | None = None, bucket: str = DEFAULT_BUCKET, remembered: int = REMEMBERED) -> None:
        self.kv = kv
        self.bus = bus
        self.bucket = bucket
        self.remembered = remembered
        self.written: dict[str, tuple[tuple[str, str], asyncio.Future[Any] | None]] = {}
        """Claim key -> ((state, uid) this sink last wrote, the answer to its put; None: awaited), in the order first written (the newest last)."""
        self.limit = 2 * remembered
        """`written` is cut down to what is in flight and the `remembered` newest once it grows
        past this (then set to leave room for `remembered` more: the cut costs O(1) a put, and `written`
        holds at most what was in flight at the last cut and twice `remembered`, plus one)."""

    async def committed(self, event: Allocated) -> Awaitable[Any] | None:
        return await self._put(event.key, status_of(event))

    async def failed(self, event: ev.AllocationFailed) -> Awaitable[Any] | None:
        current = await self._current(event.key)
        if current is not None and current == ("allocated", event.uid):
            return None  # a late failure (an older attempt redelivered) never hides a commit
        return await self._put(event.key, status_of(event))

    async def released(self, event: ev.AllocationReleased) -> Awaitable[Any] | None:
        current = await self._current(event.key)
        if current is not None and current[1] not in (event.uid, ""):
            return None  # the claim was re-created since: that one's status stays
        await self.kv.delete(kv_key(event.key))  # (answered after every put before it)
        self.written.pop(event.key, None)  # the bucket has no record now: a check reads that
        return None

    async def _current(self, key: str) -> tuple[str, str] | None:
        if (written := self.written.get(key)) is not None and _standing(written[1]):
            return written[0]
        try:
            status = await read_status(self.kv, key)
        except UnreadableStatus as exc:  # overwritten by this decision
            log.warning("status writer: replacing a bad record: %s", exc)
            return None
        return None if status is None else (status.state, status.uid)

    async def _put(self, key: str, status: ClaimStatus) -> Awaitable[Any] | None:
        data = msgspec.json.encode(status)
        answer: asyncio.Future[Any] | None = None
        if self.bus is None:
            await self.kv.put(kv_key(key), data)
        else:
            answer = await self.bus.send_bytes(f"$KV.{self.bucket}.{kv_key(key)}", data)
        self.written[key] = ((status.state, status.uid), answer)
        if len(self.written) > self.limit:
            self._forget()
        return answer

    def _forget(self) -> None:
        """Keep in `written` the `remembered` newest claims and those with a put in flight."""
        older = len(self.written) - self.remembered
        in_flight = [(key, w) for key, w in itertools.islice(self.written.items(), older) if w[1] is not None and not w[1].done()]
        self.written = dict(itertools.chain(in_flight, itertools.islice(self.written.items(), older, None)))
        self.limit = len(self.written) + max(self.remembered, 1)


def _standing(answer: asyncio.Future[Any] | None) -> bool:
    """Whether what a put wrote is what a check must see: stored (None, or answered), or still in
    flight (the bucket is behind it); not when it was refused or given up on (the bucket says what is true)."""
    return answer is None or not answer.done() or (not answer.cancelled() and answer.exception() is None)
