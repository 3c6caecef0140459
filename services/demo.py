"""`dralloc demo`: the embedded default, the whole system in one process.

A private nats-server (temp dir, free port), then the four services as tasks
on one event loop, each with its own connection as if it were its own
process: discovery simulating a fleet (4 H100 nodes and 2 L40S nodes by
default), the allocator, the status writer (local KV store) and the
ingestor applying ``examples/``. The table of claims comes from the status
writer's store, so what it shows has gone through the whole pipeline.

On a terminal the table updates live and the demo runs until Ctrl-C (the
ingestor follows the files: edit or add a manifest and watch it allocate).
Otherwise it waits until every example claim has a decision that no longer
changes, prints the table once and exits. Either way everything it started
is stopped and its temp dir removed.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dralloc import telemetry
from dralloc.allocator import service as allocator
from dralloc.bus import Bus, embedded_nats
from dralloc.client.show import claims_table
from dralloc.discovery import service as discovery
from dralloc.ingestor import service as ingestor
from dralloc.manifest_events import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.status import DEFAULT_BUCKET, ClaimStatus
from dralloc.statusstore import read_all
from dralloc.statuswriter import service as statuswriter

log = logging.getLogger("dralloc.demo")

DEFAULT_FLEET: list[dict[str, Any]] = [
    {"profile": "h100-sxm", "count": 4, "prefix": "h100"},
    {"profile": "l40s-pcie", "count": 2, "prefix": "l40s"},
]
SERVICES = ("discovery", "allocator", "statuswriter", "ingestor")
EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
SETTLE_S = 1.0
"""Without a terminal: a decision must hold this long before the table is final (a claim that
arrived before its class or slices is retried and may turn from failed to allocated)."""


class DemoError(Exception):
    """The demo cannot start or finish; the message says why."""


@dataclass
class System:
    """The four services running in-process against one NATS server."""

    url: str
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    tasks: list[asyncio.Task] = field(default_factory=list)
    buses: list[Bus] = field(default_factory=list)

    async def start(self, name: str, serve: Callable[..., Awaitable[None]], config: Any) -> None:
        bus = await Bus.connect(self.url, name=name)
        self.buses.append(bus)
        await bus.ensure_streams()
        self.tasks.append(asyncio.create_task(_guarded(name, serve(bus, config, self.stop)), name=name))

    async def shutdown(self) -> None:
        self.stop.set()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        for bus in self.buses:
            await bus.close()


async def _guarded(name: str, work: Awaitable[None]) -> None:
    try:
        await work
    except (Exception, SystemExit) as exc:  # one service failing must not take the others down silently
        log.error("%s stopped: %s", name, exc)


@contextlib.asynccontextmanager
async def running(
    url: str,
    *,
    paths: list[str],
    fleet: Any = None,
    watch: bool = False,
    services: tuple[str, ...] = SERVICES,
) -> AsyncIterator[System]:
    """The services (default: all four) on this loop; stopped and closed on exit."""
    configs: dict[str, tuple[Callable[..., Awaitable[None]], Callable[[], object]]] = {
        "discovery": (discovery.serve, lambda: _discovery_config(fleet)),
        "allocator": (allocator.serve, allocator.Config),
        "statuswriter": (statuswriter.serve, statuswriter.Config),
        "ingestor": (ingestor.serve, lambda: ingestor.Config(paths=paths, watch=watch, interval=1.0)),
    }
    system = System(url)
    try:
        for name in services:
            serve, config = configs[name]
            await system.start(name, serve, config())
        yield system
    finally:
        await system.shutdown()


def _discovery_config(fleet: Any) -> discovery.Config:
    config = discovery.Config(source="fleet", fleet=fleet or DEFAULT_FLEET, node="demo", interval=3600.0, mig=True)
    try:
        config.check()
    except ValueError as exc:
        raise DemoError(f"fleet: {exc}") from None
    return config


def expected_claims(paths: list[str]) -> list[str]:
    """The claims the ingestor will publish from `paths` (Pods' templates expanded), in input order."""
    events = events_from_manifests(load_paths(paths), lambda _: None)  # the ingestor reports the problems
    return list(dict.fromkeys(e.claim.key for e in events if isinstance(e, ev.ClaimSubmitted)))


def _rows(expected: list[str], stored: list[ClaimStatus]) -> list[ClaimStatus]:
    """Stored statuses, plus a `pending` row for each expected claim without a decision yet."""
    known = {s.claim for s in stored}
    pending = [ClaimStatus(claim=key, uid="", state="pending") for key in expected if key not in known]
    return stored + pending


async def run_demo(paths: list[str] | None, fleet: str | None, *, timeout: float = 60.0) -> int:
    """Run the demo; returns the exit code (0: every example claim got a decision)."""
    from rich.console import Console

    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s", stream=sys.stderr)
    telemetry.setup("demo")
    if paths is None:
        if not EXAMPLES.is_dir():
            raise DemoError(f"no examples directory at {EXAMPLES}; pass manifests with -f")
        paths = [str(EXAMPLES)]
    expected = expected_claims(paths)
    interactive = sys.stdout.isatty()
    # SIGINT/SIGTERM at any point unwind through the context managers below, so the server
    # and its temp dir go away even when the demo is interrupted while starting.
    loop, main = asyncio.get_running_loop(), asyncio.current_task()
    assert main is not None
    interrupted = asyncio.Event()

    def interrupt() -> None:
        interrupted.set()
        main.cancel()

    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, interrupt)
    console = Console() if interactive else Console(width=200, no_color=True)

    async with embedded_nats() as url, running(url, paths=paths, fleet=fleet, watch=interactive), await Bus.connect(url, name="demo") as bus:
        kv = await bus.key_value(DEFAULT_BUCKET)
        if interactive:
            await _live(console, kv, expected, url)
            return 0
        rows, complete = await _settled(kv, expected, timeout)
    if interrupted.is_set():
        # A cancellation can be swallowed by a library awaiting at that moment (asyncio.wait_for
        # racing its inner future, a client's connect or close): the signal still means "interrupted".
        raise asyncio.CancelledError
    console.print(claims_table(rows, title=f"dralloc demo: {len(expected)} claims from {', '.join(paths)}"))
    if not complete:
        print(f"dralloc: gave up after {timeout:g}s waiting for decisions on every claim", file=sys.stderr)
    return 0 if complete else 1


async def _settled(kv: Any, expected: list[str], timeout: float) -> tuple[list[ClaimStatus], bool]:
    """Poll the store until every expected claim has a decision unchanged for SETTLE_S, or time runs out."""
    deadline = time.monotonic() + timeout
    last: list[tuple] | None = None
    since = time.monotonic()
    rows: list[ClaimStatus] = []
    while time.monotonic() < deadline:
        stored = await read_all(kv)
        rows = _rows(expected, stored)
        snapshot = [(s.claim, s.state, s.uid, s.node) for s in rows]
        if snapshot != last:
            last, since = snapshot, time.monotonic()
        elif all(s.state != "pending" for s in rows) and time.monotonic() - since >= SETTLE_S:
            return rows, True
        await asyncio.sleep(0.1)
    return rows, False


async def _live(console: Any, kv: Any, expected: list[str], url: str) -> None:
    from rich.live import Live

    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)  # Ctrl-C while live: a clean stop, exit 0
    title = f"dralloc demo (NATS {url}; Ctrl-C to stop)"
    with Live(claims_table(_rows(expected, []), title=title), console=console, refresh_per_second=4) as live:
        while not stop.is_set():
            live.update(claims_table(_rows(expected, await read_all(kv)), title=title))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)
