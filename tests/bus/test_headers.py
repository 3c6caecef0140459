"""`dralloc.bus.headers.parse_header_lines` reads header blocks exactly as nats-py's own parser does,
and is the one nats-py uses once the bus is imported."""

from __future__ import annotations

import pytest

from dralloc.bus import Bus, header_bytes, headers

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


def test_the_bus_makes_nats_py_use_it():
    assert Bus is not None  # (importing the bus installed it)
    assert headers.installed()


@pytest.mark.parametrize(
    "marks",
    [
        {"Nats-Msg-Id": "committed:uid-1:1@abc:7", "Nats-Expected-Last-Sequence": "6"},
        {"Café": "naïve €", "Plain": "ascii"},  # UTF-8: more bytes than characters, in a name and a value
        {"Dralloc-Epoch": 3},  # (a value that is not a string is written as its str)
        {},
    ],
    ids=["ascii", "non-ascii", "int", "none"],
)
def test_header_bytes_is_the_header_block_as_written(marks: dict):
    block = b"NATS/1.0\r\n" + b"".join(f"{k}: {v}\r\n".encode() for k, v in marks.items()) + b"\r\n" if marks else b""
    assert header_bytes(marks) == len(block)
