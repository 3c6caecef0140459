"""The streams dralloc keeps (`STREAMS`), their environment-set knobs, and creating or checking them.

`ensure_streams` is the bootstrap identity's job (the allocator, or an operator); `check_streams`
is every other service's: both refuse a stream whose limits were weakened (`streamcheck`).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import os
from typing import TYPE_CHECKING

import nats.js.errors
from nats.js.api import StorageType, StreamConfig

from dralloc.bus import streamcheck
from dralloc.bus.errors import BusError
from dralloc.schemas import events

if TYPE_CHECKING:
    from dralloc.bus.client import Bus

log = logging.getLogger("dralloc.bus")

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

REFUSAL_TTL_S = 600.0
"""How long an EvictionRefused stays in CLAIMS (``Nats-TTL``): twice the allocator's eviction patience
(services/allocator/evicting.py ``EVICTION_PATIENCE``, 300 s), the longest a refusal changes anything
(the eviction it answers is over by then). A leader taking over within it replays the refusal; one
refusal per claim in the way no longer stays for good."""

TOMBSTONES = (events.ClaimDeleted, events.PodDeleted)
"""Events published with ``Nats-TTL``. (Not AllocationReleased: ALLOCATIONS keeps every decision,
so an expired release would bring back the commit before it. A PodDeleted that expires unseen
leaves no unit behind: its Pod's claims are deleted, or decided, by then.)"""

RESUBMITTABLE = (events.ClaimSubmitted, events.ClaimDeleted, events.PodSubmitted, events.PodDeleted)
"""Events whose identity (uid, generation) repeats when a claim is submitted, deleted and submitted
again: a duplicate ack for one is checked against what its subject holds (`Bus.publish`)."""

MAX_BATCH = 1000
"""Messages in one atomic batch, at most (JetStream refuses a larger one: error 10199)."""


FETCH_WAIT_S = 1.0
"""Longest wait of one pull request, and so the longest a consumer takes to notice `stop`."""


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


def refuse_weakened(name: str, actual: StreamConfig, wanted: StreamConfig) -> None:
    """Raise `BusError` when `actual` (a stream as the server has it) is weaker than `wanted`."""
    if problems := streamcheck.weakened(actual, wanted):
        raise BusError(
            f"stream {name} has been weakened: {'; '.join(problems)}. dralloc refuses to run on it (decisions or "
            "claims could be lost); restore its configuration (nats stream edit) or recreate it"
        )


def tombstone_ttl_from_env() -> float:
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
    size = len("NATS/1.0\r\n\r\n")
    for key, value in headers.items():
        value = str(value)
        # an ASCII string's length is its UTF-8 length (`isascii` is O(1)): no bytes made per header
        # (this is on every publish: ~5.5 -> ~1.8 us for a commit's five headers)
        size += (len(key) if key.isascii() else len(key.encode())) + (len(value) if value.isascii() else len(value.encode())) + 4
    return size


def stream_configs() -> dict[str, StreamConfig]:
    """`STREAMS` with the deployment's replicas (`replicas_from_env`), by name."""
    replicas = replicas_from_env()
    return {name: dataclasses.replace(config, num_replicas=replicas) for name, config in STREAMS.items()}


async def ensure_streams(bus: Bus) -> None:
    """Create the missing streams and bring an existing one's configuration up to date (the bootstrap
    identity's job: the allocator, or an operator; a credential without the right is refused by
    the server). Raises `BusError` for a stream that has been weakened (`streamcheck.weakened`):
    dralloc does not paper over that, an operator looks first. A stream already as wanted is not
    updated, so this needs no update right then."""
    for name, config in stream_configs().items():
        try:
            info = await bus._js.stream_info(name)
        except nats.js.errors.NotFoundError:
            with contextlib.suppress(nats.js.errors.BadRequestError):  # created concurrently by another service
                await bus._js.add_stream(config)
                continue
            info = await bus._js.stream_info(name)
        refuse_weakened(name, info.config, config)
        # never fewer replicas than the stream has (an operator may run more than dralloc asks)
        config = dataclasses.replace(config, num_replicas=max(config.num_replicas or 1, info.config.num_replicas or 1))
        if streamcheck.differs(info.config, config):
            await bus._js.update_stream(config)
    await check_atomic(bus)


async def check_streams(bus: Bus, stop: asyncio.Event | None = None, *, wait: float = FETCH_WAIT_S) -> None:
    """For a service that may not create or change streams: wait until each exists (the bootstrap
    identity makes them), then refuse to run (`BusError`) on one that is weakened or not set up
    as dralloc needs. Returns early if `stop` is set."""
    for name, config in stream_configs().items():
        told = False
        while True:
            try:
                info = await bus._js.stream_info(name)
                break
            except nats.js.errors.NotFoundError:
                if not told:
                    log.warning("%s: stream %s does not exist yet; waiting for the allocator to create it", bus.name, name)
                    told = True
                if stop is not None and stop.is_set():
                    return
                await asyncio.sleep(wait)
        refuse_weakened(name, info.config, config)
        if missing := [f for f in streamcheck.differs(info.config, config) if f not in ("num_replicas",)]:
            raise BusError(
                f"stream {name} is not set up as dralloc needs ({', '.join(missing)} differ); the allocator "
                "brings it up to date at its start (or run `dralloc get deadletters` as the admin user)"
            )
    await check_atomic(bus)


async def check_atomic(bus: Bus) -> None:
    """Raise `BusError` when the server has no JetStream atomic batches (before 2.12)."""
    # A server before 2.12 ignores allow_atomic, and then the headers of a batch too: each message
    # would be stored on its own, so a gang's commit could be cut part way. Say so now instead.
    if not (await bus._js.stream_info("ALLOCATIONS")).config.allow_atomic:
        raise BusError(
            f"nats-server {bus._nc.connected_server_version} has no JetStream atomic batches (2.12 or later needed): a gang's decisions could be stored in part"
        )
