"""`dralloc run <service>`: connect, set up (or check) the streams, serve until SIGINT/SIGTERM."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

import nats.errors
import nats.js.errors

from dralloc import natsauth, telemetry
from dralloc.bus.client import Bus
from dralloc.bus.errors import BusError

log = logging.getLogger("dralloc.bus")


async def until_jetstream_answers(bus: Bus, name: str, stop: asyncio.Event, step: Callable[[], Awaitable[None]], timeout: float = 60.0) -> None:
    """Run `step` (the streams' setup or check), again while JetStream cannot answer yet (a cluster
    electing its leaders, a server starting), for up to `timeout` seconds; `BusError` passes at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            await step()
            return
        except (nats.errors.Error, nats.js.errors.Error, TimeoutError) as exc:
            if stop.is_set() or time.monotonic() > deadline:
                raise BusError(f"{name}: JetStream did not answer: {natsauth.redact(str(exc) or type(exc).__name__)}") from None
            log.warning("%s: JetStream not ready (%s); retrying", name, natsauth.redact(str(exc) or type(exc).__name__))
            await asyncio.sleep(1.0)


STREAM_OWNER = "allocator"
"""The service that creates and configures the streams (`Bus.ensure_streams`); the others only check
them (`Bus.check_streams`): infra/nats/auth.conf gives no other service user the right."""


async def run_service(name: str, serve: Callable[..., Coroutine[Any, Any, None]], config: object, url: str | None) -> None:
    """`dralloc run <name>`: connect, ensure (or check) the streams, serve until SIGINT/SIGTERM.

    Raises `BusError` (the process exits non-zero, and its supervisor restarts it) when the
    connection is closed for good while serving: the server closed it on a protocol error, or the
    client gave up; staying up would mean deciding nothing, forever. Serves the liveness and
    readiness probes of `dralloc.probes` when ``DRALLOC_HEALTH_PORT`` is set."""
    from dralloc import probes  # the probes read the bus; the bus does not need them otherwise

    telemetry.setup(name)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    bus = await Bus.connect(url, name=name)
    ready = asyncio.Event()
    try:
        async with probes.serve_probes(bus, ready) as port:
            if port is not None:
                log.info("%s: probes on port %d (/livez, /readyz)", name, port)
            await until_jetstream_answers(bus, name, stop, bus.ensure_streams if name == STREAM_OWNER else lambda: bus.check_streams(stop))
            where = bus.connected_url or url or ""
            log.info("%s: serving (NATS %s)", name, natsauth.redact(where))
            ready.set()
            serving = asyncio.create_task(serve(bus, config, stop))
            closed = asyncio.create_task(bus.closed.wait())
            await asyncio.wait({serving, closed}, return_when=asyncio.FIRST_COMPLETED)
            if not serving.done():
                stop.set()  # the connection is gone for good: stop, then say so
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(serving, 10)
                raise BusError(
                    f"{name}: the NATS connection was closed for good ({natsauth.redact(str(bus._nc.last_error or 'closed'))}); exiting so that a fresh process reconnects"
                )
            closed.cancel()
            await serving
    finally:
        await bus.close()
