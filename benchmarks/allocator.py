"""The allocator service's own CPU per claim, in isolation: `python benchmarks/allocator.py [--claims N] [--rounds R]`.

The pipeline's figures (`dralloc bench pipeline`) move with whatever else the machine runs, and
its allocator shares the CPUs with four other processes; this one measures the allocator alone,
so a change to its shell can be held against the tree before it, run after run. Per round: a
fresh nats-server; the project's DeviceClasses and a fleet holding every claim with 10% to spare
(the pipeline's: h100-sxm nodes for whole GPUs, h200-sxm-mig nodes for MIG slices) stored in
INVENTORY; the allocator started as `dralloc run allocator` (a process, as deployed; the
pipeline's lease and ack wait), a probe claim decided and the allocator idle; then N of the
pipeline's claims (every tenth a MIG slice; each with its CEL selector) published, pipelined, from
this process, and the allocator timed until N decisions are stored. Prints JSON: per round the
wall seconds, the allocator's CPU per claim (all of it, its main thread: the event loop, the
shell; and the rest: the engine's thread) and nats-server's, in microseconds; and their medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pipeline.py and ceiling.py beside this file
from ceiling import process_cpu_seconds  # noqa: E402
from pipeline import (  # noqa: E402
    CLASSES,
    MEASURED_ACK_WAIT,
    MEASURED_LEASE_TTL,
    NAMESPACE,
    claim_event,
    claim_manifest,
    fleet_for,
    is_mig,
    main_thread_seconds,
    until_idle,
)

from dralloc.bus import Bus, LocalServer  # noqa: E402
from dralloc.discovery.fleet import build_fleet  # noqa: E402
from dralloc.ingestor.sources import events_from_manifests  # noqa: E402
from dralloc.manifests import load_paths  # noqa: E402
from dralloc.schemas import events as ev  # noqa: E402
from dralloc.schemas.resource import ResourceClaim  # noqa: E402

WINDOW = 256
"""Claims published before their stores are awaited (as `dralloc submit` does)."""


def claims(count: int, mig_every: int = 10) -> list[ev.ClaimSubmitted]:
    """The pipeline's claims (`pipeline.claim_manifest`), each with a uid."""
    out = []
    for i in range(count):
        claim = msgspec.convert(claim_manifest(f"c{i}", is_mig(i, mig_every)), ResourceClaim)
        meta = msgspec.structs.replace(claim.metadata, uid=str(uuid.uuid4()), generation=1)
        out.append(ev.ClaimSubmitted(claim=msgspec.structs.replace(claim, metadata=meta)))
    return out


async def publish_all(bus: Bus, events: list[Any]) -> None:
    """Publish `events` in order, `WINDOW` at a time on their way."""
    for start in range(0, len(events), WINDOW):
        acks = [await bus.send(event) for event in events[start : start + WINDOW]]
        for ack in acks:
            await ack


async def decisions_stored(bus: Bus, count: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while (await bus.stream_state("ALLOCATIONS")).messages < count:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{count} decisions not stored within {timeout:g}s")
        await asyncio.sleep(0.05)


async def one_round(count: int, timeout: float) -> dict[str, float]:
    """One measured round on a fresh server (see the module docstring)."""
    root = Path(tempfile.mkdtemp(prefix="dralloc-allocbench-"))
    server = LocalServer(root)
    await server.start()
    allocator = None
    try:
        assert server.proc is not None
        bus = await Bus.connect(server.url, name="allocator-bench")
        try:
            await bus.ensure_streams()
            mig = sum(1 for i in range(count) if is_mig(i, 10))
            nodes, mig_nodes = fleet_for(count - mig + 1, mig)
            fleet = [{"profile": "h100-sxm", "count": nodes, "prefix": "node"}, {"profile": "h200-sxm-mig", "count": mig_nodes, "prefix": "mig"}]
            inventory: list[Any] = list(events_from_manifests(load_paths([str(CLASSES)]), print))
            inventory += [ev.ResourceSlicePublished(slice=s) for _, slices in build_fleet(fleet) for s in slices]
            await publish_all(bus, inventory)
            todo = claims(count)
            env = {**os.environ, "DRALLOC_ALLOCATOR_LEASE_TTL": str(MEASURED_LEASE_TTL), "DRALLOC_ALLOCATOR_ACK_WAIT": str(MEASURED_ACK_WAIT)}
            log = open(root / "allocator.log", "wb")  # noqa: SIM115 (the child owns it)
            try:
                allocator = await asyncio.create_subprocess_exec(
                    sys.executable, "-m", "dralloc.cli", "run", "allocator", "--nats-url", server.url,
                    env=env, stdin=asyncio.subprocess.DEVNULL, stdout=log, stderr=log,
                )  # fmt: skip
            finally:
                log.close()
            await bus.publish(claim_event("probe"))
            await decisions_stored(bus, 1, timeout)
            await until_idle([allocator.pid], timeout)
            pids = (allocator.pid, server.proc.pid)
            cpu, main, served, began = process_cpu_seconds(pids[0]), main_thread_seconds(pids[0]), process_cpu_seconds(pids[1]), time.perf_counter()
            await publish_all(bus, todo)
            await decisions_stored(bus, count + 1, timeout)
            wall = time.perf_counter() - began
            cpu, main, served = process_cpu_seconds(pids[0]) - cpu, main_thread_seconds(pids[0]) - main, process_cpu_seconds(pids[1]) - served
            per_claim = await bus.subject_counts("ALLOCATIONS", f"dra.allocations.{NAMESPACE}.>")
            odd = count + 1 - sum(1 for n in per_claim.values() if n == 1)  # none, or more than one, decision
        finally:
            await bus.close()
    finally:
        if allocator is not None and allocator.returncode is None:
            allocator.terminate()
            await allocator.wait()
        await server.stop()
    return {
        "seconds": round(wall, 3),
        "claims_per_second": round(count / wall, 1),
        "allocator_us_per_claim": round(cpu * 1e6 / count, 1),
        "main_thread_us_per_claim": round(main * 1e6 / count, 1),
        "other_threads_us_per_claim": round((cpu - main) * 1e6 / count, 1),
        "nats_server_us_per_claim": round(served * 1e6 / count, 1),
        "claims_without_one_decision": odd,
    }


async def run(count: int = 10_000, rounds: int = 3, timeout: float = 300.0) -> dict[str, Any]:
    """`rounds` rounds of `count` claims; the report (see the module docstring)."""
    results = [await one_round(count, timeout) for _ in range(rounds)]
    keys = ("allocator_us_per_claim", "main_thread_us_per_claim", "other_threads_us_per_claim", "nats_server_us_per_claim")
    return {"claims": count, "rounds": results, **{f"median_{key}": statistics.median(r[key] for r in results) for key in keys}}


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--claims", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(json.dumps(asyncio.run(run(options.claims, options.rounds))))
