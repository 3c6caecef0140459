"""Pulling messages from a JetStream pull consumer: one pull request open at a time, its messages
handed out as they arrive.

nats-py's ``fetch(n)`` waits for each message of a batch with a task and a timer of its own, and,
once the stream has run dry, holds a lingering request until all ``n`` messages came or the request
expired: a consumer fetching 64 at a time from a stream filling at 100 a second waited up to
0.64 s before handling the first. `Puller.fetch` instead asks for up to `batch` messages (the
request lingers up to `wait` seconds) and returns as soon as at least one message is there, with
every message already delivered; the request stays open and the next `fetch` takes what it
delivers meanwhile, until it has delivered its `batch` or ended (408, request expired), and only
then is a new one sent. `close` waits for the open request to end and hands back (naks) what it
still delivers, so a stopping consumer strands nothing until ack_wait.

It reads nats-py's pull subscription from the inside (the request subject, the inbox, the inbox's
queue): nats-py is pinned below 3 in pyproject.toml, and tests/bus exercise this with a real server.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import nats.js.errors
from nats.aio.msg import Msg

ENDED = ("404", "408", "409")
"""Status codes that end a pull request: no messages (a no-wait request), expired, conflict
(too many requests waiting, the consumer deleted or its leader changed)."""

HEARTBEAT = "100"

GRACE_S = 0.25
"""How long past its expiry a request still counts as open: the server's 408 saying it ended may
come a little after the local clock passed the expiry."""


class Puller:
    """One pull consumer's requests (see the module docstring). Not thread-safe; one caller at a time."""

    def __init__(self, sub: Any, batch: int, wait: float) -> None:
        self.sub = sub
        """nats-py's `JetStreamContext.PullSubscription`."""
        self.batch = batch
        self.wait = wait
        self.open = 0
        """Messages the open request may still deliver (0: none open)."""
        self.ends_at = 0.0
        """When the open request expires (monotonic)."""

    @property
    def _queue(self) -> asyncio.Queue[Msg]:
        queue: asyncio.Queue[Msg] = self.sub._sub._pending_queue  # (nats-py's subscription is untyped here: `sub` is Any)
        return queue

    async def fetch(self) -> list[Msg]:
        """Up to `batch` messages: those already delivered, else the first to come within `wait`
        seconds and every other one delivered by then. [] when none came (the request ended or
        expired): call again. Raises nats-py's `APIError` for a status that is an error (e.g. 503:
        no JetStream) when no message came with it."""
        if self.open <= 0 or time.monotonic() >= self.ends_at + GRACE_S:
            self.open = 0
            if self._queue.empty():
                await self._request()
        messages: list[Msg] = []
        statuses: list[Msg] = []
        if self._queue.empty():
            try:
                msg = await asyncio.wait_for(self._queue.get(), max(0.0, self.ends_at + GRACE_S - time.monotonic()))
            except TimeoutError:
                self.open = 0  # the request's end (408) never came: the next fetch sends another
                return messages
            self._take(msg, messages, statuses)
        while len(messages) < self.batch and not self._queue.empty():
            self._take(self._queue.get_nowait(), messages, statuses)
        if not messages and statuses:
            status = statuses[-1].headers.get("Status") if statuses[-1].headers else None
            if status not in ENDED:
                raise nats.js.errors.APIError.from_msg(statuses[-1])
            if status == "409":
                await asyncio.sleep(0.05)  # (the server refused the request: do not ask again at once)
        return messages

    async def close(self, unstarted: list[Msg] | None = None) -> None:
        """Wait for the open request to end (at most `wait` seconds), then hand back (nak) every message
        it delivered meanwhile, those delivered but not fetched, and `unstarted` (fetched, not handled).
        Only then: a message handed back while the request is open is delivered on it again at once,
        each time counting a delivery."""
        held = list(unstarted or [])
        while True:
            while not self._queue.empty():
                self._take(self._queue.get_nowait(), held, [])
            remaining = self.ends_at + GRACE_S - time.monotonic()
            if self.open <= 0 or remaining <= 0:
                break
            try:
                msg = await asyncio.wait_for(self._queue.get(), remaining)
            except TimeoutError:
                break
            self._queue.put_nowait(msg)  # (taken by the loop above)
        self.open = 0
        for msg in held:
            await msg.nak()

    async def _request(self) -> None:
        expires = int(self.wait * 1e9)
        await self.sub._nc.publish(self.sub._nms, json.dumps({"batch": self.batch, "expires": expires}).encode(), self.sub._deliver)
        self.open, self.ends_at = self.batch, time.monotonic() + self.wait

    def _take(self, msg: Msg, into: list[Msg], statuses: list[Msg]) -> None:
        """One delivered message: a message into `into`, or a status (into `statuses`: any but a
        heartbeat ends the request)."""
        self.sub._sub._pending_size -= len(msg.data)
        status = msg.headers.get("Status") if msg.headers else None
        if not status:
            into.append(msg)
            self.open -= 1
        elif status != HEARTBEAT:
            self.open = 0
            statuses.append(msg)
