"""JetStream key-value buckets (the leader lease, the status store), created on first use."""

from __future__ import annotations

from typing import TYPE_CHECKING

import nats.js.errors
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from dralloc.bus.streams import replicas_from_env

if TYPE_CHECKING:
    from dralloc.bus.client import Bus


async def key_value(bus: Bus, bucket: str, *, history: int = 1) -> KeyValue:
    """`Bus.key_value`: the bucket, created (keeping `history` values per key, with the deployment's
    replicas) when it does not exist yet."""
    try:
        return await bus._js.key_value(bucket)
    except nats.js.errors.BucketNotFoundError:
        return await bus._js.create_key_value(KeyValueConfig(bucket=bucket, history=history, replicas=replicas_from_env()))
