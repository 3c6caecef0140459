"""Publishing a source's events, pipelined: many on their way at once, every one stored exactly once.

`publish_events` sends each event as the source yields it without waiting for its store (`Bus.send`),
into a segment of at most `WINDOW` events in which no subject comes twice; a segment is settled (every
ack awaited, in order) before an event on one of its subjects, or past the window, is sent, and when
the source has nothing new for `IDLE_S`. Settling handles each event as `publish_until_stored` would:
an ack called a duplicate of a claim event is published once more the careful way (`Bus.publish`: a
retry stays a duplicate, news after a delete is stored), an event the server can never take is
reported and skipped, and one whose send or ack failed (NATS away, no answer) is published again until
stored. Retrying is safe: the ``Nats-Msg-Id`` dedupes an event already stored, and since a segment
holds each subject once and is settled before the next, a retried event never lands after a later
event on its subject.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable

from dralloc.bus import RESUBMITTABLE, Bus, NatsError, PubAck, PublishRefused
from dralloc.manifest_events import SourceEvent
from dralloc.schemas import events as ev

log = logging.getLogger("dralloc.ingestor")

WINDOW = 256
"""Events on their way at once (sent, their store not yet confirmed), at most."""

IDLE_S = 0.05
"""How long the source may be quiet before the events on their way are settled."""

Retry = Callable[[SourceEvent], Awaitable[bool]]
"""Publishes one event until stored (False: stopped first); `publish_until_stored`."""


async def publish_events(bus: Bus, source: AsyncIterator[SourceEvent], stop: asyncio.Event, retry: Retry, report: Callable[[str], None]) -> int:
    """Publish everything `source` yields, pipelined (see the module docstring), until it ends or `stop`
    is set; returns how many events were stored. `retry` publishes one event until stored; `report`
    says why an event is skipped."""
    queue: asyncio.Queue[SourceEvent | None] = asyncio.Queue(maxsize=WINDOW)
    reader = asyncio.ensure_future(_read(source, queue))
    segment: list[tuple[SourceEvent, asyncio.Future[PubAck] | None]] = []
    subjects: set[str] = set()
    stored = 0
    try:
        while not stop.is_set():
            try:
                if not queue.empty():
                    event = queue.get_nowait()
                else:
                    event = await asyncio.wait_for(queue.get(), IDLE_S) if segment else await queue.get()
            except TimeoutError:  # the source is quiet: what is on its way is settled now
                stored += await _settle(bus, segment, stop, retry, report)
                segment, subjects = [], set()
                continue
            if event is None:
                break
            if (problem := ev.identity_problem(event)) is not None:
                report(f"not published: {type(event).__name__}: {problem}")
                continue
            subject = event.subject
            if subject in subjects or len(segment) >= WINDOW:
                stored += await _settle(bus, segment, stop, retry, report)
                segment, subjects = [], set()
            try:
                sent: asyncio.Future[PubAck] | None = await bus.send(event)
            except PublishRefused as exc:
                report(f"not published: {exc}")
                continue
            except (NatsError, OSError) as exc:
                log.warning("sending %s failed: %s; publishing it again", subject, exc)
                sent = None
            segment.append((event, sent))
            subjects.add(subject)
        stored += await _settle(bus, segment, stop, retry, report)
        if reader.done():
            reader.result()  # the source's own error, if it raised
    finally:
        reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await reader
    return stored


async def _read(source: AsyncIterator[SourceEvent], queue: asyncio.Queue[SourceEvent | None]) -> None:
    """The source's events into `queue`, then None (the end; also when the source raised, which the
    task then raises)."""
    try:
        async for event in source:
            await queue.put(event)
    except Exception:
        await queue.put(None)
        raise
    await queue.put(None)


async def _settle(
    bus: Bus, segment: list[tuple[SourceEvent, asyncio.Future[PubAck] | None]], stop: asyncio.Event, retry: Retry, report: Callable[[str], None]
) -> int:
    """Await each event's store in order (see the module docstring); returns how many were stored."""
    stored = 0
    for event, sent in segment:
        try:
            if sent is None:
                raise NatsError("not sent")
            ack = await sent
            if ack.duplicate and isinstance(event, RESUBMITTABLE):
                await bus.publish(event)  # (a retry stays a duplicate; news after a delete is stored)
            stored += 1
        except PublishRefused as exc:
            report(f"not published: {exc}")
        except (NatsError, TimeoutError, OSError) as exc:
            log.warning("publishing %s failed: %s; retrying", event.subject, exc)
            if stop.is_set() or not await retry(event):
                continue
            stored += 1
    return stored
