"""Reading NATS message headers faster than nats-py does, with the same result.

nats-py (2.16) parses every received message's header block with
`Client._parse_header_lines`, which tests each header name for whitespace one character
at a time in a Python generator: for a decision's five headers (message id, the fence's
two expectations, the epoch, the trace context) about a hundred generator steps per
message, a tenth of the status writer's CPU in a profile of `dralloc bench pipeline`.
`parse_header_lines` does exactly what it does, the whitespace test as one regular
expression search (``\\s`` in a str pattern is the same Unicode test as `str.isspace`);
`install` puts it in nats-py's place, once, when the bus is imported (nothing else of
dralloc imports nats-py). tests/bus/test_headers.py holds the two to the same answers.

Writing them too: nats-py's `Client._send_publish` builds each sent message's header block
checking every name with a regular expression and encoding it afresh (~11 us for a decision's
five headers under load, about a quarter of a send). `header_block` builds the same bytes with
each name checked and encoded once per process (`_NAMES`), and `install` puts a `_send_publish`
that uses it in nats-py's place (otherwise nats-py's own, line for line).
"""

from __future__ import annotations

import re
from typing import Any

from nats import errors
from nats.aio.client import _HEADER_KEY_RE, _HEADER_VALUE_NEWLINES, Client
from nats.protocol import command

_WHITESPACE = re.compile(r"\s")
_CRLF = b"\r\n"

ORIGINAL = Client._parse_header_lines
"""nats-py's own parser (kept for the tests that compare)."""

ORIGINAL_SEND = Client._send_publish
"""nats-py's own publish (kept for the tests that compare)."""

_NAMES: dict[str, bytes] = {}
"""Header name -> ``b"Name: "``, once checked as nats-py checks it (a process sends a few names)."""

_MAX_NAMES = 1024
"""Names remembered at most (names are the sender's own, but the cache stays bounded whatever comes)."""


def parse_header_lines(raw: bytes) -> dict[str, str]:
    """A NATS header block (``Name: Value\\r\\n`` per line) as nats-py's `_parse_header_lines` reads
    it: lines without a colon, names that are not ASCII or hold whitespace skipped, values stripped
    and decoded as UTF-8 (undecodable bytes replaced)."""
    out: dict[str, str] = {}
    for line in raw.split(_CRLF):
        if not line:
            continue
        name, sep, value = line.partition(b":")
        if not sep:
            continue
        try:
            key = name.strip().decode("ascii")
        except UnicodeDecodeError:
            continue
        if _WHITESPACE.search(key):
            continue
        out[key] = value.strip().decode("utf-8", "replace")
    return out


def header_block(headers: dict[str, Any]) -> bytes:
    """The header block nats-py's `_send_publish` writes for `headers` (``NATS/1.0``, one ``Name: value``
    line each, names stripped and empty ones skipped, values stripped with line breaks made spaces,
    a blank line); raises nats-py's `BadHeaderError` for a name it refuses."""
    parts = [b"NATS/1.0\r\n"]
    for name, value in headers.items():
        prefix = _NAMES.get(name)
        if prefix is None:
            key = name.strip()
            if not key:
                continue
            if not _HEADER_KEY_RE.fullmatch(key):
                raise errors.BadHeaderError(key)
            prefix = key.encode() + b": "
            if len(_NAMES) < _MAX_NAMES:
                _NAMES[name] = prefix
        parts += (prefix, value.strip().translate(_HEADER_VALUE_NEWLINES).encode(), _CRLF)
    parts.append(_CRLF)
    return b"".join(parts)


async def send_publish(self: Client, subject: str, reply: str, payload: bytes, payload_size: int, headers: dict[str, Any] | None) -> None:
    """nats-py's `Client._send_publish` (2.16), its header block made by `header_block`."""
    if subject == "":
        raise errors.BadSubjectError
    if headers is None:
        pub_cmd = command.pub_cmd(subject, reply, payload)
    else:
        pub_cmd = command.hpub_cmd(subject, reply, header_block(headers), payload)
    self.stats["out_msgs"] += 1
    self.stats["out_bytes"] += payload_size
    await self._send_command(pub_cmd)
    if self._flush_queue is not None and self._flush_queue.empty():
        await self._flush_pending()


def install() -> None:
    """Make nats-py read headers with `parse_header_lines` and write them with `header_block` (idempotent)."""
    Client._parse_header_lines = staticmethod(parse_header_lines)  # type: ignore[method-assign]  # nats-py's staticmethod, same signature
    Client._send_publish = send_publish  # type: ignore[method-assign]  # nats-py's method, same signature


def installed() -> bool:
    """Whether nats-py reads headers with `parse_header_lines` and writes them with `header_block`."""
    return Client._parse_header_lines is parse_header_lines and Client._send_publish is send_publish
