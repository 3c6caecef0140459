"""Replaying a stream: the last usable event per subject, as a snapshot to rebuild state from at start."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from dralloc.bus import streamcheck
from dralloc.bus.errors import ReplicaBehind
from dralloc.bus.lookup import StoredMessage
from dralloc.schemas import events
from dralloc.schemas.events import Event, EventDecodeError

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

log = logging.getLogger("dralloc.bus")

READ_ATTEMPTS = 4
"""Reads of a replay before a replica that is still behind its leader is `ReplicaBehind`."""
READ_AGAIN_S = 0.25
"""Pause before the next read, times the attempts so far (a restarted server catches up in moments)."""


async def replay(bus: Bus, stream: str, filter_subject: str | None = None, *, leader_checked: bool = False) -> tuple[list[Event], int]:
    """`Bus.replay`: the last usable event per subject now in `stream`, in stream order, and the stream's last sequence.

    Usable: decodable, and belonging in the stream under that subject (`streamcheck.misplaced`);
    anything else is skipped and reported (`_skip_in_replay`). When a subject's last message is
    not usable, the last usable one before it counts (in a stream that keeps history, as
    ALLOCATIONS does): junk published after a decision must not hide the decision.

    The last sequence is the leader's (stream info), the messages are read through a consumer on
    any of the stream's servers: a replica catching up would hand over fewer, and a caller that
    fences or follows from that sequence would skip what it never read. `leader_checked`: the read
    is checked with the leader (`Bus.scan`'s `leader_checked`) and made again, and `ReplicaBehind`
    raised when it still falls short after `READ_ATTEMPTS` (the allocator's rebuild); without,
    what the consumer delivered."""
    info = await bus._js.stream_info(stream)
    last_seq = info.state.last_seq
    if info.state.messages == 0:
        return [], last_seq
    for attempt in range(1, READ_ATTEMPTS + 1):
        found: list[tuple[int, Event]] = []
        hidden: list[tuple[str, int]] = []
        try:
            # ("last per subject" needs an explicit filter: the stream's own subjects by default)
            subjects = [filter_subject] if filter_subject else None
            await bus.scan(stream, _usable(stream, found, hidden), subjects=subjects, last_per_subject=True, upto=last_seq, leader_checked=leader_checked)
            break
        except ReplicaBehind as exc:
            if attempt == READ_ATTEMPTS:
                raise
            log.warning("replay of %s; reading again", exc)
            await asyncio.sleep(READ_AGAIN_S * attempt)
    for subject, seq in hidden:
        earlier: list[tuple[int, Event]] = []
        await bus.scan(stream, _usable(stream, earlier, []), subjects=[subject], upto=seq - 1)
        if earlier:
            found.append(earlier[-1])
    found.sort(key=lambda pair: pair[0])
    return [event for _, event in found], last_seq


def _usable(stream: str, found: list[tuple[int, Event]], unusable: list[tuple[str, int]]) -> Callable[[StoredMessage], None]:
    """A scan's callback: usable events (with their sequences) go to `found`, the subject and
    sequence of each unusable message to `unusable` (and reported: `_skip_in_replay`)."""

    def take(msg: StoredMessage) -> None:
        try:
            event = events.decode(msg.data)
        except EventDecodeError as exc:
            _skip_in_replay(msg, str(exc))
            unusable.append((msg.subject, msg.sequence))
            return
        if (problem := streamcheck.misplaced(stream, msg.subject, event)) is not None:
            _skip_in_replay(msg, problem)  # never restored: forged or misfiled
            unusable.append((msg.subject, msg.sequence))
            return
        found.append((msg.sequence, event))

    return take


def _skip_in_replay(msg: StoredMessage, reason: str) -> None:
    """Report a message a replay leaves out (logged with its stream, sequence and reason). It is not
    dead-lettered here: the consumer that read it when it arrived did that, once, and a rebuild
    happens at every start."""
    log.error("replay of %s: skipped %s (seq %d): %s", msg.stream, msg.subject, msg.sequence, " ".join(reason.split())[:1000])
