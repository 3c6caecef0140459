"""`dralloc.bus.headers.parse_header_lines` reads header blocks exactly as nats-py's own parser does,
and is the one nats-py uses once the bus is imported."""

from __future__ import annotations

import pytest

from dralloc.bus import Bus, headers

BLOCKS = [
    b"",
    b"\r\n",
    b"Nats-Msg-Id: committed:uid-1:1@abc:7\r\nNats-Expected-Last-Sequence: 6\r\ntraceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n\r\n",
    b"Name:Value\r\nOther:\tTabbed  \r\n",  # no space after the colon, whitespace around the value
    b"No colon here\r\nKey: v\r\n",
    b"Bad Key: with a space in the name\r\nGood: kept\r\n",
    b"Tab\tKey: x\r\nVert\x0bKey: y\r\nSep\x1cKey: z\r\n",  # whitespace of every kind in names
    b"Caf\xc3\xa9: non-ascii name\r\nValue: caf\xc3\xa9 \xff broken\r\n",
    b"Dup: first\r\nDup: second\r\n",
    b"Empty:\r\n: no name\r\n",
    b"Colon: a:b:c\r\n",
]


@pytest.mark.parametrize("block", BLOCKS, ids=range(len(BLOCKS)))
def test_headers_read_as_nats_py_reads_them(block: bytes):
    assert headers.parse_header_lines(block) == headers.ORIGINAL(block)


def test_the_bus_makes_nats_py_use_both():
    assert Bus is not None  # (importing the bus installed it)
    assert headers.installed()


SENT = [
    None,
    {},
    {"Nats-Msg-Id": "committed:uid-1:1@abc:7", "Nats-Expected-Last-Sequence": "6", "traceparent": "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"},
    {" Padded ": "  value with spaces  ", "": "empty name skipped", "   ": "blank name skipped"},
    {"Breaks": "line\r\nbreak\rand\nmore", "Unicode": "café ☃"},
    {"Dup": "first", "dup": "second"},
]


class _Recorder:
    """Enough of a nats-py Client for `_send_publish`: what it would send, recorded."""

    def __init__(self) -> None:
        self.stats = {"out_msgs": 0, "out_bytes": 0}
        self._flush_queue = None
        self.sent: list[bytes] = []

    async def _send_command(self, cmd: bytes) -> None:
        self.sent.append(bytes(cmd))


async def _sent_by(send, marks) -> tuple[list[bytes], dict]:
    client = _Recorder()
    for _ in range(2):  # (the second time from the names already checked)
        await send(client, "dra.allocations.ml.a", "_INBOX.x.1", b'{"k":1}', 7, None if marks is None else dict(marks))
    return client.sent, client.stats


@pytest.mark.parametrize("marks", SENT, ids=range(len(SENT)))
async def test_headers_written_as_nats_py_writes_them(marks):
    assert await _sent_by(headers.send_publish, marks) == await _sent_by(headers.ORIGINAL_SEND, marks)


@pytest.mark.parametrize("name", ["Bad Name", "Colon:", "Caf\u00e9", "New\nLine"])
async def test_a_header_name_nats_py_refuses_is_refused_the_same(name):
    from nats.errors import BadHeaderError

    for send in (headers.ORIGINAL_SEND, headers.send_publish):
        with pytest.raises(BadHeaderError):
            await send(_Recorder(), "s", "", b"", 0, {name: "v"})
    assert name not in headers._NAMES
