"""Consuming a stream: a pull consumer loop that decodes, traces, hands each event to a handler and
acks, retries or dead-letters it (the rules are in `dralloc.bus`'s docstring, Consuming).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections import deque
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry.trace import INVALID_SPAN, Span, SpanKind
from opentelemetry.util.types import Attributes

from dralloc import telemetry
from dralloc.bus import streamcheck
from dralloc.bus.deadletter import dead_letter, exhausted
from dralloc.bus.errors import Permanent
from dralloc.bus.pull import Puller
from dralloc.bus.streams import FETCH_WAIT_S
from dralloc.schemas import events
from dralloc.schemas.events import Event, EventDecodeError

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

log = logging.getLogger("dralloc.bus")

Handler = Callable[[Event], Awaitable[Awaitable[Any] | None]]
"""Awaited per event; it may return an awaitable that completes once the event's effect is
durable (e.g. a `Bus.send` ack), and the message is acked only then: the consumer goes on with
the next messages meanwhile (see `Bus.consume`)."""

Decode = Callable[[str, str, bytes], Any]
"""(stream, subject, body) -> what the handler is given; raises `EventDecodeError` saying why the
message must never be acted on (it is dead-lettered with that reason). Default: `decode_event`."""


def decode_event(stream: str, subject: str, data: bytes) -> Event:
    """The message's event, refused when it does not decode (`events.decode`) or does not belong
    where it was stored (`streamcheck.misplaced`)."""
    event = events.decode(data)
    if (problem := streamcheck.misplaced(stream, subject, event)) is not None:
        raise EventDecodeError(problem)  # forged or misfiled: never acted on
    return event


MAX_IN_FLIGHT = 1024
"""Messages a consumer has handled but not yet acked (their effects not yet durable), at most."""

FETCH_BATCH = 256
"""Messages asked for in one pull request, at most (fewer when fewer are waiting)."""


async def consume(
    bus: Bus,
    stream: str,
    handler: Handler,
    stop: asyncio.Event,
    *,
    durable: str | None,
    name: str | None = None,
    filter_subject: str | None = None,
    start_seq: int | None = None,
    max_deliver: int = 5,
    ack_wait: float = 30.0,
    batch: int = FETCH_BATCH,
    decode: Decode = decode_event,
    context: bool = True,
    seen: Callable[[int], None] | None = None,
) -> None:
    """`Bus.consume`: process the stream's messages with `handler` until `stop` is set (see the
    `dralloc.bus` docstring). `decode` reads a message (e.g. only the fields a consumer uses);
    `context=False`: the handler sends nothing that carries the trace on, so while nothing records
    no span is made or made current for it (recording, every message still gets its CONSUMER span).
    `seen(sequence)`: called with each message's stream sequence once the handler returned or raised
    for it, or it was dead-lettered undecodable (the allocator knows how far it read INVENTORY)."""
    consumer_name = durable or name or bus.name
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT,
        max_deliver=max_deliver,
        ack_wait=ack_wait,
        max_ack_pending=MAX_IN_FLIGHT,
    )
    if durable is None:
        config.inactive_threshold = 30.0
        if start_seq is not None:
            config.deliver_policy = DeliverPolicy.BY_START_SEQUENCE
            config.opt_start_seq = start_seq
    # An empty filter is the whole stream (INVENTORY has two subject trees).
    sub = await bus._js.pull_subscribe(filter_subject or "", durable=durable, stream=stream, config=config)
    advisories = None
    if durable is not None:
        # A message whose every delivery ended without an ack (the process died, or hung past
        # ack_wait, each time) is no longer delivered; JetStream says so in an advisory.
        async def on_exhausted(advisory: Msg) -> None:
            await exhausted(bus, advisory, stream, consumer_name)

        advisories = await bus._nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}", cb=on_exhausted)
    puller = Puller(sub, batch, FETCH_WAIT_S)
    settler = _Settler(bus, stream, consumer_name, max_deliver)
    reading = _Reading(stream, consumer_name, decode, context)
    settling = asyncio.ensure_future(settler.run())
    unstarted: list[Msg] = []
    try:
        while not stop.is_set():
            bus.pulses[consumer_name] = time.monotonic()
            try:
                # A short long-poll, never cancelled: a cancelled fetch leaves a pull request on the
                # server that strands messages until ack_wait; at a stop `Puller.close` waits for it
                # to end (<= 1 s) and hands back what it still delivers.
                messages = await puller.fetch()
            except nats.errors.Error as exc:
                if stop.is_set():
                    break
                log.warning("%s: fetching from %s failed: %s; retrying", consumer_name, stream, exc)
                await asyncio.sleep(0.5)
                continue
            for i, msg in enumerate(messages):
                if stop.is_set():
                    unstarted = messages[i:]  # fetched but not started: handed back below
                    break
                await _process(bus, msg, handler, reading, settler)
                if seen is not None:
                    seen(msg.metadata.sequence.stream)
                if settler.pending >= MAX_IN_FLIGHT:
                    await settler.below(MAX_IN_FLIGHT)
        # A stop (not a cancellation: a process dying hands nothing back): the open request ends,
        # then what it delivered and was not handled is handed back.
        with contextlib.suppress(nats.errors.Error):
            await puller.close(unstarted)
    finally:
        bus.pulses.pop(consumer_name, None)
        try:
            await settler.below(1)  # every handled message is acked or handed back before the consumer ends
        finally:
            settling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await settling
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if advisories is not None:
            with contextlib.suppress(Exception):
                await advisories.unsubscribe()


class _Settler:
    """Acks (or hands back) handled messages once their effects are durable: one task per consumer,
    woken by callbacks on the effects, instead of a task per message."""

    def __init__(self, bus: Bus, stream: str, consumer: str, max_deliver: int) -> None:
        self.bus, self.stream, self.consumer, self.max_deliver = bus, stream, consumer, max_deliver
        self.pending = 0
        """Messages handled and not yet settled."""
        self.ready: deque[tuple[Msg, Exception | None, Any, Span]] = deque()
        self.wake = asyncio.Event()
        self.changed = asyncio.Event()

    def follow(self, msg: Msg, durable: Awaitable[Any], event: Any, span: Span) -> None:
        """Settle `msg` once `durable` completes (acked, or retried / dead-lettered if it raised; if it
        is cancelled, nothing: JetStream redelivers after ack_wait)."""
        self.pending += 1
        future = asyncio.ensure_future(durable)
        future.add_done_callback(functools.partial(self._done, msg, event, span))

    def settle_now(self, msg: Msg, failure: Exception | None, event: Any, span: Span) -> None:
        self.pending += 1
        self.ready.append((msg, failure, event, span))
        self.wake.set()

    def _done(self, msg: Msg, event: Any, span: Span, future: asyncio.Future[Any]) -> None:
        if future.cancelled():
            span.end()
            self.pending -= 1
            self.changed.set()
            return
        error = future.exception()
        if error is not None and not isinstance(error, Exception):
            span.end()
            self.pending -= 1
            self.changed.set()
            return
        self.ready.append((msg, error, event, span))
        self.wake.set()

    async def below(self, limit: int) -> None:
        """Return once fewer than `limit` messages are handled and unsettled."""
        while self.pending >= limit:
            self.changed.clear()
            await self.changed.wait()

    async def run(self) -> None:
        while True:
            await self.wake.wait()
            self.wake.clear()
            while self.ready:
                msg, failure, event, span = self.ready.popleft()
                try:
                    await _settle(self.bus, msg, failure, event, self.stream, self.consumer, self.max_deliver, span)
                except Exception as exc:  # noqa: BLE001 - one message's settling never stops the others'
                    log.warning("%s: could not settle %s: %s", self.consumer, msg.subject, exc)
                finally:
                    self.pending -= 1
            self.changed.set()


@dataclass(slots=True)
class _Reading:
    """How one consumer reads its messages (`consume`'s arguments)."""

    stream: str
    consumer: str
    decode: Decode
    context: bool


async def _process(bus: Bus, msg: Msg, handler: Handler, reading: _Reading, settler: _Settler) -> None:
    """Handle one message; it is settled (`settler`) at once, or once its effect is durable."""
    stream, consumer = reading.stream, reading.consumer
    bus.pulses[consumer] = time.monotonic()
    try:
        event = reading.decode(stream, msg.subject, msg.data)
    except EventDecodeError as exc:
        await dead_letter(bus, msg, stream, consumer, str(exc))
        return
    if not reading.context and not telemetry.recording():
        # Nothing records and nothing the handler sends carries the trace on: no span to make current.
        try:
            durable = await handler(event)
        except Exception as exc:
            settler.settle_now(msg, exc, event, INVALID_SPAN)
            return
        if durable is None:
            settler.settle_now(msg, None, event, INVALID_SPAN)
        else:
            settler.follow(msg, durable, event, INVALID_SPAN)
        return
    headers = msg.headers or {}
    attributes: Attributes = (
        {
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.destination.name": msg.subject,
            "messaging.consumer.group.name": consumer,
            "messaging.message.id": headers.get("Nats-Msg-Id", ""),
            "dralloc.event": type(event).__name__,
            "dralloc.delivery": msg.metadata.num_delivered,
        }
        if telemetry.recording()
        else None  # (nothing records them: not built per message)
    )
    span = telemetry.tracer().start_span(f"process {msg.subject}", context=telemetry.extract(headers), kind=SpanKind.CONSUMER, attributes=attributes)
    with telemetry.use_span(span):
        try:
            durable = await handler(event)
        except Exception as exc:
            settler.settle_now(msg, exc, event, span)
            return
        except BaseException:
            span.end()
            raise
    if durable is None:
        settler.settle_now(msg, None, event, span)
    else:
        settler.follow(msg, durable, event, span)


async def _settle(bus: Bus, msg: Msg, failure: Exception | None, event: Any, stream: str, consumer: str, max_deliver: int, span: Span) -> None:
    """Ack a handled message, or dead-letter it (`Permanent`, or the last delivery) or hand it back for a retry."""
    try:
        if failure is None:
            await msg.ack()
        elif isinstance(failure, Permanent):
            await dead_letter(bus, msg, stream, consumer, str(failure))
        else:
            delivered = msg.metadata.num_delivered
            if delivered >= max_deliver:
                await dead_letter(bus, msg, stream, consumer, f"failed {delivered} times, last: {failure}")
            else:
                log.warning("%s: %s on %s failed (delivery %d): %s", consumer, type(event).__name__, msg.subject, delivered, failure)
                await msg.nak(delay=min(0.2 * 2**delivered, 10.0))
    except nats.errors.Error as exc:  # NATS is away: JetStream redelivers after ack_wait
        log.warning("%s: could not settle %s: %s", consumer, msg.subject, exc)
    finally:
        span.end()
