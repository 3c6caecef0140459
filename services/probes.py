"""Liveness and readiness of a `dralloc run <service>` process, over HTTP for Kubernetes' probes.

``DRALLOC_HEALTH_PORT`` (unset: no endpoint) serves

- ``GET /livez``: 200 while the process is alive *and working*: its event loop
  answers, its NATS connection is not closed for good, and every consumer it
  runs went round its loop within ``DRALLOC_HEALTH_STALL`` seconds (default
  60); else 503 with the reason. A service that stays up but decides nothing
  (a consumer stuck in a handler, a connection the server closed) fails it,
  and Kubernetes restarts it.
- ``GET /readyz``: 200 once the service has connected, checked its streams and
  started serving, while it is connected (not between reconnects); else 503.

The verdict is `verdict`, a pure function of what the bus reports; the server
is a few lines of asyncio, so a blocked event loop does not answer at all
(which a probe's timeout counts as a failure, as it should).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import AsyncIterator, Mapping
from typing import Protocol

log = logging.getLogger("dralloc.probes")

STALL_S = 60.0
"""A consumer whose loop has not gone round for this long is stuck (its fetch waits at most
`dralloc.bus.FETCH_WAIT_S`; a handler is bounded far below this)."""


class Observed(Protocol):
    """What the probes read of a `dralloc.bus.Bus` (a protocol, not the class: the bus imports this
    module to serve them, and importing the bus back would close a cycle)."""

    @property
    def is_closed(self) -> bool: ...
    @property
    def is_connected(self) -> bool: ...
    @property
    def pulses(self) -> Mapping[str, float]: ...


def verdict(*, closed: bool, connected: bool, pulses: Mapping[str, float], now: float, stall: float) -> tuple[bool, str]:
    """(alive, reason) from the bus's state: not alive when the connection is closed for good or a
    consumer's last pulse (monotonic seconds) is older than `stall`."""
    if closed:
        return False, "the NATS connection is closed for good"
    stuck = sorted(name for name, beat in pulses.items() if now - beat > stall)
    if stuck:
        return False, f"consumer {', '.join(stuck)} has not moved for over {stall:g}s"
    return True, "ok" if connected else "ok (reconnecting to NATS)"


def _stall_from_env(env: Mapping[str, str]) -> float:
    raw = env.get("DRALLOC_HEALTH_STALL", "")
    try:
        stall = float(raw) if raw else STALL_S
    except ValueError:
        raise ValueError(f"DRALLOC_HEALTH_STALL={raw!r}: not a number of seconds") from None
    if not stall > 0:
        raise ValueError(f"DRALLOC_HEALTH_STALL={raw!r}: must be positive")
    return stall


@contextlib.asynccontextmanager
async def serve_probes(bus: Observed, ready: asyncio.Event, env: Mapping[str, str] = os.environ) -> AsyncIterator[int | None]:
    """Serve /livez and /readyz for `bus` (a `dralloc.bus.Bus`) on ``DRALLOC_HEALTH_PORT`` while the
    block runs; yields the port (None: not configured). `ready` is set once the service serves."""
    raw = env.get("DRALLOC_HEALTH_PORT", "")
    if not raw:
        yield None
        return
    try:
        port = int(raw)
    except ValueError:
        raise ValueError(f"DRALLOC_HEALTH_PORT={raw!r}: not a port number") from None
    stall = _stall_from_env(env)

    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            line = await asyncio.wait_for(reader.readline(), 5)
            path = line.split(b" ")[1].decode("ascii", "replace") if line.count(b" ") >= 2 else ""
            alive, reason = verdict(
                closed=bus.is_closed,
                connected=bus.is_connected,
                pulses=dict(bus.pulses),
                now=time.monotonic(),
                stall=stall,
            )
            if path == "/livez":
                ok = alive
            elif path == "/readyz":
                ok = alive and ready.is_set() and bus.is_connected
                reason = reason if not ok and not alive else ("ready" if ok else "not serving yet, or not connected")
            else:
                ok, reason = False, "unknown path (use /livez or /readyz)"
            status = b"200 OK" if ok else (b"404 Not Found" if path not in ("/livez", "/readyz") else b"503 Service Unavailable")
            body = reason.encode() + b"\n"
            writer.write(
                b"HTTP/1.1 " + status + b"\r\nContent-Type: text/plain\r\nContent-Length: " + str(len(body)).encode() + b"\r\nConnection: close\r\n\r\n" + body
            )
            await writer.drain()
        except (OSError, TimeoutError, asyncio.IncompleteReadError):
            pass  # a probe that hung up or sent nothing: nothing to answer
        finally:
            writer.close()

    server = await asyncio.start_server(answer, host=env.get("DRALLOC_HEALTH_HOST", "0.0.0.0"), port=port)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await server.wait_closed()
