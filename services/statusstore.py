"""The status store as its readers see it: the claim statuses in the status writer's KV bucket.

The record format is the contract in `dralloc.schemas.status`; this module reads records
back, checked, for the status writer (what it wrote last, after a restart) and for the
CLI (`dralloc get claims`, `submit --wait`, the demo). A bad record is reported and
skipped, never taken for a claim's state.
"""

from __future__ import annotations

import logging

from dralloc.bus import KeyNotFound, KeyValue, kv_items
from dralloc.schemas.status import ClaimStatus, UnreadableStatus, decode_status, kv_key

log = logging.getLogger("dralloc.statusstore")


async def read_status(kv: KeyValue, claim_key: str) -> ClaimStatus | None:
    """The claim's stored status, None if there is none; `UnreadableStatus` if the record is bad."""
    try:
        entry = await kv.get(kv_key(claim_key))
    except KeyNotFound:
        return None
    if not entry.value:
        return None
    return decode_status(kv_key(claim_key), entry.value)


async def read_all_checked(kv: KeyValue) -> tuple[list[ClaimStatus], list[str]]:
    """Every stored claim status, sorted by claim, and one line per record that could not be
    read (skipped: one bad record never hides the others). Read in one pass (`kv_items`: nats-py's
    `keys()` can list a full bucket as empty)."""
    found: list[ClaimStatus] = []
    problems: list[str] = []
    for key, value in await kv_items(kv):
        if not value:
            continue
        try:
            found.append(decode_status(key, value))
        except UnreadableStatus as exc:
            problems.append(str(exc))
    return sorted(found, key=lambda s: s.claim), problems


async def read_all(kv: KeyValue) -> list[ClaimStatus]:
    """Every readable stored claim status, sorted by claim (bad records are logged and skipped)."""
    found, problems = await read_all_checked(kv)
    for problem in problems:
        log.warning("skipped a bad claim status: %s", problem)
    return found
