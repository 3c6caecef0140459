"""CPU per `Bus.send` and its ack in the sending process: `python benchmarks/send.py [--messages N] [--rounds R] [--nats-py-replies] [--nats-py-headers] [--in-process]`.

Every service sends its effects with `Bus.send` (the allocator its decisions, the status writer
its KV puts, the ingestor and `dralloc submit` the claims), so what a send costs its sender is
paid once per claim in each of them. Per round: N AllocationCommitted events (the status writer
bench's commits) sent to a fresh nats-server's ALLOCATIONS in windows of 256 (the window's acks
awaited, as `dralloc submit` does), this process's CPU (`time.process_time`) over the round per
message. ``--nats-py-replies``: the acks come through a nats-py subscription with a callback (a task
woken per answer), as before `bus.client._Inline`; ``--nats-py-headers``: headers written by nats-py's
own `_send_publish`, as before `bus.headers.header_block`. Prints JSON: each round's microseconds per
message and their median.

``--in-process``: the two parts alone, with no server and no socket (so a busy machine moves them
less; the best of `rounds` rounds is kept): writing a decision's five headers into a message
(nats-py's `_send_publish` against `header_block`'s, to a client that only records what it would
send) and handing N answers from nats-py's reader to `Bus._on_reply`-like delivery (a callback
subscription's task against `_Inline`), microseconds per message.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # statuswriter.py beside this file
from nats.aio.msg import Msg  # noqa: E402
from statuswriter import commit  # noqa: E402

from dralloc import telemetry  # noqa: E402
from dralloc.bus import Bus, LocalServer, headers  # noqa: E402

WINDOW = 256

DECISION_HEADERS = {
    "Dralloc-Epoch": "3",
    "Nats-Expected-Last-Sequence": "12345",
    "Nats-Expected-Last-Msg-Id": "committed:0b6f3a52-1d7e-4c1e-9d07-55c1c7f4d2a9:1@4e1f0c2b9a7d:12345",
    "Nats-Msg-Id": "committed:0b6f3a52-1d7e-4c1e-9d07-55c1c7f4d2a9:1@4e1f0c2b9a7d:12346",
    "traceparent": "00-c439d490a072d730a8311f8cd2ad2e6c-904853f1768b85f1-01",
}
"""What the allocator's fence sends a decision with."""


class _Recorder:
    """Enough of a nats-py client for `_send_publish`: what it would send, counted."""

    def __init__(self) -> None:
        self.stats = {"out_msgs": 0, "out_bytes": 0}
        self._flush_queue = None
        self.sent = 0

    async def _send_command(self, cmd: bytes) -> None:
        self.sent += 1


async def headers_us(messages: int, send: Any) -> float:
    """CPU per message of `send` (a `_send_publish`) writing a decision's headers."""
    client, payload = _Recorder(), b"x" * 600
    cpu = time.process_time()
    for _ in range(messages):
        await send(client, "dra.allocations.bench.sustain-1", "_INBOX.abc.1", payload, len(payload), DECISION_HEADERS)
    return (time.process_time() - cpu) * 1e6 / messages


async def replies_us(messages: int, inline: bool) -> float:
    """CPU per answer handed from nats-py's reader (`Client._process_msg`) to a delivery function,
    inline (`_Inline`) or through a callback subscription's task."""
    from nats.aio.client import Client
    from nats.aio.subscription import Subscription

    from dralloc.bus.client import _Inline

    client = Client()
    delivered = 0

    def deliver(msg: Msg) -> None:
        nonlocal delivered
        delivered += 1

    async def callback(msg: Msg) -> None:
        deliver(msg)

    sub = Subscription(client, 1, "_INBOX.abc.*", future=_Inline(deliver)) if inline else Subscription(client, 1, "_INBOX.abc.*", cb=callback)  # type: ignore[arg-type]
    if not inline:
        sub._start(client._error_cb)
    client._subs[1] = sub
    answer = b'{"stream":"ALLOCATIONS","seq":12346}'
    cpu = time.process_time()
    for i in range(messages):
        await client._process_msg(1, b"_INBOX.abc.%d" % i, b"", answer, b"")
        if i % WINDOW == WINDOW - 1:
            while delivered <= i:
                await asyncio.sleep(0)
    while delivered < messages:
        await asyncio.sleep(0)
    used = time.process_time() - cpu
    if sub._wait_for_msgs_task is not None:
        sub._wait_for_msgs_task.cancel()
    return used * 1e6 / messages


async def in_process(messages: int = 20_000, rounds: int = 5) -> dict[str, Any]:
    """`--in-process` (see the module docstring): the best of `rounds` rounds of each."""
    best = {
        "headers_nats_py_us": min([await headers_us(messages, headers.ORIGINAL_SEND) for _ in range(rounds)]),
        "headers_header_block_us": min([await headers_us(messages, headers.send_publish) for _ in range(rounds)]),
        "replies_callback_task_us": min([await replies_us(messages, inline=False) for _ in range(rounds)]),
        "replies_inline_us": min([await replies_us(messages, inline=True) for _ in range(rounds)]),
    }
    return {"messages": messages, "rounds": rounds, **{key: round(value, 2) for key, value in best.items()}}


async def _callback_replies(bus: Bus) -> None:
    """The reply subscription as nats-py's callback subscriptions deliver: a task woken per answer."""

    async def answered(msg: Msg) -> None:
        bus._on_reply(msg)

    bus._reply_prefix = bus._nc.new_inbox()
    await bus._nc.subscribe(f"{bus._reply_prefix}.*", cb=answered)


async def run(messages: int = 10_000, rounds: int = 4, *, nats_py_replies: bool = False, nats_py_headers: bool = False) -> dict[str, Any]:
    """`rounds` rounds of `messages` sends; the report (see the module docstring)."""
    telemetry.setup("allocator")  # as a service sets it up: nothing records
    if nats_py_headers:
        from nats.aio.client import Client

        Client._send_publish = headers.ORIGINAL_SEND  # type: ignore[method-assign]  # nats-py's own, for the comparison
    server = LocalServer(Path(tempfile.mkdtemp(prefix="dralloc-sendbench-")))
    await server.start()
    per_message: list[float] = []
    try:
        bus = await Bus.connect(server.url, name="send-bench")
        try:
            await bus.ensure_streams()
            if nats_py_replies:
                await _callback_replies(bus)
            events = [commit(i) for i in range(messages)]
            for r in range(rounds):
                cpu = time.process_time()
                for start in range(0, messages, WINDOW):
                    acks = [await bus.send(event, msg_id=f"{event.msg_id}@{r}") for event in events[start : start + WINDOW]]
                    for ack in acks:
                        await ack
                per_message.append(round((time.process_time() - cpu) * 1e6 / messages, 1))
        finally:
            await bus.close()
    finally:
        await server.stop()
        if nats_py_headers:
            headers.install()
    return {
        "messages": messages,
        "nats_py_replies": nats_py_replies,
        "nats_py_headers": nats_py_headers,
        "us_per_message": per_message,
        "median_us_per_message": statistics.median(per_message),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--messages", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--nats-py-replies", action="store_true")
    parser.add_argument("--nats-py-headers", action="store_true")
    parser.add_argument("--in-process", action="store_true")
    options = parser.parse_args()
    if options.in_process:
        print(json.dumps(asyncio.run(in_process(options.messages, options.rounds))))
        sys.exit(0)
    print(json.dumps(asyncio.run(run(options.messages, options.rounds, nats_py_replies=options.nats_py_replies, nats_py_headers=options.nats_py_headers))))
