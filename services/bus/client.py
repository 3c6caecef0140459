"""The bus's client: connecting to NATS (credentials and TLS from `dralloc.natsauth`, never a secret in
a message or log), publishing events with their trace context, and the `Bus` that consumers,
replays, dead letters and KV buckets are reached through.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import os
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import PubAck
from opentelemetry.context import Context
from opentelemetry.trace import SpanKind

from dralloc import natsauth, telemetry
from dralloc.bus import consume, deadletter, kv, lookup, read, replay, streams
from dralloc.bus.errors import BusError, PublishRefused
from dralloc.bus.headers import install as install_header_parser
from dralloc.bus.streams import MAX_BATCH, REFUSAL_TTL_S, RESUBMITTABLE, TOMBSTONES, header_bytes, tombstone_ttl_from_env
from dralloc.schemas import events
from dralloc.schemas.events import Event

log = logging.getLogger("dralloc.bus")

install_header_parser()  # nats-py reads message headers with dralloc.bus.headers' faster, equal parser


class _Ack(msgspec.Struct):
    """JetStream's answer to a publish (what `Bus._on_reply` reads of it): an ack, or an error."""

    stream: str | None = None
    seq: int | None = None
    domain: str | None = None
    duplicate: bool | None = None
    batch: str | None = None
    count: int | None = None
    val: str | None = None
    error: dict[str, Any] | None = None


_ACK_DECODER = msgspec.json.Decoder(_Ack)

DEFAULT_URL = "nats://127.0.0.1:4222"

SWEEP_S = 0.25
"""How often the acks `Bus.send` awaits are checked for their timeout (so one raises up to this late)."""

INITIAL_REFUSALS = 3
"""Refused connections (about a second) before `Bus.connect` gives up on a first connection."""


class _Inline:
    """What nats-py takes for a request's future (`subscribe(future=)`), handing each message to
    `deliver` at once, in the connection's reader: nats-py (pinned below 3) delivers a message to
    a subscription that has a future with ``future.set_result(msg)`` right where it reads it,
    where a subscription with a callback queues it for a task of its own that wakes once per
    message (a tenth of the cost of an ack, for every `Bus.send`). `deliver` must not raise or
    block: it runs inside the reader."""

    __slots__ = ("set_result",)

    def __init__(self, deliver: Callable[[Msg], None]) -> None:
        self.set_result = deliver

    def cancelled(self) -> bool:
        return False


class Bus:
    """A connection to NATS with JetStream, speaking dralloc events."""

    def __init__(self, nc: nats.NATS, name: str, *, tombstone_ttl: float | None = None) -> None:
        self._nc = nc
        self._js = nc.jetstream()
        self.name = name
        self._reply_prefix = ""
        self._reply_tokens = itertools.count()
        self._replies: dict[str, tuple[asyncio.Future[PubAck], float, float]] = {}
        """`send`'s acks still to come, by the token ending their reply subject: (the ack, when it is given
        up on (loop time), its timeout)."""
        self._sweeping: asyncio.TimerHandle | None = None
        """The one timer that gives up on acks past their time (`_sweep`), while any is awaited."""
        self.tombstone_ttl = tombstone_ttl if tombstone_ttl is not None else tombstone_ttl_from_env()
        """Seconds a tombstone this bus publishes stays stored (`TOMBSTONE_TTL_S`)."""
        self.refusal_ttl = REFUSAL_TTL_S
        """Seconds an EvictionRefused this bus publishes stays stored (`REFUSAL_TTL_S`)."""
        self.closed = asyncio.Event()
        """Set when the connection is closed for good (the client gave up, or the server closed it on a
        protocol error): nothing more will be delivered on it (`run_service` exits non-zero)."""
        self.pulses: dict[str, float] = {}
        """Per running consumer, when its loop last went round (monotonic): a stuck consumer stops
        beating (`dralloc.probes`)."""

    @classmethod
    async def connect(cls, url: str | None = None, *, name: str = "dralloc", timeout: float = 5.0) -> Bus:
        url = url or os.environ.get("NATS_URL") or DEFAULT_URL
        shown = natsauth.redact(url)  # the URL may carry user:password@: never in a message or log
        try:
            security = natsauth.connect_options(url)  # credentials and TLS from NATS_* variables
            ttl = tombstone_ttl_from_env()
        except (natsauth.AuthConfigError, BusError) as exc:
            raise BusError(f"cannot connect to NATS at {shown}: {natsauth.redact(str(exc))}") from None
        nc = nats.NATS()
        closed = asyncio.Event()

        async def on_closed() -> None:
            closed.set()

        failures = 0
        last_error: Exception | None = None

        async def on_error(exc: Exception) -> None:
            # Before the first connection the caller gets one clear error; afterwards, log.
            nonlocal failures, last_error
            last_error = exc
            if nc.is_connected or nc.is_reconnecting:
                log.warning("nats: %s", natsauth.redact(str(exc)))
            elif isinstance(exc, ConnectionRefusedError) and (failures := failures + 1) >= INITIAL_REFUSALS:
                raise exc  # nothing listens there: say so now rather than at the timeout
            elif isinstance(exc, nats.errors.AuthorizationError) or "authorization violation" in str(exc).lower():
                raise exc  # wrong credentials do not get better by retrying

        try:
            # The client retries forever once connected (reconnects); the first connection
            # gets `timeout` seconds in all.
            await asyncio.wait_for(
                nc.connect(
                    [u.strip() for u in url.split(",") if u.strip()],  # a cluster: several URLs, comma-separated
                    name=f"dralloc-{name}",
                    connect_timeout=timeout,  # type: ignore[arg-type]  # nats-py says int; seconds as float work (asyncio timeouts)
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,  # type: ignore[arg-type]  # (as connect_timeout)
                    drain_timeout=2,
                    error_cb=on_error,
                    closed_cb=on_closed,
                    **security,
                ),
                timeout,
            )
        except (OSError, nats.errors.Error, TimeoutError) as exc:
            with contextlib.suppress(Exception):
                await nc.close()
            reason = str(exc) or f"no answer within {timeout:g}s" + (f" (last error: {last_error})" if last_error else "")
            raise BusError(
                f"cannot connect to NATS at {shown}: {natsauth.redact(reason)} (is a nats-server with JetStream running there? `dralloc demo` starts its own)"
            ) from None
        bus = cls(nc, name, tombstone_ttl=ttl)
        bus.closed = closed
        return bus

    async def close(self) -> None:
        if not self._nc.is_closed:
            with contextlib.suppress(Exception):
                await self._nc.drain()
            with contextlib.suppress(Exception):
                await self._nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # What a Bus does beyond connecting and publishing lives in a module per concern; each function
    # takes the bus first, so it is the method itself (no second signature to keep in step).
    stream_configs = staticmethod(streams.stream_configs)
    ensure_streams = streams.ensure_streams
    check_streams = streams.check_streams
    consume = consume.consume
    replay = replay.replay
    dead_letters = deadletter.dead_letters
    key_value = kv.key_value
    last_message = lookup.last_message
    stream_state = lookup.stream_state
    subject_counts = lookup.subject_counts
    stream_config = lookup.stream_config
    scan = read.scan
    first_after = read.first_after
    follow = read.follow

    # The connection's state, read from nats-py's client (which stays private to the bus: no
    # caller reaches NATS except through these methods; tests/test_architecture.py).
    @property
    def max_payload(self) -> int:
        """The largest message, body and headers together, the server accepts (bytes)."""
        return self._nc.max_payload

    @property
    def is_connected(self) -> bool:
        """Connected now (False while reconnecting)."""
        return self._nc.is_connected

    @property
    def is_closed(self) -> bool:
        """Closed for good (by `close`, or the client gave up): nothing more will be delivered."""
        return self.closed.is_set() or self._nc.is_closed

    @property
    def connected_url(self) -> str | None:
        """The server URL connected to now (None while not connected). It may carry credentials
        (``user:password@``): pass it on to a process, but log only `natsauth.redact`'s form."""
        url = self._nc.connected_url
        return url.geturl() if url is not None else None

    async def request(self, subject: str, data: bytes, *, timeout: float = 2.0) -> bytes:
        """A core NATS request (e.g. to the JetStream API, ``$JS.API.*``): the reply's body. Raises
        `NatsError` (no responders, no permission) or `TimeoutError`."""
        reply = await self._nc.request(subject, data, timeout=timeout)
        return reply.data or b""

    async def publish(self, event: Event, *, headers: dict[str, str] | None = None, msg_id: str | None = None) -> PubAck:
        """Publish and wait for JetStream to store it (``ack.duplicate``: an earlier publish stored it).

        `headers` are added to the message (e.g. ``Nats-Expected-Last-Sequence``, which makes the
        server refuse the write when the stream has moved on: the allocator's fence); `msg_id`
        replaces the event's own ``Nats-Msg-Id``."""
        subject, data, marks = self._outgoing(event, headers, msg_id)
        ack = await self._js.publish(subject, data, headers=marks)
        if ack.duplicate and msg_id is None and isinstance(event, RESUBMITTABLE):
            ack = await self._resubmit(ack, subject, data, marks)
        return ack

    async def _resubmit(self, ack: PubAck, subject: str, data: bytes, headers: dict[str, str]) -> PubAck:
        """A claim event JetStream called a duplicate: a retry of what the subject holds now stays one,
        but if the subject has moved on (submit, delete, submit again within the duplicate window:
        the same uid and generation, so the same ``Nats-Msg-Id``), it is news, stored under an id
        that names what it follows (so a retry of it is deduplicated in turn)."""
        base = headers["Nats-Msg-Id"]
        try:
            last = await self._js.get_last_msg(ack.stream, subject)
        except nats.js.errors.NotFoundError:
            last = None  # the subject is empty (its delete expired): nothing to be a retry of
        held = (last.headers or {}).get("Nats-Msg-Id", "") if last is not None else ""
        if held == base or held.startswith(f"{base}:after:"):
            return ack  # a retry of the event the subject holds: a duplicate indeed
        after = f"{last.seq}" if last is not None else f"empty-{uuid.uuid4().hex}"
        return await self._js.publish(subject, data, headers={**headers, "Nats-Msg-Id": f"{base}:after:{after}"})

    async def send(self, event: Event, *, headers: dict[str, str] | None = None, msg_id: str | None = None, timeout: float = 5.0) -> asyncio.Future[PubAck]:
        """Publish without waiting for the store: returns once the message is on its way (messages
        leave in call order), with an awaitable for JetStream's ack (raising as `publish` does, or
        `TimeoutError` after `timeout` seconds without an answer). Several may be in flight at once."""
        subject, data, headers = self._outgoing(event, headers, msg_id)
        return await self.send_bytes(subject, data, headers=headers, timeout=timeout)

    async def send_batch(
        self,
        events: Sequence[Event],
        *,
        headers: dict[str, str] | None = None,
        first: dict[str, str] | None = None,
        msg_ids: Sequence[str] | None = None,
        traces: Sequence[Context | None] | None = None,
        timeout: float = 5.0,
    ) -> asyncio.Future[PubAck]:
        """`send` for events stored all or none (an atomic batch); the awaitable gives the ack of the
        batch's last message (``seq``: its sequence, ``batch_size``: how many were stored) or raises
        the server's refusal, and then none was stored. A batch cut off before its last message (the
        process died, the connection broke) is dropped by the server, never stored in part.

        `headers` go on every message, `first` only on the first: JetStream checks
        ``Nats-Expected-Last-Sequence`` there, against the stream before the batch, but refuses
        ``Nats-Expected-Last-Msg-Id`` in a batch (10177). `msg_ids` replace the events' own
        ``Nats-Msg-Id``s; a batch holding an id already stored is refused whole (10201). `traces`: the
        trace each event continues (None: the current one), e.g. each claim's own."""
        if not events or len(events) > MAX_BATCH:
            raise PublishRefused(f"an atomic batch holds 1 to {MAX_BATCH} events, not {len(events)}")
        batch = uuid.uuid4().hex  # at most 64 characters
        outgoing = []
        for i, event in enumerate(events):
            marks = {**(headers or {}), **((first or {}) if i == 0 else {}), "Nats-Batch-Id": batch, "Nats-Batch-Sequence": str(i + 1)}
            if i == len(events) - 1:
                marks["Nats-Batch-Commit"] = "1"
            outgoing.append(self._outgoing(event, marks, msg_ids[i] if msg_ids else None, traces[i] if traces else None))
        # Only the commit is answered; the messages before it are staged by the server.
        for subject, data, marks in outgoing[:-1]:
            await self._nc.publish(subject, data, headers=marks)
        subject, data, marks = outgoing[-1]
        return await self.send_bytes(subject, data, headers=marks, timeout=timeout)

    async def send_bytes(self, subject: str, data: bytes, *, headers: dict[str, str] | None = None, timeout: float = 5.0) -> asyncio.Future[PubAck]:
        """`send` for a payload that is not an event (e.g. a KV bucket's ``$KV.<bucket>.<key>``)."""
        # Our own replies, not nats-py's publish_async: that one loses a refusal (its reply handler
        # raises the server's error instead of handing it to the waiting future). The ack is a bare
        # future settled by `_on_reply`, given up on by one timer for all of them (`_sweep`): no task,
        # wait_for or timer per message (at thousands of messages a second those were a visible
        # share of a service's CPU). The answers are handed to `_on_reply` by nats-py's reader as
        # they are read (`_Inline`), not through a subscription task woken per answer.
        if not self._reply_prefix:
            self._reply_prefix = self._nc.new_inbox()
            await self._nc.subscribe(f"{self._reply_prefix}.*", future=_Inline(self._on_reply))  # type: ignore[arg-type]  # (see _Inline)
        token = str(next(self._reply_tokens))
        loop = asyncio.get_running_loop()
        future: asyncio.Future[PubAck] = loop.create_future()
        try:
            await self._nc.publish(subject, data, reply=f"{self._reply_prefix}.{token}", headers=headers)
        except BaseException:
            future.cancel()
            raise
        self._replies[token] = (future, loop.time() + timeout, timeout)
        if self._sweeping is None:
            self._sweeping = loop.call_later(min(timeout, SWEEP_S), self._sweep)
        return future

    def _sweep(self) -> None:
        """Every `SWEEP_S` while acks are awaited: each ack past its time raises `TimeoutError` (so
        at most `SWEEP_S` after its timeout), and one whose awaiting was given up (cancelled) is dropped."""
        loop = asyncio.get_running_loop()
        now = loop.time()
        expired = [token for token, (future, deadline, _) in self._replies.items() if deadline <= now or future.done()]
        for token in expired:
            future, _, timeout = self._replies.pop(token)
            if not future.done():
                future.set_exception(TimeoutError(f"no answer from JetStream within {timeout:g}s"))
        self._sweeping = loop.call_later(SWEEP_S, self._sweep) if self._replies else None

    def _on_reply(self, msg: Msg) -> None:
        """One of `send`'s answers, in nats-py's reader: its ack settled (never raises)."""
        pending = self._replies.pop(msg.subject.rpartition(".")[2], None)
        if pending is None:
            return
        future = pending[0]
        if future.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer = _ACK_DECODER.decode(msg.data)
            if answer.error is not None:
                nats.js.errors.APIError.from_error(answer.error)  # raises the error's own class
            if answer.stream is None or answer.seq is None:
                raise nats.js.errors.APIError(description=f"not a JetStream ack: {msg.data[:200]!r}")
            future.set_result(
                PubAck(
                    stream=answer.stream,
                    seq=answer.seq,
                    domain=answer.domain,
                    duplicate=answer.duplicate,
                    batch_id=answer.batch,
                    batch_size=answer.count,
                    val=answer.val,
                )
            )
        except Exception as exc:  # noqa: BLE001 - whatever the answer is wrong with, the sender hears it
            future.set_exception(exc)

    def _outgoing(
        self, event: Event, headers: dict[str, str] | None, msg_id: str | None, trace_context: Context | None = None
    ) -> tuple[str, bytes, dict[str, str]]:
        """Subject, payload and headers of an event, under a PRODUCER span (in `trace_context`, else the
        current one) whose context the headers carry."""
        subject = event.subject
        msg_id = msg_id or event.msg_id
        data = events.encode(event)
        marks = {**(headers or {}), "Nats-Msg-Id": msg_id}
        if isinstance(event, TOMBSTONES):  # the subject empties once every consumer has seen it
            marks["Nats-TTL"] = f"{max(1, round(self.tombstone_ttl))}s"
        elif isinstance(event, events.EvictionRefused):  # it matters for an eviction's patience, then expires
            marks["Nats-TTL"] = f"{max(1, round(self.refusal_ttl))}s"
        if telemetry.recording():
            attributes = {
                "messaging.system": "nats",
                "messaging.operation.type": "send",
                "messaging.destination.name": subject,
                "messaging.message.id": msg_id,
                "dralloc.event": type(event).__name__,
            }
            with telemetry.tracer().start_as_current_span(f"send {subject}", context=trace_context, kind=SpanKind.PRODUCER, attributes=attributes):
                return subject, data, self._fits(event, subject, data, telemetry.inject(marks))  # (a refusal is the span's error)
        # Nothing records: a span that only carries context, its ids into the headers, nothing made current.
        span = telemetry.tracer().start_span("send", context=trace_context, kind=SpanKind.PRODUCER)
        return subject, data, self._fits(event, subject, data, telemetry.inject(marks, span))

    def _fits(self, event: Event, subject: str, data: bytes, marks: dict[str, str]) -> dict[str, str]:
        """`marks`, once the message is known to fit: the server's limit is on body and headers together,
        and a message over it makes the server close the connection, so it is refused here instead."""
        if (size := len(data) + header_bytes(marks)) > self._nc.max_payload:
            raise PublishRefused(
                f"{type(event).__name__} on {subject} is {size} bytes with its headers, over the server's message limit of {self._nc.max_payload} bytes"
            )
        return marks
