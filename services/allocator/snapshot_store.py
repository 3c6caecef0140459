"""The snapshot's I/O: reading ALLOCATIONS through it at a rebuild, and writing it off the hot path.

A rebuild (`Snapshots.replay`) loads the snapshot (`dralloc.schemas.snapshot`: the head, then the
chunks it names), checks it against itself and against the stream, and replays only the stream
after the sequence it covers; when there is none, or anything about it does not hold, it logs
which and replays ALLOCATIONS whole, as before. Checked against the stream:
- ALLOCATIONS is the stream the snapshot was made of (its creation time), it reaches the
  snapshot's sequence, and still holds every message after it (no limit removed part of the tail);
- the bucket's stream is configured as dralloc makes it (`streamcheck.weakened`);
- a random sample of the snapshot's decisions is each what the stream holds last for its claim
  (when that message is not after the snapshot): a snapshot made of anything but the stream fails.

The leader writes it (`Snapshots.keep`, a task of its term) by its `Policy` (every `every`
decisions, or as many as it holds when that is more, or `seconds` after a change), never two at
once, and at a clean stop; encoding runs in a worker thread, so the event loop (lease, claims) is
not held for the size of the live set.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Callable, Sequence

from dralloc.allocator.snapshot import Compacted, Policy, SnapshotUnusable, chunks_of, decode_body, encode_body, make_head, merge
from dralloc.bus import Bus, KeyNotFound, KeyValue, NatsError, StoredMessage, StreamConfig, StreamState, replicas_from_env, streamcheck
from dralloc.schemas import events as ev
from dralloc.schemas import snapshot as fmt

log = logging.getLogger("dralloc.allocator.snapshot")

STREAM = "ALLOCATIONS"
SAMPLE = 32
"""Decisions of a snapshot checked against the stream at a load."""
CHUNK_HEADROOM = 4096
"""Bytes of the server's max payload left for the KV message's subject and headers."""


def bucket_problems(actual: StreamConfig, replicas: int) -> list[str]:
    """How the snapshot bucket's stream (`actual`) keeps less or accepts more than dralloc makes it
    (`streamcheck.weakened` against the stream `Bus.key_value` creates: file storage, one value per
    key, no limit on values, bytes or age; a KV stream's deletes are rollups, so those stay on)."""
    wanted = StreamConfig.from_response(
        {
            "name": f"KV_{fmt.BUCKET}",
            "subjects": [f"$KV.{fmt.BUCKET}.>"],
            "storage": "file",
            "discard": "new",
            "max_msgs_per_subject": 1,
            "num_replicas": replicas,
            "allow_rollup_hdrs": True,
            "allow_msg_ttl": True,
        }
    )
    return streamcheck.weakened(actual, wanted)


class NoSnapshot(SnapshotUnusable):
    """The bucket holds no snapshot."""


class Snapshots:
    """One term's snapshot: what it loaded, the compacted record it keeps (`compacted`), its writes."""

    def __init__(self, bus: Bus, *, policy: Policy | None = None, epoch: Callable[[], int] = lambda: 0) -> None:
        self.bus = bus
        self.policy = policy or Policy()
        self.epoch = epoch
        self.compacted = Compacted()
        self.head: fmt.SnapshotHead | None = None
        """The snapshot in the bucket as this term last read or wrote it."""
        self.stream_created = ""
        self.since = 0
        """Decisions stored since the last snapshot (`policy.every` after a rebuild without one: due now)."""
        self.written_at = time.monotonic()
        self.changed = asyncio.Event()
        self.loaded_from: str = "none"
        """How the last `replay` went: ``snapshot`` or ``full`` (for the bench and the log)."""
        self.tail_messages = 0

    # -- the rebuild ----------------------------------------------------------------------

    async def replay(self) -> tuple[list[ev.AllocationEvent], int]:
        """The last decision per claim in ALLOCATIONS, in stream order, and the stream's last sequence:
        from the snapshot and the tail after it, or from the whole stream when the snapshot is unusable."""
        held = await self.bus.stream_state(STREAM)
        self.stream_created = held.created.isoformat() if held.created is not None else ""
        try:
            decisions, last_seq = await self._through_snapshot(held)
            self.loaded_from = "snapshot"
        except (SnapshotUnusable, NatsError, TimeoutError) as exc:  # (e.g. a credential without the bucket: an older auth.conf)
            none_yet = isinstance(exc, NoSnapshot)  # (a first start, or a bucket lost: nothing wrong with anything)
            log.log(logging.INFO if none_yet else logging.WARNING, "allocator: snapshot of %s not used, replaying it whole: %s", STREAM, exc)
            replayed, last_seq = await self.bus.replay(STREAM, leader_checked=True)
            decisions = [e for e in replayed if isinstance(e, ev.AllocationCommitted | ev.AllocationFailed | ev.AllocationReleased)]
            self.loaded_from, self.tail_messages = "full", 0
            self.since = self.policy.every  # a snapshot is written soon, off the hot path
            self.changed.set()
        self.compacted.load(decisions, last_seq)
        return decisions, last_seq

    async def _through_snapshot(self, state: StreamState) -> tuple[list[ev.AllocationEvent], int]:
        kv = await self._bucket()
        try:
            entry = await kv.get(fmt.HEAD)
        except KeyNotFound:
            raise NoSnapshot(f"there is none yet (bucket {fmt.BUCKET})") from None
        try:
            head = fmt.decode_head(entry.value or b"")
        except ValueError as exc:
            raise SnapshotUnusable(f"head: {exc}") from None
        if head.stream_created != self.stream_created:
            raise SnapshotUnusable(f"it was made of a stream created {head.stream_created[:40]}, {STREAM} was created {self.stream_created}")
        if head.seq > state.last_sequence:
            raise SnapshotUnusable(f"it covers sequence {head.seq}, past the stream's last ({state.last_sequence})")
        if state.first_sequence > head.seq + 1:  # (an empty stream's first is one past its last)
            raise SnapshotUnusable(f"the stream no longer holds the messages after {head.seq} (its first is {state.first_sequence})")
        if head.size > state.bytes:  # its decisions are messages of the stream: never more bytes than it holds
            raise SnapshotUnusable(f"its body of {head.size} bytes is larger than {STREAM} ({state.bytes} bytes)")
        body = await self._body(kv, head)
        decisions = await asyncio.to_thread(decode_body, head, body)
        await self._check_sample(decisions, head.seq)
        tail = await self._tail(head.seq, state.last_sequence)
        self.head, self.tail_messages = head, state.last_sequence - head.seq
        self.since = self.tail_messages
        log.info(
            "allocator: loaded the snapshot of %s at sequence %d (%d decisions), %d messages after it", STREAM, head.seq, len(decisions), self.tail_messages
        )
        return merge(decisions, tail), state.last_sequence

    async def _bucket(self) -> KeyValue:
        try:
            kv = await self.bus.key_value(fmt.BUCKET)
            config = await self.bus.stream_config(f"KV_{fmt.BUCKET}")
        except (NatsError, TimeoutError) as exc:
            raise SnapshotUnusable(f"bucket {fmt.BUCKET}: {exc or type(exc).__name__}") from None
        if problems := bucket_problems(config, replicas_from_env()):
            raise SnapshotUnusable(f"bucket {fmt.BUCKET} is weakened: {'; '.join(problems)}")
        return kv

    async def _body(self, kv: KeyValue, head: fmt.SnapshotHead) -> bytes:
        async def chunk(i: int) -> bytes:
            try:
                value = (await kv.get(fmt.chunk_key(head.chunk_set, i))).value or b""
            except KeyNotFound:
                raise SnapshotUnusable(f"chunk {fmt.chunk_key(head.chunk_set, i)} is missing") from None
            if len(value) > head.size:
                raise SnapshotUnusable(f"chunk {fmt.chunk_key(head.chunk_set, i)} is larger than the whole body")
            return value

        parts: list[bytes] = []
        read = 0
        for start in range(0, head.chunks, 64):  # (64 reads in flight at once)
            parts += await asyncio.gather(*(chunk(i) for i in range(start, min(start + 64, head.chunks))))
            read = sum(map(len, parts))
            if read > head.size:
                raise SnapshotUnusable(f"its chunks hold more than the {head.size} bytes the head says")
        return b"".join(parts)

    async def _check_sample(self, decisions: list[ev.AllocationEvent], seq: int) -> None:
        """Each sampled decision is the stream's last for its claim, unless that last came after `seq`."""

        async def check(event: ev.AllocationEvent) -> None:
            msg = await self.bus.last_message(STREAM, event.subject)
            if msg is None:
                raise SnapshotUnusable(f"it holds a decision for {event.subject}, of which {STREAM} holds none")
            if msg.sequence > seq:
                return  # decided again after the snapshot: the tail has it
            try:
                held = ev.decode(msg.data)
            except ev.EventDecodeError:
                return  # an unusable message there: the replay's rule (the last usable counts) decides, not this check
            if held != event:
                raise SnapshotUnusable(f"its decision for {event.subject} is not the one {STREAM} holds (sequence {msg.sequence})")

        sample = random.sample(decisions, min(SAMPLE, len(decisions)))  # (a writer cannot tell which)
        await asyncio.gather(*(check(event) for event in sample))

    async def _tail(self, after: int, upto: int) -> list[ev.AllocationEvent]:
        """The last usable decision per subject among ALLOCATIONS' messages `after` < seq <= `upto`, in stream order."""
        if upto <= after:
            return []
        latest: dict[str, ev.AllocationEvent] = {}

        def take(msg: StoredMessage) -> None:
            try:
                event = ev.decode(msg.data)
            except ev.EventDecodeError as exc:
                log.error("replay of %s: skipped %s (seq %d): %s", STREAM, msg.subject[:200], msg.sequence, " ".join(str(exc).split())[:500])
                return
            if (problem := streamcheck.misplaced(STREAM, msg.subject, event)) is not None:
                log.error("replay of %s: skipped %s (seq %d): %s", STREAM, msg.subject[:200], msg.sequence, problem)
                return
            if not isinstance(event, ev.AllocationCommitted | ev.AllocationFailed | ev.AllocationReleased):
                return  # an EvictionRequested: a request, not a decision (its own subject)
            latest.pop(msg.subject, None)  # (the event's own subject, `misplaced` says)
            latest[msg.subject] = event

        # (checked with the leader: the fence expects `upto`, and a replica behind would leave
        # decisions unread that the term's first write then passes)
        await self.bus.scan(STREAM, take, subjects=["dra.allocations.>"], start_seq=after + 1, upto=upto, leader_checked=True)
        return list(latest.values())

    # -- the leader's writes --------------------------------------------------------------

    def stored(self, first_seq: int, events: Sequence[ev.AllocationEvent]) -> None:
        """This term's write was stored at `first_seq`..: the compacted record follows it."""
        self.since += self.compacted.stored(first_seq, events)
        if self.policy.due(self.since, time.monotonic() - self.written_at, len(self.compacted.latest)):
            self.changed.set()

    async def keep(self, term: asyncio.Event, may_write: Callable[[], bool] = lambda: True, final: Callable[[], bool] = lambda: False) -> None:
        """Write a snapshot whenever the policy says, until the term ends, and then once more if `final()`
        says the end is a clean stop (a handover: the successor replays nothing), while `may_write()`
        (the lease is still ours). A failed write is logged and tried again at the next occasion: a
        term without snapshots only makes the next rebuild longer."""
        ended = asyncio.ensure_future(term.wait())
        try:
            while True:
                changed = asyncio.ensure_future(self.changed.wait())
                await asyncio.wait({changed, ended}, timeout=min(self.policy.seconds, 5.0), return_when=asyncio.FIRST_COMPLETED)
                changed.cancel()
                self.changed.clear()
                if term.is_set():
                    if final() and may_write():
                        await self.write_logged()
                    return
                if may_write() and self.policy.due(self.since, time.monotonic() - self.written_at, len(self.compacted.latest)):
                    await self.write_logged()
        finally:
            ended.cancel()

    async def write_logged(self) -> None:
        """`write`, logging instead of raising: the term goes on without a snapshot (the next rebuild is
        only longer), whatever went wrong with the bucket."""
        try:
            await self.write()
        except Exception as exc:
            log.warning("allocator: snapshot not written: %s", str(exc)[:500] or type(exc).__name__)

    async def write(self) -> fmt.SnapshotHead | None:
        """Write the compacted record as it stands (None: nothing new since the last snapshot)."""
        seq, decisions = self.compacted.seq, list(self.compacted.latest.values())
        if seq == 0 or (self.head is not None and self.head.seq == seq):
            return None
        started = time.perf_counter()
        kv = await self._bucket()
        chunk_size = self.bus.max_payload - CHUNK_HEADROOM
        body = await asyncio.to_thread(encode_body, decisions)
        chunk_set = fmt.CHUNK_SETS[1] if self.head is not None and self.head.chunk_set == fmt.CHUNK_SETS[0] else fmt.CHUNK_SETS[0]
        head = make_head(body, len(decisions), seq=seq, stream_created=self.stream_created, chunk_set=chunk_set, chunk_size=chunk_size, epoch=self.epoch())
        if head.size > fmt.MAX_BODY_BYTES or head.chunks > fmt.MAX_CHUNKS:
            raise SnapshotUnusable(f"{len(decisions)} decisions make {head.size} bytes, more than a snapshot holds")
        parts = chunks_of(body, chunk_size)
        for start in range(0, len(parts), 16):
            await asyncio.gather(*(kv.put(fmt.chunk_key(chunk_set, start + i), part) for i, part in enumerate(parts[start : start + 16])))
        await kv.put(fmt.HEAD, fmt.encode_head(head))
        self.head, self.written_at = head, time.monotonic()
        self.since = self.compacted.seq - seq  # (decisions stored while it was written)
        log.info(
            "allocator: snapshot of %s at sequence %d written (%d decisions, %d bytes, %.3fs)",
            STREAM,
            seq,
            len(decisions),
            head.size,
            time.perf_counter() - started,
        )
        return head
