"""The allocator's snapshot of live decisions: what it is, where it lives, how it is checked.

The allocator (the only writer of ALLOCATIONS) keeps, besides the stream, a compacted copy of its
last decision per claim (commits and failures; a release removes the claim) in the JetStream KV
bucket `BUCKET`, so that a new leader loads that copy and replays only the ALLOCATIONS messages
after the sequence it covers, instead of the whole history:

- key ``head``: a `SnapshotHead` (JSON), written last, naming the chunk set that holds the body;
- keys ``a.<n>`` / ``b.<n>`` (n = 0, 1, ...): the body in chunks under the server's max payload.
  A new snapshot is written into the set the current head does not name, then the head: a writer
  that dies part way leaves the previous snapshot whole.

The body is the decisions' events, as `dralloc.schemas.events.encode` writes them, one per line
(``\\n``; the JSON of an event has no raw newline), in ALLOCATIONS order; ``sha256`` of the
whole body is in the head. The snapshot is an input like any other: a reader checks it
(`head_problem`, then the body against the head and each event with `events.decode`) and
falls back to replaying ALLOCATIONS whole when anything does not hold.
"""

from __future__ import annotations

import re

import msgspec

from dralloc.schemas.limits import json_problem

BUCKET = "dralloc-snapshot"
"""The KV bucket (its stream: ``KV_dralloc-snapshot``); only the allocator may write it (infra/nats/auth.conf)."""
HEAD = "head"
CHUNK_SETS = ("a", "b")
FORMAT = 1
"""The body format this build writes and reads."""

MAX_HEAD_BYTES = 4096
MAX_BODY_BYTES = 4 * 2**30
"""A body larger than this is refused unread (4 GiB: about two million live claims of 2 KiB)."""
MAX_CHUNKS = 1 << 16

_SHA256 = re.compile(r"[0-9a-f]{64}")


class SnapshotHead(msgspec.Struct, rename="camel", kw_only=True, forbid_unknown_fields=True, frozen=True):
    """What a snapshot covers and how to check its body."""

    format: int
    seq: int
    """The ALLOCATIONS sequence the snapshot covers: every decision up to and including it, none after."""
    stream_created: str
    """When ALLOCATIONS was created, as the server reported it (ISO 8601): a stream created again
    since (its storage lost) restarts its sequences, and the snapshot does not describe it."""
    decisions: int
    """Events in the body."""
    chunk_set: str
    chunks: int
    size: int
    """Bytes of the body."""
    sha256: str
    """Of the body (hex)."""
    epoch: int
    """The leader term that wrote it (the lease's epoch; 0 without a lease)."""
    written: float
    """When (Unix seconds): shown to people, never compared to a clock."""


def chunk_key(chunk_set: str, index: int) -> str:
    return f"{chunk_set}.{index}"


def encode_head(head: SnapshotHead) -> bytes:
    return msgspec.json.encode(head)


def decode_head(data: bytes) -> SnapshotHead:
    """The head stored under `HEAD`; raises ValueError with a reason a person can act on."""
    if len(data) > MAX_HEAD_BYTES:
        raise ValueError(f"head is {len(data)} bytes (at most {MAX_HEAD_BYTES})")
    if (problem := json_problem(data)) is not None:
        raise ValueError(f"head is not JSON dralloc reads: {problem}")
    try:
        head = msgspec.json.decode(data, type=SnapshotHead)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise ValueError(f"head is not a snapshot head: {exc}") from None
    if (problem := head_problem(head)) is not None:
        raise ValueError(problem)
    return head


def head_problem(head: SnapshotHead) -> str | None:
    """Why the head itself cannot be used (its own fields; the stream is checked by the reader), or None."""
    if head.format != FORMAT:
        return f"format {head.format}, this build reads {FORMAT}"
    if not 0 < head.seq < 2**63:
        return f"sequence {head.seq} is not a stream sequence"
    if head.chunk_set not in CHUNK_SETS:
        return f"chunk set {head.chunk_set[:20]!r} is not one of {', '.join(CHUNK_SETS)}"
    if not 0 <= head.size <= MAX_BODY_BYTES:
        return f"body of {head.size} bytes (at most {MAX_BODY_BYTES})"
    if not 0 <= head.chunks <= MAX_CHUNKS or (head.size > 0) != (head.chunks > 0):
        return f"{head.chunks} chunks for a body of {head.size} bytes"
    if not 0 <= head.decisions <= head.size:  # each event is more than one byte
        return f"{head.decisions} decisions in a body of {head.size} bytes"
    if not _SHA256.fullmatch(head.sha256):
        return "sha256 is not 64 lowercase hex digits"
    if not head.stream_created or len(head.stream_created) > 64:
        return "streamCreated is empty or too long"
    if not 0 <= head.epoch < 2**63:
        return f"epoch {head.epoch} out of range"
    return None
