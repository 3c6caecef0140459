"""Decisions written behind the fence, pipelined: the allocator's only way to write to ALLOCATIONS.

Every decision is written with ``Nats-Expected-Last-Sequence`` (the last ALLOCATIONS sequence this
term has seen) and ``Dralloc-Epoch``, so the server refuses a write from a deposed leader, or from
a view missing an earlier write (a publish whose ack was lost). A refused write ends the term
(`term` is set); the next term (this process or another) rebuilds from the streams.

Writes are pipelined: the allocator decides the next claim while earlier decisions are still on
their way. Each write in flight expects the stream to end exactly at the one before it:
``Nats-Expected-Last-Sequence`` one past it, and ``Nats-Expected-Last-Msg-Id`` its message id,
which is unique to this term and write (``<event id>@<term>:<sequence>``), so a write is stored
only on top of this term's own earlier writes. Any write that is refused, unanswered or found a duplicate ends the
term, and the writes behind it are refused in turn. `tail` is the last write sent: done once it
(and so every write before it) is stored.

A gang's or a Pod's decisions are written as one JetStream atomic batch (`Bus.send_batch`): the
stream, and so every consumer, holds all of them or none. A batch can carry only
``Nats-Expected-Last-Sequence`` (on its first message; JetStream refuses
``Nats-Expected-Last-Msg-Id`` in a batch), so it is sent only once every write before it is
stored: then that sequence is this term's own last write.
"""

from __future__ import annotations

import asyncio
import functools
import uuid
from collections.abc import Callable, Sequence

from opentelemetry.context import Context

from dralloc.allocator import leader
from dralloc.bus import ApiError, Bus, PubAck
from dralloc.schemas import events as ev

WRONG_LAST_SEQUENCE = 10071
"""JetStream's error code when ``Nats-Expected-Last-Sequence`` does not match the stream."""
WRONG_LAST_MSG_ID = 10070
"""JetStream's error code when ``Nats-Expected-Last-Msg-Id`` does not match the stream."""

Stored = Callable[[int, Sequence[ev.AllocationEvent], "float | None"], None]
"""Told of every write once stored: (its first sequence, its events, when its claim was taken up)."""


class Fenced(Exception):
    """A decision was not written: this allocator is no longer the leader, or its view of ALLOCATIONS is stale."""


class Fence:
    """One term's writer of decisions (see the module docstring). Not thread-safe: used from the event loop."""

    def __init__(self, bus: Bus, term: asyncio.Event, lease: leader.Lease | None, stored: Stored) -> None:
        self.bus = bus
        self.term = term
        """Set when a write was fenced off: this term's state can no longer be trusted."""
        self.lease = lease
        self.on_stored = stored
        self.last_seq = 0
        """The last ALLOCATIONS sequence this term has seen (rebuilt), or that its last write sent will have."""
        self.token = uuid.uuid4().hex[:12]
        """This term's mark on its writes' message ids."""
        self.last_id: str | None = None
        """The message id of this term's last write sent (None before the first)."""
        self.tail: asyncio.Future[None] | None = None
        """The last write sent: done once it (and so every write before it) is stored."""

    def headers(self, events: Sequence[ev.AllocationEvent]) -> dict[str, str]:
        """The headers every write of this term carries; raises `Fenced` once the term is over."""
        if self.term.is_set():
            raise Fenced(f"term over: {_what(events)} not written")
        if self.lease is None:
            return {}
        if not self.lease.held:
            self.term.set()
            raise Fenced(f"lease lost (epoch {self.lease.epoch}): {_what(events)} not written")
        return {"Dralloc-Epoch": str(self.lease.epoch)}

    async def write(self, event: ev.AllocationEvent) -> None:
        """Publish a decision behind the fence and wait until it is stored; raises `Fenced` when refused."""
        await (await self.send(event))

    async def send(self, event: ev.AllocationEvent, began: float | None = None) -> asyncio.Future[None]:
        """Send a decision behind the fence; returns the task that completes once it is stored and
        raises `Fenced` when it was refused. `began`: when the claim was taken up."""
        headers = {**self.headers((event,)), "Nats-Expected-Last-Sequence": str(self.last_seq)}
        if self.last_id is not None:
            headers["Nats-Expected-Last-Msg-Id"] = self.last_id
        # The sequence it will take in the id too (as in a batch): the same decision written again
        # later in the term (a claim's failure changed and changed back) is news, not a duplicate.
        msg_id = f"{event.msg_id}@{self.token}:{self.last_seq + 1}"
        ack = await self.bus.send(event, headers=headers, msg_id=msg_id)
        expected, self.last_seq, self.last_id = self.last_seq, self.last_seq + 1, msg_id
        return self._follow((event,), ack, expected, began)

    async def send_batch(
        self, events: list[ev.AllocationEvent], began: float | None = None, traces: list[Context | None] | None = None
    ) -> asyncio.Future[None]:
        """`send` for decisions stored all or none (one atomic batch; `traces`: the one each continues).
        Only once every write before it is stored: its one fence, ``Nats-Expected-Last-Sequence``,
        then names this term's own write."""
        if self.tail is not None:
            await self.tail
        headers = self.headers(events)
        first = {"Nats-Expected-Last-Sequence": str(self.last_seq)}
        # The sequence each will take in the ids too: a member given back and committed again in one
        # term is a new message, not a duplicate (which would refuse the whole batch).
        msg_ids = [f"{event.msg_id}@{self.token}:{self.last_seq + i}" for i, event in enumerate(events, start=1)]
        ack = await self.bus.send_batch(events, headers=headers, first=first, msg_ids=msg_ids, traces=traces)
        expected, self.last_seq, self.last_id = self.last_seq, self.last_seq + len(events), msg_ids[-1]
        return self._follow(events, ack, expected, began)

    def _follow(self, events: Sequence[ev.AllocationEvent], ack: asyncio.Future[PubAck], expected: int, began: float | None) -> asyncio.Future[None]:
        """The new `tail`: a future settled by a callback on the write's ack (`_stored`), not a task per
        write. Cancelling it (an awaiting task cancelled) cancels the ack's wait too, as with a task."""
        tail: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        ack.add_done_callback(functools.partial(self._stored, tail, events, expected, began))
        tail.add_done_callback(functools.partial(_cancel_with, ack))
        self.tail = tail
        return tail

    def _stored(
        self, tail: asyncio.Future[None], events: Sequence[ev.AllocationEvent], expected: int, began: float | None, ack: asyncio.Future[PubAck]
    ) -> None:
        """The write's ack came (or failed): `tail` is done, or raises `Fenced` or the ack's error; a
        write that may not be stored ends the term."""
        if tail.done():  # (cancelled meanwhile)
            self.term.set()  # stored or not, nobody can tell now: the next term reads the stream
            return
        if ack.cancelled():
            self.term.set()
            tail.cancel()
            return
        if (error := ack.exception()) is not None:
            self.term.set()  # stored or not, nobody can tell now: the next term reads the stream
            if isinstance(error, ApiError) and error.err_code in (WRONG_LAST_SEQUENCE, WRONG_LAST_MSG_ID):
                error = Fenced(f"ALLOCATIONS moved past sequence {expected} (another leader, or a lost ack): {_what(events)} not written")
            tail.set_exception(error)
            return
        stored = ack.result()
        if stored.duplicate or stored.seq != expected + len(events):
            self.term.set()  # a write of this term already stored it: this term's view is not the stream's
            tail.set_exception(Fenced(f"{_what(events)} was already stored (sequence {stored.seq}): the term's view is stale"))
            return
        try:
            self.on_stored(expected + 1, events, began)
        except Exception as exc:  # noqa: BLE001 - the write is stored; whoever waits on it hears what went wrong after
            tail.set_exception(exc)
            return
        tail.set_result(None)


def _what(events: Sequence[ev.AllocationEvent]) -> str:
    """What a write holds, for a message (made only when one is needed: a subject costs microseconds)."""
    return events[0].subject if len(events) == 1 else f"{len(events)} decisions of a gang"


def _cancel_with(ack: asyncio.Future[PubAck], tail: asyncio.Future[None]) -> None:
    if tail.cancelled():
        ack.cancel()
