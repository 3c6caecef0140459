"""The allocator's leader lease: one active allocator, the others hot standbys.

The lease is the key ``allocator`` in the JetStream KV bucket ``dralloc-leader``;
its value names the holder (host, pid, a random suffix). No clocks are compared
between processes; each one measures time on its own monotonic clock:

- acquire: create the key when absent (first start, or the holder resigned on
  a clean stop), or take it over with a compare-and-set on its revision once
  that revision has stayed the same for ``ttl`` seconds since this standby
  first saw it (the holder stopped renewing: it died, hangs or lost NATS);
- renew: compare-and-set every ``ttl / 3``; a wrong revision means someone
  took the lease over: this process is deposed;
- the holder believes it leads only until ``ttl`` after it *sent* its last
  successful renewal. A standby starts counting only after it saw that
  renewal, so it never takes over while the holder still believes it leads.

The epoch is the key's revision at acquisition: it grows with every change of
leader and is stamped on every decision (header ``Dralloc-Epoch``).

The lease keeps two leaders from working at once in the common case; it
cannot make a paused process (GC, SIGSTOP, a slow disk) safe. That is the
fence's job (see `dralloc.allocator.fence`): every decision is written with
``Nats-Expected-Last-Sequence`` set to the last ALLOCATIONS sequence the
writer has seen, so a deposed leader's late write, made from a view that a
newer leader has since changed, is rejected by the server.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
import uuid

from dralloc.bus import KeyNotFound, KeyValue, KeyWrongLastSequence, NatsError

log = logging.getLogger("dralloc.allocator.leader")

BUCKET = "dralloc-leader"
KEY = "allocator"
DEFAULT_TTL = 3.0

_UNREACHABLE = (NatsError, TimeoutError, OSError)


def holder_id() -> str:
    """Unique per process, readable by a person looking at the bucket."""
    return f"{socket.gethostname()}:{os.getpid()}:{uuid.uuid4().hex[:8]}"


class Lease:
    """The leader lease of one allocator process."""

    def __init__(self, kv: KeyValue, *, holder: str | None = None, ttl: float = DEFAULT_TTL, key: str = KEY) -> None:
        self.kv = kv
        self.holder = holder or holder_id()
        self.ttl = ttl
        self.key = key
        self.revision = 0
        """The key's revision written by our last successful acquire or renewal (0: not held)."""
        self.epoch = 0
        """The revision at acquisition: this term's fencing token."""
        self._valid_until = 0.0

    @property
    def held(self) -> bool:
        return self.revision > 0 and time.monotonic() < self._valid_until

    async def acquire(self, stop: asyncio.Event) -> bool:
        """Wait until this process holds the lease (True) or `stop` is set (False)."""
        value = self.holder.encode()
        seen: tuple[int | None, float] | None = None  # the holder's revision and when we first saw it
        while not stop.is_set():
            sent = time.monotonic()
            try:
                try:
                    entry = await self.kv.get(self.key)
                except KeyNotFound:  # never held, or resigned (deleted)
                    revision = await self.kv.create(self.key, value)
                else:
                    if entry.value == value or (seen and seen[0] == entry.revision and sent - seen[1] >= self.ttl):
                        # Ours from an earlier term (e.g. NATS was away too long), or the holder went silent.
                        revision = await self.kv.update(self.key, value, last=entry.revision)
                    else:
                        if seen is None or seen[0] != entry.revision:
                            seen = (entry.revision, time.monotonic())
                        await wait_or(stop, self.ttl / 6)
                        continue
            except KeyWrongLastSequence:
                seen = None  # someone else was faster: watch the new holder
                continue
            except _UNREACHABLE as exc:
                log.warning("leader lease: NATS unreachable (%s); retrying", exc)
                await wait_or(stop, 0.5)
                continue
            self.revision = self.epoch = revision
            self._valid_until = sent + self.ttl
            log.info("leader lease: acquired by %s (epoch %d)", self.holder, revision)
            return True
        return False

    async def keep(self, term: asyncio.Event) -> None:
        """Renew until `term` is set; set `term` (and return) as soon as the lease is lost."""
        value = self.holder.encode()
        while not term.is_set():
            await wait_or(term, self.ttl / 3)
            if term.is_set():
                return
            sent = time.monotonic()
            try:
                self.revision = await asyncio.wait_for(self.kv.update(self.key, value, last=self.revision), max(0.05, self._valid_until - sent))
                self._valid_until = sent + self.ttl
            except KeyWrongLastSequence:
                log.warning("leader lease: %s was deposed (epoch %d)", self.holder, self.epoch)
                self.revision = 0
                term.set()
            except _UNREACHABLE as exc:
                if time.monotonic() >= self._valid_until:
                    log.warning("leader lease: could not renew in time (%s); stepping down", exc)
                    self.revision = 0
                    term.set()

    async def resign(self) -> None:
        """Give the lease up at once (a clean stop), so a standby need not wait for it to expire."""
        if self.revision:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self.kv.delete(self.key, last=self.revision), 2.0)
            self.revision = 0


async def wait_or(event: asyncio.Event, seconds: float) -> None:
    """Sleep `seconds`, or less if `event` is set first."""
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(event.wait(), seconds)
