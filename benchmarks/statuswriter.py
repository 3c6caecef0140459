"""The status writer's own CPU per record, in isolation: `python benchmarks/statuswriter.py [--records N] [--rounds R]`.

The pipeline's figures (`dralloc bench pipeline`) move with whatever else the machine runs; this
one measures one service alone, so a change to its shell can be held against the tree before it,
run after run. Per round: a fresh nats-server; N AllocationCommitted events (the pipeline's claim,
its selector, an allocation and a node selector) stored in ALLOCATIONS first; then the status
writer (`dralloc.statuswriter.service.serve`, the local store, telemetry set up as `dralloc run`
sets it up: nothing records) started in this process and timed until N records are stored. Prints
JSON: per round the wall seconds, this process's CPU per record (the writer, and the ~20 polls a
second that wait for it) and nats-server's CPU per record, in microseconds; and their medians.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # pipeline.py and ceiling.py beside this file
from ceiling import process_cpu_seconds  # noqa: E402
from pipeline import claim_manifest  # noqa: E402

from dralloc import telemetry  # noqa: E402
from dralloc.bus import Bus, LocalServer  # noqa: E402
from dralloc.schemas import events as ev  # noqa: E402
from dralloc.schemas.resource import (  # noqa: E402
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
    ResourceClaimStatus,
)
from dralloc.schemas.status import DEFAULT_BUCKET  # noqa: E402
from dralloc.statuswriter import service as statuswriter  # noqa: E402


def commit(i: int) -> ev.AllocationCommitted:
    """The i-th claim of a pipeline run (every tenth a MIG slice), committed to one device of a node."""
    claim = msgspec.convert(claim_manifest(f"sustain-{i}", mig=i % 10 == 9), ResourceClaim)
    meta = msgspec.structs.replace(claim.metadata, uid=f"{i:08d}-0000-4000-8000-000000000000", generation=1)
    node = f"h100-sxm-{i // 8:05d}"
    result = DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool=node, device=f"gpu-{i % 8}")
    selector = NodeSelector(node_selector_terms=[NodeSelectorTerm(match_fields=[NodeSelectorRequirement(key="metadata.name", operator="In", values=[node])])])
    status = ResourceClaimStatus(allocation=AllocationResult(devices=DeviceAllocationResult(results=[result]), node_selector=selector))
    return ev.AllocationCommitted(claim=msgspec.structs.replace(claim, metadata=meta, status=status), node=node)


async def one_round(records: int, timeout: float) -> dict[str, float]:
    """One measured round on a fresh server (see the module docstring)."""
    server = LocalServer(Path(tempfile.mkdtemp(prefix="dralloc-swbench-")))
    await server.start()
    try:
        assert server.proc is not None
        bus = await Bus.connect(server.url, name="statuswriter-bench")
        try:
            await bus.ensure_streams()
            acks = [await bus.send(commit(i)) for i in range(records)]
            for ack in acks:
                await ack
            stop = asyncio.Event()
            cpu, served, began = time.process_time(), process_cpu_seconds(server.proc.pid), time.perf_counter()
            writer = asyncio.create_task(statuswriter.serve(bus, statuswriter.Config(), stop))
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline and not writer.done():
                await asyncio.sleep(0.05)
                try:
                    if (await bus.stream_state(f"KV_{DEFAULT_BUCKET}")).messages >= records:
                        break
                except Exception:  # noqa: BLE001 - the bucket is not made yet
                    continue
            else:
                raise TimeoutError(f"{records} records not stored within {timeout:g}s")
            cpu, served, wall = time.process_time() - cpu, process_cpu_seconds(server.proc.pid) - served, time.perf_counter() - began
            stop.set()
            await writer
        finally:
            await bus.close()
    finally:
        await server.stop()
    return {"seconds": round(wall, 3), "writer_us_per_record": round(cpu * 1e6 / records, 1), "nats_server_us_per_record": round(served * 1e6 / records, 1)}


async def run(records: int = 10_000, rounds: int = 3, timeout: float = 120.0) -> dict[str, Any]:
    """`rounds` rounds of `records` commits; the report (see the module docstring)."""
    telemetry.setup("statuswriter")
    results = [await one_round(records, timeout) for _ in range(rounds)]
    return {
        "records": records,
        "rounds": results,
        "median_writer_us_per_record": statistics.median(r["writer_us_per_record"] for r in results),
        "median_nats_server_us_per_record": statistics.median(r["nats_server_us_per_record"] for r in results),
    }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--records", type=int, default=10_000)
    parser.add_argument("--rounds", type=int, default=3)
    options = parser.parse_args()
    print(json.dumps(asyncio.run(run(options.records, options.rounds))))
