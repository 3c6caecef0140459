"""Consuming a stream: a pull consumer loop that decodes, traces, hands each event to a handler and
acks, retries or dead-letters it (the rules are in `dralloc.bus`'s docstring, Consuming).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import nats.errors
from nats.aio.msg import Msg
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy
from opentelemetry import trace
from opentelemetry.trace import Span, SpanKind

from dralloc import telemetry
from dralloc.bus import streamcheck
from dralloc.bus.deadletter import dead_letter, exhausted
from dralloc.bus.errors import Permanent
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

MAX_IN_FLIGHT = 256
"""Messages a consumer has handled but not yet acked (their effects not yet durable), at most."""


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
    batch: int = 64,
) -> None:
    """`Bus.consume`: process the stream's messages with `handler` until `stop` is set (see the
    `dralloc.bus` docstring)."""
    consumer_name = durable or name or bus.name
    config = ConsumerConfig(
        ack_policy=AckPolicy.EXPLICIT,
        max_deliver=max_deliver,
        ack_wait=ack_wait,
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
    in_flight: set[asyncio.Task[None]] = set()
    try:
        while not stop.is_set():
            bus.pulses[consumer_name] = time.monotonic()
            try:
                # A short long-poll, never cancelled: a cancelled fetch leaves a pull request on the
                # server that strands messages until ack_wait, so a stop waits for it (<= 1 s).
                messages = await sub.fetch(batch, timeout=FETCH_WAIT_S)
            except (nats.errors.TimeoutError, TimeoutError):
                continue
            except nats.errors.Error as exc:
                if stop.is_set():
                    break
                log.warning("%s: fetching from %s failed: %s; retrying", consumer_name, stream, exc)
                await asyncio.sleep(0.5)
                continue
            for msg in messages:
                if stop.is_set():
                    await msg.nak()  # fetched but not started: hand it back at once
                    continue
                finishing = await _process(bus, msg, handler, stream, consumer_name, max_deliver)
                if finishing is not None:
                    in_flight.add(finishing)
                    finishing.add_done_callback(in_flight.discard)
                    if len(in_flight) >= MAX_IN_FLIGHT:
                        await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
    finally:
        bus.pulses.pop(consumer_name, None)
        if in_flight:  # every handled message is acked or handed back before the consumer ends
            await asyncio.wait(in_flight)
        with contextlib.suppress(Exception):
            await sub.unsubscribe()
        if advisories is not None:
            with contextlib.suppress(Exception):
                await advisories.unsubscribe()


async def _process(bus: Bus, msg: Msg, handler: Handler, stream: str, consumer: str, max_deliver: int) -> asyncio.Task[None] | None:
    """Handle one message; returns the task that acks it once its effect is durable, if that is still to come."""
    bus.pulses[consumer] = time.monotonic()
    try:
        event = events.decode(msg.data)
    except EventDecodeError as exc:
        await dead_letter(bus, msg, stream, consumer, str(exc))
        return None
    if (problem := streamcheck.misplaced(stream, msg.subject, event)) is not None:
        await dead_letter(bus, msg, stream, consumer, problem)  # forged or misfiled: never acted on
        return None
    span = telemetry.tracer().start_span(
        f"process {msg.subject}",
        context=telemetry.extract(msg.headers),
        kind=SpanKind.CONSUMER,
        attributes={
            "messaging.system": "nats",
            "messaging.operation.type": "process",
            "messaging.destination.name": msg.subject,
            "messaging.consumer.group.name": consumer,
            "messaging.message.id": (msg.headers or {}).get("Nats-Msg-Id", ""),
            "dralloc.event": type(event).__name__,
            "dralloc.delivery": msg.metadata.num_delivered,
        },
    )
    with trace.use_span(span, end_on_exit=False):
        try:
            durable = await handler(event)
        except Exception as exc:
            await _settle(bus, msg, exc, event, stream, consumer, max_deliver, span)
            return None
        except BaseException:
            span.end()
            raise
    if durable is None:
        await _settle(bus, msg, None, event, stream, consumer, max_deliver, span)
        return None
    return asyncio.create_task(_finish(bus, msg, durable, event, stream, consumer, max_deliver, span))


async def _finish(bus: Bus, msg: Msg, durable: Awaitable[Any], event: Event, stream: str, consumer: str, max_deliver: int, span: Span) -> None:
    """Settle a handled message once its effect (`durable`) is stored, or failed to be."""
    try:
        await durable
    except Exception as exc:  # noqa: BLE001 - settled as a failing handler is: retried, then dead-lettered
        await _settle(bus, msg, exc, event, stream, consumer, max_deliver, span)
    else:
        await _settle(bus, msg, None, event, stream, consumer, max_deliver, span)


async def _settle(bus: Bus, msg: Msg, failure: Exception | None, event: Event, stream: str, consumer: str, max_deliver: int, span: Span) -> None:
    """Ack a handled message, or dead-letter it (`Permanent`, or the last delivery) or hand it back for a retry."""
    delivered = msg.metadata.num_delivered
    try:
        if failure is None:
            await msg.ack()
        elif isinstance(failure, Permanent):
            await dead_letter(bus, msg, stream, consumer, str(failure))
        else:
            if delivered >= max_deliver:
                await dead_letter(bus, msg, stream, consumer, f"failed {delivered} times, last: {failure}")
            else:
                log.warning("%s: %s on %s failed (delivery %d): %s", consumer, type(event).__name__, msg.subject, delivered, failure)
                await msg.nak(delay=min(0.2 * 2**delivered, 10.0))
    except nats.errors.Error as exc:  # NATS is away: JetStream redelivers after ack_wait
        log.warning("%s: could not settle %s: %s", consumer, msg.subject, exc)
    finally:
        span.end()
