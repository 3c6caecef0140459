"""The bus's own ceiling for `dralloc bench pipeline`: the pipeline's chain of NATS work with no work between.

Each claim of the pipeline costs the bus, in order: a publish into a stream
(the submit path's ClaimSubmitted), a pull fetch and an ack by a consumer that
publishes into a second stream (the allocator's AllocationCommitted), and a
pull fetch and an ack by a consumer that puts a KV record (the status writer).
Here the same chain runs on the same nats-server with nothing between the
steps: the payloads are forwarded as they are, nothing is decoded or decided.
The two consumers are processes of their own (`python ceiling.py relay|sink`),
as the allocator and the status writer are, pulling as `Bus.consume` does
(`dralloc.bus.pull`), each acking a message once what it published is stored.

The streams and the bucket are copies of the real ones' configuration (file
storage, replicas, duplicate window) under other names (`CEIL_IN`, `CEIL_OUT`,
KV `ceil`), so the measurement touches none of the pipeline's data.
`claims_per_second` is over the whole chain, by the server's timestamps: from the
first message stored in `CEIL_IN` to the last KV put (`chain_rate`). The source
runs ahead of the consumers (it waits only for its own publishes to be stored),
so it is done long before the last put: a rate over the middle half of the puts
(what this measured before) left the source's work and its share of the
server's out and came out at more messages a second than the CPU per message
allows on two cores (14,360/s at 0.186 ms: 2.7 CPUs). Over the whole chain,
the CPU seconds counted fall inside the span the rate is over (the stages
idle on a pull request before the first publish), so `claims_per_second` x
`cpu_ms_per_claim` is at most the CPUs there are. The first publish waits
until both stages pull (`Stage.pulling`: a process's start can take seconds
on a busy machine). `cpu_ms_per_claim_by_stage` is each stage's CPU per
message from its connection to its end (a stage process's start, its
imports, ~0.3 CPU s, is not the chain's work): the floor under the
pipeline's submitter (source), allocator (relay) and status writer (sink).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import sys
import time
from pathlib import Path
from typing import Any

from dralloc.bus import FETCH_BATCH, AckPolicy, Bus, ConsumerConfig, die_with_parent
from dralloc.bus.pull import Puller
from dralloc.bus.raw import jetstream

IN, OUT, BUCKET = "CEIL_IN", "CEIL_OUT", "ceil"
FETCH = FETCH_BATCH
"""Messages per pull request at most, as `Bus.consume` asks for."""
WINDOW = 512
"""The source's publishes in flight at once (the pipeline's submitter bounds its backlog the same way)."""


async def _copy_stream(bus: Bus, source: str, name: str, subjects: list[str]) -> None:
    """A stream configured as `source` is, under another name and subjects (replaced if it exists)."""
    config = await bus.stream_config(source)
    with contextlib.suppress(Exception):
        await jetstream(bus).delete_stream(name)
    await jetstream(bus).add_stream(dataclasses.replace(config, name=name, subjects=subjects, mirror=None, sources=None))


async def prepare(bus: Bus, status_bucket: str) -> None:
    """The ceiling's streams and bucket, configured as CLAIMS, ALLOCATIONS and the status bucket are."""
    await _copy_stream(bus, "CLAIMS", IN, ["ceil.in.>"])
    await _copy_stream(bus, "ALLOCATIONS", OUT, ["ceil.out.>"])
    await _copy_stream(bus, f"KV_{status_bucket}", f"KV_{BUCKET}", [f"$KV.{BUCKET}.>"])


async def remove(bus: Bus) -> None:
    """Delete what `prepare` made."""
    for name in (IN, OUT, f"KV_{BUCKET}"):
        with contextlib.suppress(Exception):
            await jetstream(bus).delete_stream(name)


async def relay(url: str, source: str, target: str, count: int) -> None:
    """Consume `source` with a durable pull consumer; each message's payload published to
    `target`.<n> (a KV bucket: `$KV.<bucket>.<n>`), acked once stored. Ends after `count`. Pulls as
    `Bus.consume` does (`dralloc.bus.pull.Puller`, up to `FETCH` a request)."""
    bus = await Bus.connect(url, name=f"ceiling-{source}")
    began = time.process_time()  # (what came before, the process's start and imports, is not the chain's)
    try:
        config = ConsumerConfig(ack_policy=AckPolicy.EXPLICIT, ack_wait=30.0, max_deliver=5)
        sub = await jetstream(bus).pull_subscribe("", durable=durable(source), stream=source, config=config)
        puller = Puller(sub, FETCH, 1.0)
        done = 0
        while done < count:
            messages = await puller.fetch()
            stored = []
            for msg in messages:
                seq = msg.metadata.sequence.stream
                headers = {"Nats-Msg-Id": f"{source}-{seq}"} if not target.startswith("$KV.") else None
                stored.append(await bus.send_bytes(f"{target}.{seq}", msg.data, headers=headers, timeout=30.0))
            for msg, ack in zip(messages, stored):
                await ack
                await msg.ack()
            done += len(messages)
    finally:
        await bus.close()
        print(time.process_time() - began, flush=True)  # this stage's CPU seconds, read by `Stage.finish`


def durable(source: str) -> str:
    """The name of the relay's pull consumer on `source`."""
    return f"ceil-{source.lower()}"


class Stage:
    """One relay process (`python ceiling.py relay URL SOURCE TARGET COUNT`)."""

    def __init__(self, url: str, source: str, target: str, count: int) -> None:
        self.source = source
        self.args = [str(Path(__file__).resolve()), "relay", url, source, target, str(count)]
        self.proc: asyncio.subprocess.Process | None = None

    async def start(self) -> None:
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, *self.args, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.DEVNULL, preexec_fn=die_with_parent,
        )  # fmt: skip

    async def pulling(self, bus: Bus, timeout: float) -> None:
        """Return once the stage's consumer exists and waits on a pull request: it has started (on a
        busy machine a process's start can take seconds, which the chain's rate must not count)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):  # (not made yet)
                if (await jetstream(bus).consumer_info(self.source, durable(self.source))).num_waiting:
                    return
            await asyncio.sleep(0.05)

    async def finish(self, timeout: float) -> float | None:
        """Wait for the stage to end (it has relayed everything); the CPU seconds it reports, None if it did not."""
        assert self.proc is not None
        try:
            out, _ = await asyncio.wait_for(self.proc.communicate(), timeout)
            return round(float(out.decode().split()[-1]), 2)
        except (TimeoutError, ValueError, IndexError):
            return None

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(ProcessLookupError):
                await self.proc.wait()


def process_cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds a process (Linux /proc) has used so far; 0.0 once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, TypeError, IndexError):
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def chain_rate(first_in: list[float], last_out: list[float]) -> float | None:
    """Messages per second through the whole chain: `last_out`'s count over the span from the
    first of `first_in` (the source's first publish stored) to the last of `last_out` (the last
    KV put stored); None when there is no such span."""
    if not first_in or not last_out or max(last_out) <= min(first_in):
        return None
    return len(last_out) / (max(last_out) - min(first_in))


async def stored_times(bus: Bus, stream: str, count: int, timeout: float) -> list[float]:
    """The server's timestamps of the first `count` messages of `stream`, once that many are stored."""
    deadline = time.monotonic() + timeout
    while (await bus.stream_state(stream)).messages < count and time.monotonic() < deadline:
        await asyncio.sleep(0.2)
    times: list[float] = []
    await bus.scan(stream, lambda msg: times.append(msg.time.timestamp()) if msg.time is not None else None)
    return times


async def measure(bus: Bus, payload: bytes, count: int, status_bucket: str, server_pids: list[int] | None = None, timeout: float = 120.0) -> dict[str, Any]:
    """Run the chain for `count` messages of `payload` on `bus`'s server; the ceiling's rate and CPU
    (of this process as the source, of each stage, and of `server_pids`, the nats-servers).

    The source is this process, publishing as fast as the window allows (JetStream's ack awaited
    for each, as the submit path does), each with its own ``Nats-Msg-Id``."""
    await prepare(bus, status_bucket)
    url = bus.connected_url or ""
    stages = [Stage(url, IN, "ceil.out", count), Stage(url, OUT, f"$KV.{BUCKET}", count)]
    try:
        for stage in stages:
            await stage.start()
        for stage in stages:  # the stages connect and make their consumers before the first publish
            await stage.pulling(bus, timeout)
        cpu_before = time.process_time()
        servers_before = sum(process_cpu_seconds(pid) for pid in server_pids or [])
        in_flight: set[asyncio.Future[Any]] = set()
        for i in range(count):
            ack = await bus.send_bytes(f"ceil.in.{i}", payload, headers={"Nats-Msg-Id": f"ceil-{i}"}, timeout=30.0)
            future = asyncio.ensure_future(ack)
            in_flight.add(future)
            future.add_done_callback(in_flight.discard)
            if len(in_flight) >= WINDOW:
                await asyncio.wait(in_flight, return_when=asyncio.FIRST_COMPLETED)
        if in_flight:
            await asyncio.wait(in_flight)
        source_cpu = time.process_time() - cpu_before
        cpu = {"source": round(source_cpu, 2), "relay": await stages[0].finish(timeout), "sink": await stages[1].finish(timeout)}
        if server_pids:  # once the sink is done (its last put stored), before the timestamps are read
            cpu["nats-server"] = round(sum(process_cpu_seconds(pid) for pid in server_pids) - servers_before, 2)
        times = await stored_times(bus, f"KV_{BUCKET}", count, timeout)
        published = await stored_times(bus, IN, count, timeout)
    finally:
        for stage in stages:
            await stage.stop()
        await remove(bus)
    rate = chain_rate(published, times)
    return {
        "claims_per_second": None if rate is None else round(rate, 1),
        "messages": count,
        "stored": len(times),
        "payload_bytes": len(payload),
        "cpu_s": cpu,
        "cpu_ms_per_claim": round(sum(v for v in cpu.values() if v is not None) * 1000 / count, 3) if None not in cpu.values() else None,
        # each stage's floor, to hold the pipeline's processes against: the source as the submitter,
        # the relay as the allocator, the sink as the status writer (their CPU per claim in the pipeline)
        "cpu_ms_per_claim_by_stage": {stage: None if used is None else round(used * 1000 / count, 3) for stage, used in cpu.items()},
        "claims_per_cpu_second": round(count / sum(cpu.values()), 1) if None not in cpu.values() and sum(cpu.values()) > 0 else None,
    }


if __name__ == "__main__":  # python ceiling.py relay URL SOURCE TARGET COUNT (started by `measure`)
    if len(sys.argv) != 6 or sys.argv[1] != "relay":
        sys.exit("usage: ceiling.py relay URL SOURCE TARGET COUNT")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    asyncio.run(relay(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5])))
