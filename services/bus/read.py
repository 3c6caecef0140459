"""Reading a stream's messages as they are stored, without acking or keeping a consumer: once through
(`scan`: a replay, `dralloc get`/`top`'s snapshot, the allocator's tail after its snapshot) or as
they arrive (`follow`: `dralloc top --watch`). Both hand over `StoredMessage`s, never nats-py's.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable, Sequence
from typing import TYPE_CHECKING

import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from dralloc.bus.errors import ReplicaBehind
from dralloc.bus.lookup import StoredMessage
from dralloc.bus.streams import FETCH_WAIT_S, STREAMS

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

DELETE_WAIT_S = 1.0
"""How long a scan waits for its consumer's deletion (`scan_js`'s `delete`) before leaving it to expire."""

SCAN_BATCH = 512
"""Messages per pull of a scan (a fetch asks for no more than are pending: a short batch would wait out its timeout)."""


def stored(stream: str, msg: Msg) -> StoredMessage:
    """A consumer-delivered message as its stream keeps it."""
    meta = msg.metadata
    return StoredMessage(
        stream=stream, sequence=meta.sequence.stream, subject=msg.subject, data=msg.data or b"", time=meta.timestamp, headers=dict(msg.headers or {})
    )


def _filter(stream: str, subjects: Sequence[str] | None) -> list[str] | None:
    """The subjects a consumer of `stream` reads: those given, else the stream's own (dralloc's streams), else all."""
    if subjects:
        return list(subjects)
    known = STREAMS.get(stream)
    return list(known.subjects) if known is not None and known.subjects else None


async def scan(
    bus: Bus,
    stream: str,
    on_message: Callable[[StoredMessage], None],
    *,
    subjects: Sequence[str] | None = None,
    last_per_subject: bool = False,
    start_seq: int | None = None,
    upto: int | None = None,
    leader_checked: bool = False,
) -> None:
    """`Bus.scan`: call `on_message` for each message of `stream`, in stream order, and return once
    every message the stream held when the scan started has been seen (or has vanished meanwhile:
    an expired tombstone, a superseded event are not waited for).

    `subjects`: only those (default: the stream's own subjects, i.e. everything); `last_per_subject`:
    only each subject's last message; `start_seq`: from that sequence on; `upto`: no message after
    that sequence (one published after a snapshot belongs to the caller's live consumer). The reading
    consumer is ephemeral, in memory and unacknowledged: nothing about the stream changes.

    The consumer is on any of the stream's servers, and one still catching up delivers fewer than
    its leader holds. `leader_checked` (with `upto`, the leader's sequence the caller fences or
    follows from; one subject or the whole stream): the leader is asked whether it holds a message
    after the last one delivered (`first_after`; the credential needs the stream's
    ``$JS.API.STREAM.MSG.GET``), and `ReplicaBehind` is raised if it does."""
    if not leader_checked:
        await scan_js(bus._js, stream, on_message, subjects=subjects, last_per_subject=last_per_subject, start_seq=start_seq, upto=upto)
        return
    if upto is None or (subjects is not None and len(subjects) != 1):
        raise ValueError("a leader-checked scan reads up to a sequence, one subject or the whole stream")
    highest = (start_seq or 1) - 1  # the last sequence delivered, whatever the caller makes of it

    def deliver(msg: StoredMessage) -> None:
        nonlocal highest
        highest = max(highest, msg.sequence)
        on_message(msg)

    await scan_js(bus._js, stream, deliver, subjects=subjects, last_per_subject=last_per_subject, start_seq=start_seq, upto=upto)
    if (behind := await first_after(bus, stream, highest, upto, subjects[0] if subjects else ">")) is not None:
        raise ReplicaBehind(f"{stream}: read to sequence {highest}, its leader holds {behind} (of {upto}): a replica behind its leader answered")


async def scan_js(
    js: JetStreamContext,
    stream: str,
    on_message: Callable[[StoredMessage], None],
    *,
    subjects: Sequence[str] | None = None,
    last_per_subject: bool = False,
    start_seq: int | None = None,
    upto: int | None = None,
    delete: bool = False,
) -> None:
    """`scan` on a JetStream context (a key-value bucket's own: `kv.items`). `delete`: delete the
    reading consumer when done, for a reader allowed to (see below)."""
    if last_per_subject:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.LAST_PER_SUBJECT)
    elif start_seq is not None:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=start_seq)
    else:
        config = ConsumerConfig(deliver_policy=DeliverPolicy.ALL)
    config.ack_policy, config.inactive_threshold, config.mem_storage = AckPolicy.NONE, 30.0, True
    # ("last per subject" needs an explicit filter: the stream's subjects by default)
    config.filter_subjects = _filter(stream, subjects)
    sub = await js.pull_subscribe("", durable=None, stream=stream, config=config)
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        while pending > 0:
            try:
                messages = await sub.fetch(min(pending, SCAN_BATCH), timeout=FETCH_WAIT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                # Messages counted may be gone before they are delivered: ask the server what is left.
                pending = (await sub.consumer_info()).num_pending or 0
                continue
            for msg in messages:
                pending = msg.metadata.num_pending
                seq = msg.metadata.sequence.stream
                if upto is not None and seq > upto:
                    if not last_per_subject:
                        return  # (delivered in sequence order: nothing after it is wanted)
                    continue
                on_message(stored(stream, msg))
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        # An ephemeral pull consumer outlives its subscription until its inactive_threshold, 30 s:
        # reads in quick succession pile them up, and with 1,000 open on a stream this nats-server
        # refuses the next, "maximum consumers limit reached" (50 reads at once, 20 times over).
        # Only on request: the services' credentials may not delete consumers (infra/nats/auth.conf:
        # one that could might delete another service's), and a refused request is answered by
        # nothing but its timeout (the allocator's rebuild waited 5 s a scan so).
        if delete:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(js.delete_consumer(stream, sub._consumer), DELETE_WAIT_S)


async def first_after(bus: Bus, stream: str, seq: int, upto: int, subject: str = ">") -> int | None:
    """`Bus.first_after`: the sequence of the first message on `subject` that `stream` holds after
    `seq`, up to `upto`, as the stream's leader answers (a message get, not a consumer on a replica
    that may lag, nor a direct get that any replica answers); None when it holds none there.

    A read through a consumer that delivered up to `seq` of a stream whose last sequence was `upto`
    when the read began saw everything iff this is None: what came after it was deleted or
    superseded, or was never there."""
    if seq >= upto:
        return None
    try:
        msg = await bus._js.get_msg(stream, seq=seq + 1, subject=subject, next=True)
    except nats.js.errors.NotFoundError:
        return None
    return msg.seq if msg.seq is not None and msg.seq <= upto else None


@contextlib.asynccontextmanager
async def follow(
    bus: Bus, stream: str, on_message: Callable[[StoredMessage], None], *, after: int, subjects: Sequence[str] | None = None
) -> AsyncIterator[None]:
    """`Bus.follow`: while inside, call `on_message` for each message stored in `stream` after
    sequence `after` (of `subjects`, default the stream's own), in order, as it arrives (an ordered
    push consumer per subject filter, recreated by nats-py on a gap: nothing is acked or kept)."""
    subs = []

    async def deliver(msg: Msg) -> None:
        on_message(stored(stream, msg))

    try:
        for subject in _filter(stream, subjects) or [">"]:
            config = ConsumerConfig(deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=after + 1)
            subs.append(await bus._js.subscribe(subject, stream=stream, ordered_consumer=True, config=config, cb=deliver))
        yield
    finally:
        for sub in subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
