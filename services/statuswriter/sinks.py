"""Where allocation decisions end up: the `StatusSink` protocol and the local store (JetStream KV).

A sink receives every allocation event in stream order and must make it
durable before returning (the status writer acks the message afterwards, so
a sink also sees an event again after a crash: it must be idempotent).
Sinks: `KVSink` here, `KubernetesSink` in ``kubernetes.py`` (patches the
claim's ``status``).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable
from typing import Any, Protocol

import msgspec

from dralloc.bus import Bus, KeyValue
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


class KVSink:
    """The latest state per claim in a JetStream KV bucket (key ``namespace/name``); released claims are deleted.

    With `bus` (the status writer's), a put is sent without waiting for the store: the status
    writer acks the event once it is stored, and several are in flight at once. Puts leave in
    stream order, so the bucket ends at the right state; what this sink wrote is remembered
    (`written`), so a check of the current state never reads the bucket behind a put in flight.
    """

    decode = staticmethod(read_decision)
    """Commits are read as only what a record is made of (`reading.read_decision`)."""
    traced = False
    """Its writes (KV puts) carry no trace context: the consumer makes no span current for them while nothing records."""

    def __init__(self, kv: KeyValue, bus: Bus | None = None, bucket: str = DEFAULT_BUCKET) -> None:
        self.kv = kv
        self.bus = bus
        self.bucket = bucket
        self.written: dict[str, tuple[str, str] | None] = {}
        """Claim key -> (state, uid) this sink last wrote (None: deleted)."""

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
        self.written[event.key] = None
        await self.kv.delete(kv_key(event.key))
        return None

    async def _current(self, key: str) -> tuple[str, str] | None:
        if key in self.written:
            return self.written[key]
        try:
            status = await read_status(self.kv, key)
        except UnreadableStatus as exc:  # overwritten by this decision
            log.warning("status writer: replacing a bad record: %s", exc)
            return None
        return None if status is None else (status.state, status.uid)

    async def _put(self, key: str, status: ClaimStatus) -> Awaitable[Any] | None:
        data = msgspec.json.encode(status)
        self.written[key] = (status.state, status.uid)
        if self.bus is None:
            await self.kv.put(kv_key(key), data)
            return None
        return await self.bus.send_bytes(f"$KV.{self.bucket}.{kv_key(key)}", data)
