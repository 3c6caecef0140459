"""The decisions as the local store's writer reads them: only what a record is made of.

A claim's record (`dralloc.schemas.status.ClaimStatus`) holds the claim's key and uid, the node
and the allocation; an AllocationCommitted carries the whole claim besides (its spec: requests,
selectors, metadata), and decoding all of it was a quarter of the status writer's CPU in a
profile of `dralloc bench pipeline`. `read_decision` decodes a commit as `Committed`, which
declares only those fields (msgspec skips the rest without building them), and checks what it
keeps as the full decode would: the whole message within the nesting and integer limits, the
schema version, the names the API server would accept (they make the record's key), the
allocation typed, the subject the one the body names. Any message it does not take that way
(another type, a refusal) is read the ordinary way (`dralloc.bus.decode_event`), so what
is refused is refused with the same reason as before. A commit whose unused parts (its spec) are
malformed is recorded all the same: nothing of them reaches the store.
"""

from __future__ import annotations

import msgspec

from dralloc.bus import decode_event
from dralloc.schemas import events as ev
from dralloc.schemas.limits import json_problem
from dralloc.schemas.resource import AllocationResult
from dralloc.schemas.validation import name_error, namespace_error


class _Meta(msgspec.Struct, rename="camel"):
    name: str = ""
    namespace: str | None = None
    uid: str | None = None


class _Status(msgspec.Struct, rename="camel"):
    allocation: AllocationResult | None = None


class _Claim(msgspec.Struct, rename="camel"):
    metadata: _Meta = msgspec.field(default_factory=_Meta)
    status: _Status | None = None


class Committed(msgspec.Struct, ev.CommitView, tag="AllocationCommitted", tag_field="type", rename="camel", kw_only=True, frozen=True):
    """An AllocationCommitted as a record needs it (what `ev.AllocationCommitted` offers for it, by the same code)."""

    schema_version: int = ev.SCHEMA_VERSION
    claim: _Claim
    node: str | None = None


_DECODER = msgspec.json.Decoder(Committed)


def read_decision(stream: str, subject: str, data: bytes) -> Committed | ev.Event:
    """A message of ALLOCATIONS: a commit as `Committed` when every part a record uses checks out,
    anything else as `decode_event` reads it (raising `EventDecodeError` with its reason)."""
    if data.startswith(b'{"type":"AllocationCommitted"') and json_problem(data) is None:
        try:
            commit = _DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            commit = None
        if commit is not None and commit.schema_version == ev.SCHEMA_VERSION and _well_named(commit) and commit.subject == subject:
            return commit
    return decode_event(stream, subject, data)


def _well_named(commit: Committed) -> bool:
    """The claim's names are what the API server accepts (as `ev.identity_problem` checks a claim's)."""
    meta = commit.claim.metadata
    return name_error(meta.name) is None and not (meta.namespace and namespace_error(meta.namespace) is not None)
