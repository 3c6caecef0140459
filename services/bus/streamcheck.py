"""What may be in each stream, and what a stream's configuration must keep: pure checks, no I/O.

`dralloc.bus` calls them on every message a consumer or a replay reads, and on
every stream at a service's start. They exist because a credential that may
publish on one subject tree could otherwise forge what belongs to another (the
ingestor's credential writing an ``AllocationCommitted`` into CLAIMS), name
one object in the body while being stored under another's subject (so a
claim's delete would never remove it), or weaken a stream (a lower
``max_msgs`` drops committed decisions) so that a restarted allocator decides
running claims again.
"""

from __future__ import annotations

from typing import Any, get_args

from nats.js.api import DiscardPolicy, RetentionPolicy, StorageType, StreamConfig

from dralloc.schemas import events as ev

STREAM_EVENTS: dict[str, tuple[type, ...]] = {
    "INVENTORY": get_args(ev.InventoryEvent),
    "CLAIMS": get_args(ev.ClaimEvent),
    "ALLOCATIONS": get_args(ev.AllocationEvent),
}
"""The event types each stream may hold; anything else read from it is never acted on (a consumer
dead-letters it, a rebuild skips and logs it)."""


def misplaced(stream: str, subject: str, event: ev.Event) -> str | None:
    """Why `event`, read from `stream` under `subject`, must not be acted on; None when it belongs there.

    An event belongs when its type is one of the stream's (`STREAM_EVENTS`) and the subject it
    was stored under is the subject its own body names (so the body and the subject name the
    same object: a later event on that subject, e.g. the claim's delete, replaces it)."""
    allowed = STREAM_EVENTS.get(stream)
    if allowed is not None and not isinstance(event, allowed):
        return f"{type(event).__name__} does not belong in {stream} (only {', '.join(t.__name__ for t in allowed)})"
    if event.subject != subject:
        return f"{type(event).__name__} stored under {subject} names another object ({event.subject})"
    return None


def _unlimited(value: Any) -> bool:
    return value is None or value <= 0


def weakened(actual: StreamConfig, wanted: StreamConfig) -> list[str]:
    """How the stream `actual` keeps less, deduplicates less or accepts more than `wanted` (empty: it
    does not). A limit is weaker when it is lower than ours (unlimited beats every number); a
    stream that keeps more than we ask (e.g. made by an older release) is not weakened.

    `allow_atomic` is not judged here: the bootstrap identity turns it on in place, and
    `dralloc.bus` checks it after."""
    problems: list[str] = []

    def limit(name: str, have: Any, want: Any, unit: str = "") -> None:
        if _unlimited(want):
            if not _unlimited(have):
                problems.append(f"{name} is {have}{unit}, dralloc needs it unlimited")
        elif not _unlimited(have) and have < want:
            problems.append(f"{name} is {have}{unit}, dralloc needs at least {want}{unit}")

    if set(actual.subjects or []) != set(wanted.subjects or []):
        problems.append(f"subjects are {sorted(actual.subjects or [])}, dralloc needs {sorted(wanted.subjects or [])}")
    if (actual.retention or RetentionPolicy.LIMITS) != (wanted.retention or RetentionPolicy.LIMITS):
        problems.append(f"retention is {_name(actual.retention)}, dralloc needs {_name(wanted.retention or RetentionPolicy.LIMITS)}")
    limit("max_msgs", actual.max_msgs, wanted.max_msgs)
    limit("max_bytes", actual.max_bytes, wanted.max_bytes)
    limit("max_age", actual.max_age, wanted.max_age, "s")
    limit("max_msgs_per_subject", actual.max_msgs_per_subject, wanted.max_msgs_per_subject)
    limit("max_msg_size", actual.max_msg_size, wanted.max_msg_size)
    if (actual.duplicate_window or 0) < (wanted.duplicate_window or 0):
        problems.append(f"duplicate_window is {actual.duplicate_window}s, dralloc needs at least {wanted.duplicate_window}s")
    if (actual.num_replicas or 1) < (wanted.num_replicas or 1):
        problems.append(f"num_replicas is {actual.num_replicas or 1}, dralloc needs at least {wanted.num_replicas}")
    if wanted.storage == StorageType.FILE and actual.storage == StorageType.MEMORY:
        problems.append("storage is memory (lost at a server restart), dralloc needs file")
    if (
        actual.discard == DiscardPolicy.NEW
        and wanted.discard != DiscardPolicy.NEW
        and any(not _unlimited(v) for v in (actual.max_msgs, actual.max_bytes, actual.max_msgs_per_subject))
    ):
        problems.append("discard is new (a full stream refuses events)")
    if actual.allow_rollup_hdrs and not wanted.allow_rollup_hdrs:
        problems.append("allow_rollup_hdrs is on (one message with Nats-Rollup could purge the stream)")
    if actual.allow_msg_ttl and not wanted.allow_msg_ttl:
        problems.append("allow_msg_ttl is on (a publisher could make its events expire)")
    if actual.sealed:
        problems.append("the stream is sealed (nothing more can be stored)")
    if actual.mirror is not None or actual.sources:
        problems.append("the stream mirrors or sources another stream")
    return problems


def _name(value: Any) -> str:
    return getattr(value, "value", None) or str(value)


_COMPARED = (
    "subjects", "retention", "max_msgs", "max_bytes", "max_age", "max_msgs_per_subject", "max_msg_size",
    "duplicate_window", "num_replicas", "storage", "discard", "allow_msg_ttl", "allow_atomic", "allow_rollup_hdrs",
)  # fmt: skip


def _normal(field: str, value: Any) -> Any:
    if field == "subjects":
        return sorted(value or [])
    if field in ("max_msgs", "max_bytes", "max_msgs_per_subject", "max_msg_size"):
        return -1 if _unlimited(value) else value
    if field in ("max_age", "duplicate_window"):
        return float(value or 0)
    if field == "num_replicas":
        return value or 1
    if field == "retention":
        return value or RetentionPolicy.LIMITS
    if field == "discard":
        return value or DiscardPolicy.OLD
    if field in ("allow_msg_ttl", "allow_atomic", "allow_rollup_hdrs"):
        return bool(value)
    return value


def differs(actual: StreamConfig, wanted: StreamConfig) -> list[str]:
    """The fields dralloc sets whose value in `actual` is not `wanted`'s (empty: nothing to update)."""
    return [f for f in _COMPARED if _normal(f, getattr(actual, f)) != _normal(f, getattr(wanted, f))]
