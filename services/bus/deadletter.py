"""Dead letters: messages a consumer can never process, kept in the DEADLETTER stream.

A dead letter is published on ``dra.deadletter.<stream>.<consumer>`` with headers
``Dralloc-Reason``, ``Dralloc-Subject`` (the original subject) and ``Dralloc-Sequence``;
it always fits under the server's max payload (`dead_letter_message` cuts its body when needed).
"""

from __future__ import annotations

import json
import logging
from typing import TYPE_CHECKING

import msgspec
import nats.js.errors
from nats.aio.msg import Msg

from dralloc.bus.streams import header_bytes
from dralloc.schemas import events

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

log = logging.getLogger("dralloc.bus")


class DeadLetter(msgspec.Struct, rename="camel", kw_only=True):
    """A message a consumer could never process, as `dralloc get deadletters` shows it."""

    sequence: int
    stream: str
    consumer: str
    subject: str
    """Where the message was published."""
    original_sequence: int
    reason: str
    data: str
    """The message as it was (UTF-8; undecodable bytes replaced)."""


DEAD_LETTER_HEADROOM = 512
"""Bytes kept free under the server's max payload when a dead letter is cut (the client and the
server add a little framing of their own)."""


def dead_letter_message(stream: str, consumer: str, seq: int, subject: str, data: bytes, reason: str, max_payload: int) -> tuple[str, dict[str, str], bytes]:
    """The dead letter of message `seq` of `stream`: (its original subject as shown, headers, body).

    It always fits under `max_payload`, headers included (a message over it makes the server close
    the connection, and the consumer would decide nothing more): the body is the original message
    when it fits, else its first bytes, with ``Dralloc-Truncated: <original size>``; the original
    stays in `stream` at ``Dralloc-Sequence`` for as long as the stream keeps it."""
    reason = " ".join(reason.split())[:1000]  # a header value is one line
    shown = subject if len(subject) <= 512 else f"{subject[:509]}..."
    headers = {
        "Nats-Msg-Id": f"deadletter:{stream}:{consumer}:{seq}",  # several watchers: one letter
        "Dralloc-Reason": reason,
        "Dralloc-Subject": shown,
        "Dralloc-Sequence": str(seq),
        "Dralloc-Stream": stream,
    }
    room = max_payload - header_bytes(headers) - len("Dralloc-Truncated: 18446744073709551615\r\n") - DEAD_LETTER_HEADROOM
    if len(data) > room:
        headers["Dralloc-Truncated"] = str(len(data))
        data = data[: max(room, 0)]
    return shown, headers, data


async def dead_letter(bus: Bus, msg: Msg, stream: str, consumer: str, reason: str) -> None:
    """Dead-letter a consumer's message and tell JetStream never to deliver it again."""
    await publish_dead_letter(bus, stream, consumer, msg.metadata.sequence.stream, msg.subject, msg.data, reason)
    await msg.term()


async def exhausted(bus: Bus, advisory: Msg, stream: str, consumer: str) -> None:
    """Dead-letter the message a max-deliveries `advisory` names (never raises: a subscription callback)."""
    try:
        info = json.loads(advisory.data)
        seq, deliveries = int(info["stream_seq"]), int(info["deliveries"])
        original = await bus._js.get_msg(stream, seq)
        reason = f"delivered {deliveries} times without an ack (the consumer died or timed out on each)"
        await publish_dead_letter(bus, stream, consumer, seq, original.subject or "", original.data or b"", reason)
    except Exception as exc:  # a callback must not raise; the message stays in its stream
        log.error("%s: could not dead-letter an exhausted message of %s: %s", consumer, stream, exc)


async def publish_dead_letter(bus: Bus, stream: str, consumer: str, seq: int, subject: str, data: bytes, reason: str) -> None:
    """Store the dead letter of message `seq` of `stream` (`dead_letter_message`) and log it."""
    subject_shown, headers, data = dead_letter_message(stream, consumer, seq, subject, data, reason, bus._nc.max_payload)
    log.error("%s: dead-lettered %s (stream %s seq %d): %s", consumer, subject_shown, stream, seq, headers["Dralloc-Reason"])
    await bus._js.publish(f"dra.deadletter.{events.encode_token(stream)}.{events.encode_token(consumer)}", data, headers=headers)


async def dead_letters(bus: Bus, limit: int = 100) -> list[DeadLetter]:
    """`Bus.dead_letters`: the most recent dead letters (at most `limit`), oldest first."""
    state = (await bus._js.stream_info("DEADLETTER")).state
    found: list[DeadLetter] = []
    if not state.messages or limit < 1:
        return found  # an empty stream reports first_seq 0, which no message has
    for seq in range(max(state.first_seq, state.last_seq - limit + 1, 1), state.last_seq + 1):
        try:
            msg = await bus._js.get_msg("DEADLETTER", seq)
        except nats.js.errors.NotFoundError:
            continue  # expired or deleted
        headers = msg.headers or {}
        _, _, stream, consumer = (msg.subject or "").split(".", 3)
        found.append(
            DeadLetter(
                sequence=seq,
                stream=events.decode_token(stream),
                consumer=events.decode_token(consumer),
                subject=headers.get("Dralloc-Subject", ""),
                original_sequence=int(headers.get("Dralloc-Sequence", "0") or 0),
                reason=headers.get("Dralloc-Reason", ""),
                data=(msg.data or b"").decode("utf-8", errors="replace"),
            )
        )
    return found
