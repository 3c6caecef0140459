"""`dralloc top`: a live view of the fleet, refreshed from the bus without loading it.

The state is one snapshot (last message per subject) and then only the new
messages, pushed by ordered consumers (`busview`); nothing is polled. The
screen is redrawn at most `REFRESH_S` apart. `render` is pure (state, time,
width) so that it is tested at 80 and 200 columns.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time

from rich.console import Console, Group
from rich.text import Text

from dralloc.client.fleetview import FleetState, class_usage, domain_usage, node_usage, pending, percent
from dralloc.client.get import table

REFRESH_S = 1.0
ROWS = 5
"""Rows per section (most fragmented nodes and domains, pending claims)."""


def render(state: FleetState, now: float, width: int) -> Group:
    """The screen: totals and decisions/s, classes, the most fragmented nodes and domains, pending claims."""
    nodes = node_usage(state)
    gpus = sum(u.total for u in nodes)
    used = sum(u.used for u in nodes)
    parted = sum(u.partitioned for u in nodes)
    free = sum(u.free for u in nodes)
    decided = [s for s, _ in state.decisions.values()]
    allocated = sum(s.state == "allocated" for s in decided)
    waiting = pending(state)
    busy = (used + parted) / gpus if gpus else 0.0
    head = Text(
        f"dralloc top  {len(nodes)} nodes  {gpus} GPUs: {used} used, {parted} partitioned, {free} free ({percent(busy)} busy)\n"
        f"claims: {allocated} allocated, {len(waiting)} not  decisions/s: {state.rate(now):.1f}",
        no_wrap=True,
        overflow="ellipsis",
    )
    classes = table("CLASS", "DEVICES", "USED", "FREE", "UTIL", title="by class")
    for name, matched, in_use, left in class_usage(state):
        classes.add_row(name, str(matched), str(in_use), str(left), percent(in_use / matched) if matched else "-")
    frag = table("NODE", "GPUS", "FREE", "FRAG", title="most fragmented nodes")
    for u in sorted(nodes, key=lambda u: (-u.fragmentation, -u.free, u.name))[:ROWS]:
        if u.fragmentation > 0:
            frag.add_row(u.name, str(u.total), str(u.free), percent(u.fragmentation))
    domains = table("NVLINK DOMAIN", "GPUS", "FREE", "FRAG", title="most fragmented NVLink domains")
    for d in sorted(domain_usage(state), key=lambda d: (-d.fragmentation, -d.free, d.name))[:ROWS]:
        if d.fragmentation > 0:
            domains.add_row(d.name, str(d.total), str(d.free), percent(d.fragmentation))
    waits = table("CLAIM", "STATUS", "REASON", title=f"pending claims ({len(waiting)})")
    shown = waiting[:ROWS]
    claim_w = min(max((len(s.claim) for s in shown), default=5), max(20, width // 3))
    status_w = max((len(s.state) for s in shown), default=6)
    reason_w = max(10, width - claim_w - status_w - 4)  # two columns of padding between three
    for s in shown:
        reason = s.message.splitlines()[0] if s.message else ""
        waits.add_row(_cut(s.claim, claim_w), s.state, _cut(reason, reason_w))
    for t in (classes, frag, domains):
        t.columns[0].overflow = "ellipsis"
        t.columns[0].no_wrap = True
    return Group(head, Text(""), classes, Text(""), frag, Text(""), domains, Text(""), waits)


def _cut(text: str, width: int) -> str:
    return text if len(text) <= width else text[: width - 1] + "…"


async def run_top(url: str | None, console: Console, *, once: bool = False, stop: asyncio.Event | None = None) -> None:
    """Show the view live until Ctrl-C (or `stop`); `once`: print it once and return."""
    from rich.live import Live

    from dralloc.bus import Bus
    from dralloc.client.busview import following, snapshot

    async with await Bus.connect(url, name="top") as bus:
        state, last = await snapshot(bus)
        if once:
            console.print(render(state, time.time(), console.width))
            return
        stop = stop or asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, stop.set)  # Ctrl-C: a clean stop
        async with following(bus, state, last):
            with Live(render(state, time.time(), console.width), console=console, auto_refresh=False, screen=False) as live:
                while not stop.is_set():
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(stop.wait(), REFRESH_S)
                    live.update(render(state, time.time(), console.width), refresh=True)
