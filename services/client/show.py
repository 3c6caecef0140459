"""The status writer's local store as the CLI reads it: every claim's status, and the claims table
of the demo and `submit --wait` (`dralloc get claims` renders with dralloc.client.get)."""

from __future__ import annotations

from collections import Counter

from dralloc.bus import Bus
from dralloc.schemas.status import DEFAULT_BUCKET, ClaimStatus
from dralloc.statusstore import read_all_checked


async def fetch_claims(url: str | None, bucket: str | None = None) -> tuple[list[ClaimStatus], list[str]]:
    """The stored statuses, and a line for each record that could not be read (skipped)."""
    async with await Bus.connect(url, name="get") as bus:
        return await read_all_checked(await bus.key_value(bucket or DEFAULT_BUCKET))


def claims_table(statuses: list[ClaimStatus], title: str | None = None):
    """A rich Table: claim, status, node, devices (shared with the demo)."""
    from rich.table import Table

    styles = {"allocated": "green", "unsatisfiable": "yellow", "error": "red", "pending": "dim"}
    counts: Counter[str] = Counter(s.state for s in statuses)
    caption = ", ".join(f"{counts[state]} {state}" for state in styles if counts[state]) or "no claims"
    table = Table("CLAIM", "STATUS", "NODE", "DEVICES", "MESSAGE", title=title, caption=caption, header_style="bold", box=None)
    for s in statuses:
        # A node-local pool is named after its node: show the device alone there.
        results = s.allocation.devices.results if s.allocation else []
        devices = ", ".join(r.device if r.pool == s.node else f"{r.pool}/{r.device}" for r in results)
        table.add_row(s.claim, f"[{styles.get(s.state, '')}]{s.state}[/]", s.node or "", devices, s.message)
    return table
