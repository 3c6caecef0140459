"""The compacted record of the allocator's live decisions, and its snapshot body: pure (no I/O).

`Compacted` follows ALLOCATIONS as this term writes it: the last decision per claim subject
(commits and failures; a release removes the claim: a rebuild does nothing with a release it
replays), up to `Compacted.seq`, the highest sequence below which every write is stored. The
store (`snapshot_store.py`) writes it into the bucket now and then, and a new leader loads it
and replays only the stream after it (`merge`). Format and checks: `dralloc.schemas.snapshot`.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from dralloc.schemas import events as ev
from dralloc.schemas import snapshot as fmt


class SnapshotUnusable(Exception):
    """The snapshot cannot be used (the message says why): the rebuild replays ALLOCATIONS whole."""


class Compacted:
    """The last decision per claim subject of ALLOCATIONS, up to and including `seq`."""

    def __init__(self) -> None:
        self.latest: dict[str, ev.AllocationEvent] = {}
        """Subject -> its last decision (not a release), in the order they were stored."""
        self.seq = 0
        self._pending: dict[int, tuple[ev.AllocationEvent, ...]] = {}
        """Writes stored ahead of one still unanswered (acks may come out of order), by first sequence."""

    def load(self, decisions: Iterable[ev.Event], seq: int) -> None:
        """What a rebuild replayed: the last decision per subject up to `seq`, in stream order."""
        self.latest.clear()
        self._pending.clear()
        for event in decisions:
            if isinstance(event, ev.AllocationCommitted | ev.AllocationFailed | ev.AllocationReleased):
                self._apply(event)
        self.seq = seq

    def stored(self, first_seq: int, events: Sequence[ev.AllocationEvent]) -> int:
        """This term's write of `events` was stored at `first_seq`, `first_seq + 1`, ...; returns how many
        decisions `seq` moved past (0 while an earlier write is unanswered)."""
        if first_seq <= self.seq:
            return 0  # (already covered: a write counted twice would be a bug upstream, not a new state)
        self._pending[first_seq] = tuple(events)
        before = self.seq
        while (batch := self._pending.pop(self.seq + 1, None)) is not None:
            for event in batch:
                self._apply(event)
            self.seq += len(batch)
        return self.seq - before

    def _apply(self, event: ev.AllocationEvent) -> None:
        if isinstance(event, ev.EvictionRequested):
            return  # a request, not a decision about the claim (evicting.py)
        subject = event.subject
        self.latest.pop(subject, None)  # re-inserted at the end: `latest` stays in stream order
        if not isinstance(event, ev.AllocationReleased):
            self.latest[subject] = event


def merge(snapshot: Sequence[ev.AllocationEvent], tail: Sequence[ev.AllocationEvent]) -> list[ev.AllocationEvent]:
    """The last decision per subject of the whole stream, in stream order, from the snapshot's and the
    tail's (the stream after the snapshot, itself the last per subject in stream order)."""
    newer = {event.subject for event in tail}
    return [event for event in snapshot if event.subject not in newer] + list(tail)


def encode_body(decisions: Sequence[ev.AllocationEvent]) -> bytes:
    return b"\n".join(ev.encode(event) for event in decisions)


def chunks_of(body: bytes, size: int) -> list[bytes]:
    return [body[i : i + size] for i in range(0, len(body), size)]


def make_head(body: bytes, decisions: int, *, seq: int, stream_created: str, chunk_set: str, chunk_size: int, epoch: int) -> fmt.SnapshotHead:
    return fmt.SnapshotHead(
        format=fmt.FORMAT,
        seq=seq,
        stream_created=stream_created,
        decisions=decisions,
        chunk_set=chunk_set,
        chunks=-(-len(body) // chunk_size),
        size=len(body),
        sha256=hashlib.sha256(body).hexdigest(),
        epoch=epoch,
        written=time.time(),
    )


def decode_body(head: fmt.SnapshotHead, body: bytes) -> list[ev.AllocationEvent]:
    """The decisions of a body read for `head`; raises `SnapshotUnusable` naming what does not hold."""
    if len(body) != head.size:
        raise SnapshotUnusable(f"body is {len(body)} bytes, the head says {head.size}")
    if hashlib.sha256(body).hexdigest() != head.sha256:
        raise SnapshotUnusable("body does not match the head's sha256 (corrupt, or written over while read)")
    lines = body.split(b"\n") if body else []
    if len(lines) != head.decisions:
        raise SnapshotUnusable(f"body holds {len(lines)} decisions, the head says {head.decisions}")
    decisions: list[ev.AllocationEvent] = []
    subjects: set[str] = set()
    for n, line in enumerate(lines):
        try:
            event = ev.decode(line)
        except ev.EventDecodeError as exc:
            raise SnapshotUnusable(f"decision {n}: {' '.join(str(exc).split())[:300]}") from None
        if not isinstance(event, ev.AllocationCommitted | ev.AllocationFailed):
            raise SnapshotUnusable(f"decision {n} is a {type(event).__name__} (a snapshot holds commits and failures)")
        if event.subject in subjects:
            raise SnapshotUnusable(f"decision {n}: {event.subject} appears twice")
        subjects.add(event.subject)
        decisions.append(event)
    return decisions


@dataclass(frozen=True)
class Policy:
    """When the leader writes a snapshot: once `every` decisions were stored since the last one, or as
    many as the snapshot holds when that is more (writing it then costs about one decision's worth
    per decision, whatever the live set), or `seconds` after it when anything changed; never two at
    once (a slow write lowers the rate by itself). A new leader so replays at most max(`every`, live
    decisions) messages after the snapshot, however long the history."""

    every: int = 1000
    seconds: float = 60.0

    def due(self, decisions_since: int, seconds_since: float, live: int = 0) -> bool:
        return decisions_since >= max(self.every, live) or (decisions_since > 0 and seconds_since >= self.seconds)

    def most_unsnapshotted(self, live: int) -> int:
        """The longest tail the count trigger leaves (a new leader replays at most that many messages)."""
        return max(self.every, live) - 1
