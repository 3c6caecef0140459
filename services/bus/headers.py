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
"""

from __future__ import annotations

import re

from nats.aio.client import Client

_WHITESPACE = re.compile(r"\s")
_CRLF = b"\r\n"

ORIGINAL = Client._parse_header_lines
"""nats-py's own parser (kept for the tests that compare)."""


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


def install() -> None:
    """Make nats-py read headers with `parse_header_lines` (idempotent)."""
    Client._parse_header_lines = staticmethod(parse_header_lines)  # type: ignore[method-assign]  # nats-py's staticmethod, same signature


def installed() -> bool:
    """Whether nats-py reads headers with `parse_header_lines`."""
    return Client._parse_header_lines is parse_header_lines
