"""Replaying a stream: the last usable event per subject, as a snapshot to rebuild state from at start."""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from dralloc.bus import streamcheck
from dralloc.bus.streams import FETCH_WAIT_S, STREAMS
from dralloc.schemas import events
from dralloc.schemas.events import Event, EventDecodeError

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

log = logging.getLogger("dralloc.bus")


async def replay(bus: Bus, stream: str, filter_subject: str | None = None) -> tuple[list[Event], int]:
    """`Bus.replay`: the last usable event per subject now in `stream`, in stream order, and the stream's last sequence.

    Usable: decodable, and belonging in the stream under that subject (`streamcheck.misplaced`);
    anything else is skipped and reported (`_skip_in_replay`). When a subject's last message is
    not usable, the last usable one before it counts (in a stream that keeps history, as
    ALLOCATIONS does): junk published after a decision must not hide the decision."""
    info = await bus.js.stream_info(stream)
    last_seq = info.state.last_seq
    if info.state.messages == 0:
        return [], last_seq
    config = ConsumerConfig(
        deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
        ack_policy=AckPolicy.NONE,
        inactive_threshold=30.0,
        mem_storage=True,
        # "last per subject" needs an explicit filter; default to the stream's own subjects.
        filter_subjects=[filter_subject] if filter_subject else list(STREAMS[stream].subjects or [">"]),
    )
    found: list[tuple[int, Event]] = []
    hidden: list[tuple[str, int]] = []
    await _scan(bus, stream, config, last_seq, found, hidden)
    for subject, seq in hidden:
        earlier: list[tuple[int, Event]] = []
        history = ConsumerConfig(
            deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0, mem_storage=True, filter_subjects=[subject]
        )
        await _scan(bus, stream, history, seq - 1, earlier, [])
        if earlier:
            found.append(earlier[-1])
    found.sort(key=lambda pair: pair[0])
    return [event for _, event in found], last_seq


async def _scan(bus: Bus, stream: str, config: ConsumerConfig, upto: int, found: list[tuple[int, Event]], unusable: list[tuple[str, int]]) -> None:
    """Read `stream` through an ephemeral consumer with `config`, up to sequence `upto`: usable events
    (with their sequences) go to `found`, the subject and sequence of each unusable one to `unusable`."""
    sub = await bus.js.pull_subscribe("", durable=None, stream=stream, config=config)
    try:
        pending = (await sub.consumer_info()).num_pending or 0
        while pending > 0:
            try:
                messages = await sub.fetch(min(pending, 512), timeout=FETCH_WAIT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                # Messages counted may be gone before they are delivered (a ClaimDeleted
                # expired, an event superseded): ask the server what is left.
                pending = (await sub.consumer_info()).num_pending or 0
                continue
            for msg in messages:
                pending = msg.metadata.num_pending
                seq = msg.metadata.sequence.stream
                if seq > upto:
                    continue  # published after the snapshot: the caller's live consumer sees it
                try:
                    event = events.decode(msg.data)
                except EventDecodeError as exc:
                    await _skip_in_replay(stream, msg, str(exc))
                    unusable.append((msg.subject, seq))
                    continue
                if (problem := streamcheck.misplaced(stream, msg.subject, event)) is not None:
                    await _skip_in_replay(stream, msg, problem)  # never restored: forged or misfiled
                    unusable.append((msg.subject, seq))
                    continue
                found.append((seq, event))
    finally:
        with contextlib.suppress(Exception):
            await sub.unsubscribe()


async def _skip_in_replay(stream: str, msg: Msg, reason: str) -> None:
    """Report a message a replay leaves out (logged with its stream, sequence and reason). It is not
    dead-lettered here: the consumer that read it when it arrived did that, once, and a rebuild
    happens at every start."""
    log.error("replay of %s: skipped %s (seq %d): %s", stream, msg.subject, msg.metadata.sequence.stream, " ".join(reason.split())[:1000])
