"""The status writer: applies every allocation decision to a sink (local KV store or Kubernetes).

    dralloc run statuswriter [--sink local|kubernetes] [--bucket NAME]

Environment: ``DRALLOC_STATUSWRITER_SINK``, ``DRALLOC_STATUSWRITER_BUCKET``,
``KUBECONFIG``; flags override them. The local store is a JetStream KV bucket
(default ``dralloc-claims``), read by `dralloc get claims`. It reads
ALLOCATIONS with the durable consumer ``statuswriter-<sink>``, so a restart
resumes where it stopped; that consumer's backlog is the ``dralloc.consumer.lag``
gauge (`dralloc.metrics`).
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Any, Literal

from dralloc.bus import Bus, decode_event, report_lag
from dralloc.schemas import events as ev
from dralloc.settings import one_of, overridden
from dralloc.statuswriter.reading import Committed
from dralloc.statuswriter.sinks import DEFAULT_BUCKET, KVSink, StatusSink

Sink = Literal["local", "kubernetes"]
SINKS: tuple[Sink, ...] = ("local", "kubernetes")


@dataclass
class Config:
    sink: Sink = "local"
    bucket: str = DEFAULT_BUCKET
    kubeconfig: str | None = None
    ack_wait: float = 30.0
    """Seconds before an unacked event is redelivered (a crashed writer's work is redone)."""

    @classmethod
    def from_env(cls, **overrides: Any) -> Config:
        env = os.environ
        sink = overrides.pop("sink", None) or env.get("DRALLOC_STATUSWRITER_SINK", "local")  # (the flag over the variable)
        config = cls(
            sink=one_of(sink, SINKS, "sink"),
            bucket=env.get("DRALLOC_STATUSWRITER_BUCKET", DEFAULT_BUCKET),
            kubeconfig=env.get("KUBECONFIG") or None,
        )
        overridden(config, overrides)
        return config


async def make_sink(bus: Bus, config: Config) -> StatusSink:
    if config.sink == "kubernetes":
        from dralloc.statuswriter.kubernetes import KubernetesSink  # only when asked: needs a cluster

        return KubernetesSink(config, tell=bus.publish)  # (refused evictions told to the allocator)
    return KVSink(await bus.key_value(config.bucket), bus, config.bucket)


async def apply(sink: StatusSink, event: ev.Event | Committed) -> Awaitable[Any] | None:
    """One event to the sink (the pure dispatch; other event types are not ours and are ignored).
    Returns what completes once the effect is durable, if the sink is still writing it."""
    if isinstance(event, ev.AllocationCommitted):
        return await sink.committed(event)
    if isinstance(event, Committed) and isinstance(sink, KVSink):  # (only the local store reads commits so: `KVSink.decode`)
        return await sink.committed(event)
    if isinstance(event, ev.AllocationFailed):
        return await sink.failed(event)
    if isinstance(event, ev.AllocationReleased):
        return await sink.released(event)
    if isinstance(event, ev.EvictionRequested) and (evict := getattr(sink, "evict", None)) is not None:
        return await evict(event)  # (the Kubernetes sink's; the local store has no Pods to evict)
    return None


async def serve(bus: Bus, config: Config, stop: asyncio.Event, *, sink: StatusSink | None = None) -> None:
    sink = sink or await make_sink(bus, config)
    durable = f"statuswriter-{config.sink}"

    async def handle(event: ev.Event | Committed) -> Awaitable[Any] | None:
        return await apply(sink, event)

    # A sink may read the decisions its own way (the local store: only what a record is made of), and
    # says whether what it writes carries the claim's trace on (neither sink's writes do).
    decode = getattr(sink, "decode", decode_event)
    traced = getattr(sink, "traced", True)
    lag = asyncio.create_task(report_lag(bus, "ALLOCATIONS", durable, stop))
    try:
        await bus.consume("ALLOCATIONS", handle, stop, durable=durable, ack_wait=config.ack_wait, decode=decode, context=traced)
    finally:
        lag.cancel()  # (it ends by itself on stop; not when the consumer failed)
        if (close := getattr(sink, "close", None)) is not None:
            await close()
