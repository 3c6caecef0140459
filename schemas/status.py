"""The status store's record: one claim's latest allocation state, as the status writer stores it.

A contract between services: the status writer writes these records into a JetStream KV
bucket (`DEFAULT_BUCKET`, key `namespace/name`), and `dralloc get claims`, `submit --wait`
and the demo read them. Reading the bucket (I/O) stays with the sink in
`dralloc.statuswriter.sinks`; this module only says what a record is and checks one.
"""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Literal, Protocol

import msgspec

from dralloc.schemas import events as ev
from dralloc.schemas.limits import json_problem
from dralloc.schemas.resource import AllocationResult

DEFAULT_BUCKET = "dralloc-claims"


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
        """The allocated devices as ``driver/pool/device``; empty without an allocation."""
        if self.allocation is None:
            return []
        return [f"{r.driver}/{r.pool}/{r.device}" for r in self.allocation.devices.results]


class Allocated(Protocol):
    """What a commit's record is made of: `ev.AllocationCommitted` offers it, and so does a reader
    that decodes only these parts of one (the status writer's `reading.Committed`)."""

    @property
    def key(self) -> str: ...
    @property
    def uid(self) -> str: ...
    @property
    def node(self) -> str | None: ...
    @property
    def allocation(self) -> AllocationResult | None: ...


def status_of(event: Allocated | ev.AllocationFailed) -> ClaimStatus:
    """The record a decision leaves in the store, stamped with the current UTC time."""
    now = datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")
    if isinstance(event, ev.AllocationFailed):
        return ClaimStatus(claim=event.key, uid=event.uid, state=event.reason, message=event.message, updated=now)
    return ClaimStatus(claim=event.key, uid=event.uid, state="allocated", node=event.node, allocation=event.allocation, updated=now)


def kv_key(claim_key: str) -> str:
    """The bucket key of a claim's record, from its ``namespace/name``."""
    # KV keys allow [-/_=.a-zA-Z0-9]; namespace and name are DNS names, so `ns/name` is a valid key as is.
    return claim_key


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
