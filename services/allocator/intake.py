"""Claims taken from the CLAIMS consumer and decided in batches: the allocator's intake.

The consumer hands the allocator one event at a time and moves on once the handler returns; a
handler that decided each claim at once would hop to the engine's thread once per claim, and
under load that hop (waking the thread, the GIL going back and forth) cost more CPU than the
engine's own work. So `Intake.put` only queues a claim and returns a future; one drain task at a
time takes everything queued and hands it to `decide` together (the allocator decides a run of
plain claims in one engine hop). Each claim's future completes once its decision (and every one
sent before it) is stored, or raises what deciding or writing it raised: the consumer acks the
message then, or hands it back, exactly as when the handler decided it itself.

Order is kept: `decide` sees the claims in the order they were put, and `flush` lets an event
that must come after them (a delete, a Pod) wait until every claim queued before it is decided.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any

from dralloc.schemas import events as ev


@dataclass(slots=True)
class Taken:
    """A claim event taken from the consumer, waiting to be decided."""

    event: ev.ClaimSubmitted
    context: Any
    """The trace context it arrived in (the consumer's span): its spans and its decision continue it."""
    began: float
    """When it was taken (`time.perf_counter`): its decision's latency runs from here."""
    done: asyncio.Future[None] = field(default_factory=lambda: asyncio.get_running_loop().create_future())
    """Completes once its decision is stored (see the module docstring)."""

    def settle(self, tail: asyncio.Future[None] | None, error: BaseException | None = None) -> None:
        """The claim was decided: `done` follows `tail` (the last write sent after its decision;
        None or done: nothing of it is still on its way), or raises `error`."""
        if self.done.done():
            return
        if error is not None:
            self.done.set_exception(error)
        elif tail is None or tail.done():
            _follow(self.done, tail)
        else:
            tail.add_done_callback(lambda finished: _follow(self.done, finished))


def _follow(future: asyncio.Future[None], tail: asyncio.Future[None] | None) -> None:
    if future.done():
        return
    if tail is None or (not tail.cancelled() and tail.exception() is None):
        future.set_result(None)
    elif tail.cancelled():
        future.set_exception(asyncio.CancelledError("the write was cancelled"))
    else:
        error = tail.exception()
        assert error is not None
        future.set_exception(error)


class Intake:
    """The queue of claims taken and not yet decided, drained by one task at a time into `decide`.
    `decide` must settle every `Taken` it is given; whatever it leaves (it raised) is settled with
    its error."""

    def __init__(self, decide: Callable[[list[Taken]], Awaitable[None]]) -> None:
        self.decide = decide
        self.queue: list[Taken] = []
        self.draining: asyncio.Task[None] | None = None

    def put(self, taken: Taken) -> asyncio.Future[None]:
        """Queue a claim; returns its `done` (see `Taken`)."""
        self.queue.append(taken)
        if self.draining is None or self.draining.done():
            self.draining = asyncio.ensure_future(self._drain())
        return taken.done

    async def flush(self) -> None:
        """Return once every claim queued so far has been decided (sent; not necessarily stored)."""
        while self.draining is not None and not self.draining.done():
            await asyncio.shield(self.draining)

    async def _drain(self) -> None:
        while self.queue:
            batch, self.queue = self.queue, []
            try:
                await self.decide(batch)
            except BaseException as exc:
                for taken in batch:
                    taken.settle(None, exc if isinstance(exc, Exception) else asyncio.CancelledError())
                if not isinstance(exc, Exception):
                    for taken in self.queue:
                        taken.settle(None, asyncio.CancelledError())
                    self.queue = []
                    raise
