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
from datetime import UTC, datetime
from typing import Any, Literal, Protocol

import msgspec
import nats.errors
import nats.js.errors
from nats.js.kv import KeyValue

from dralloc.bus import Bus
from dralloc.schemas import events as ev
from dralloc.schemas.limits import json_problem
from dralloc.schemas.resource import AllocationResult

DEFAULT_BUCKET = "dralloc-claims"

log = logging.getLogger("dralloc.statuswriter")


class StatusSink(Protocol):
    """Optionally also ``async def close()``: called once when the status writer stops.

    A method returns once the event's effect is durable, or returns an awaitable that completes
    then (the status writer acks the event only then, and goes on with the next meanwhile)."""

    async def committed(self, event: ev.AllocationCommitted) -> Awaitable[Any] | None: ...
    async def failed(self, event: ev.AllocationFailed) -> Awaitable[Any] | None: ...
    async def released(self, event: ev.AllocationReleased) -> Awaitable[Any] | None: ...


class ClaimStatus(msgspec.Struct, rename="camel", omit_defaults=True, kw_only=True):
    """One claim's latest allocation state, as stored and as `dralloc get claims -o json` prints it."""

    claim: str
    """``namespace/name``."""
    uid: str
    state: Literal["allocated", "unsatisfiable", "error", "pending"]
    """``pending`` only in views (no decision yet); the store holds decisions."""
    node: str | None = None
    allocation: AllocationResult | None = None
    message: str = ""
    updated: str = ""

    @property
    def devices(self) -> list[str]:
        if self.allocation is None:
            return []
        return [f"{r.driver}/{r.pool}/{r.device}" for r in self.allocation.devices.results]


def status_of(event: ev.AllocationCommitted | ev.AllocationFailed) -> ClaimStatus:
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(event, ev.AllocationCommitted):
        return ClaimStatus(
            claim=event.key, uid=event.claim.metadata.uid or "", state="allocated", node=event.node, allocation=event.allocation, updated=now
        )
    return ClaimStatus(claim=event.key, uid=event.uid, state=event.reason, message=event.message, updated=now)


def kv_key(claim_key: str) -> str:
    # KV keys allow [-/_=.a-zA-Z0-9]; namespace and name are DNS names, so `ns/name` is a valid key as is.
    return claim_key


class KVSink:
    """The latest state per claim in a JetStream KV bucket (key ``namespace/name``); released claims are deleted.

    With `bus` (the status writer's), a put is sent without waiting for the store: the status
    writer acks the event once it is stored, and several are in flight at once. Puts leave in
    stream order, so the bucket ends at the right state; what this sink wrote is remembered
    (`written`), so a check of the current state never reads the bucket behind a put in flight.
    """

    def __init__(self, kv: KeyValue, bus: Bus | None = None, bucket: str = DEFAULT_BUCKET) -> None:
        self.kv = kv
        self.bus = bus
        self.bucket = bucket
        self.written: dict[str, tuple[str, str] | None] = {}
        """Claim key -> (state, uid) this sink last wrote (None: deleted)."""

    async def committed(self, event: ev.AllocationCommitted) -> Awaitable[Any] | None:
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


class UnreadableStatus(ValueError):
    """A stored record that is not a claim status (written by someone else, or corrupted)."""


def decode_status(key: str, value: bytes) -> ClaimStatus:
    """One stored record, checked: within the nesting and integer limits, a `ClaimStatus`, and
    about the claim its key names. Raises `UnreadableStatus` saying why not."""
    if (problem := json_problem(value)) is not None:
        raise UnreadableStatus(f"record {key!r}: {problem}")
    try:
        status = msgspec.json.decode(value, type=ClaimStatus)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise UnreadableStatus(f"record {key!r}: not a claim status: {exc}") from None
    if kv_key(status.claim) != key:
        raise UnreadableStatus(f"record {key!r}: stored under that key but about claim {status.claim!r}")
    return status


async def read_status(kv: KeyValue, claim_key: str) -> ClaimStatus | None:
    """The claim's stored status, None if there is none; `UnreadableStatus` if the record is bad."""
    try:
        entry = await kv.get(kv_key(claim_key))
    except nats.js.errors.KeyNotFoundError:
        return None
    if not entry.value:
        return None
    return decode_status(kv_key(claim_key), entry.value)


async def read_all_checked(kv: KeyValue) -> tuple[list[ClaimStatus], list[str]]:
    """Every stored claim status, sorted by claim, and one line per record that could not be
    read (skipped: one bad record never hides the others)."""
    try:
        keys = await kv.keys()
    except nats.js.errors.NoKeysError:
        return [], []
    found: list[ClaimStatus] = []
    problems: list[str] = []
    for key in keys:
        try:
            status = await read_status(kv, key)
        except UnreadableStatus as exc:
            problems.append(str(exc))
            continue
        except (nats.errors.Error, ValueError) as exc:  # a key the client refuses to ask for
            problems.append(f"record {key!r}: cannot be read: {exc}")
            continue
        if status is not None:
            found.append(status)
    return sorted(found, key=lambda s: s.claim), problems


async def read_all(kv: KeyValue) -> list[ClaimStatus]:
    """Every readable stored claim status, sorted by claim (bad records are logged and skipped)."""
    found, problems = await read_all_checked(kv)
    for problem in problems:
        log.warning("skipped a bad claim status: %s", problem)
    return found
