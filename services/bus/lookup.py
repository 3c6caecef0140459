"""Reading what a stream holds now, without consuming it: a subject's last message, a stream's
size and age (the allocator's checks before it releases a claim, `dralloc submit --wait`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING

import nats.js.errors
from nats.js.api import StreamConfig

if TYPE_CHECKING:
    from dralloc.bus.client import Bus


@dataclass(frozen=True)
class StoredMessage:
    """A message as its stream keeps it."""

    stream: str
    sequence: int
    subject: str
    data: bytes
    """The body (empty when the server sent none)."""
    time: datetime | None
    """When the server stored it (UTC), if it said."""
    headers: dict[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class StreamState:
    """A stream's size and age now."""

    messages: int
    first_sequence: int
    last_sequence: int
    created: datetime | None
    """When the stream was created (a stream recreated empty has a later time)."""
    bytes: int = 0
    """The size of what it holds (bodies, headers and subjects)."""
    consumers: int = 0
    """Consumers open on it now (durable and ephemeral)."""


async def last_message(bus: Bus, stream: str, subject: str) -> StoredMessage | None:
    """`Bus.last_message`: the last message `stream` holds on `subject`, None when it holds none."""
    try:
        msg = await bus._js.get_last_msg(stream, subject)
    except nats.js.errors.NotFoundError:
        return None
    return StoredMessage(
        stream=stream,
        sequence=msg.seq or 0,
        subject=msg.subject or subject,
        data=msg.data or b"",
        time=msg.time,
        headers=dict(msg.headers or {}),
    )


async def stream_state(bus: Bus, stream: str) -> StreamState:
    """`Bus.stream_state`: how many messages `stream` holds, its first and last sequence, when it was created."""
    info = await bus._js.stream_info(stream)
    state = info.state
    return StreamState(
        messages=state.messages,
        first_sequence=state.first_seq,
        last_sequence=state.last_seq,
        created=info.created,
        bytes=state.bytes or 0,
        consumers=state.consumer_count or 0,
    )


async def subject_counts(bus: Bus, stream: str, subjects: str = ">") -> dict[str, int]:
    """`Bus.subject_counts`: how many messages `stream` holds on each subject matching `subjects` (a
    filter with wildcards), for the subjects that hold any."""
    info = await bus._js.stream_info(stream, subjects_filter=subjects)
    return dict(info.state.subjects or {})


async def stream_config(bus: Bus, stream: str) -> StreamConfig:
    """`Bus.stream_config`: `stream`'s configuration as the server holds it (a KV bucket's stream is ``KV_<bucket>``)."""
    return (await bus._js.stream_info(stream)).config
