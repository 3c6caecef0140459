"""JetStream key-value buckets (the leader lease, the status store), created on first use, and read whole."""

from __future__ import annotations

from typing import TYPE_CHECKING

import nats.js.errors
from nats.js.api import KeyValueConfig
from nats.js.kv import KeyValue

from dralloc.bus.lookup import StoredMessage
from dralloc.bus.read import scan_js
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


_GONE = ("DEL", "PURGE")  # KV-Operation of a deleted or purged key's marker


async def items(kv: KeyValue) -> list[tuple[str, bytes]]:
    """Each key of the bucket with its value, deleted and purged keys left out: one pass of a pull
    consumer over the bucket's stream, the last message of each key. nats-py's `keys()` lists through
    a push watcher whose "no more" marker can come before the first key: it reads the consumer's
    pending count after the server has pushed every key and its delivered count before any was
    handed over, so a busy client reads a full bucket as empty (a CI run saw a stored claim vanish
    from `read_all` so). A pull consumer's pending count is exact when it is made, and the values
    come with the keys (no `get` per key)."""
    found: list[tuple[str, bytes]] = []
    pre = kv._pre

    def keep(msg: StoredMessage) -> None:
        # (nats-server 2.11+ marks a key removed by TTL or age with Nats-Marker-Reason instead)
        if msg.headers.get("KV-Operation") not in _GONE and "Nats-Marker-Reason" not in msg.headers:
            found.append((msg.subject[len(pre) :], msg.data))

    # (its consumer deleted when done: the bucket's readers, the CLI and the demo, may; a poller
    # would otherwise keep up to 1,000 open: `scan_js`)
    await scan_js(kv._js, kv._stream, keep, subjects=[f"{pre}>"], last_per_subject=True, delete=True)
    return found
