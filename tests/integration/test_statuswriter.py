"""The status writer's local store (JetStream KV) and `dralloc get claims`, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev
from dralloc.schemas.resource import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceRequestAllocationResult,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimStatus,
)
from dralloc.statuswriter import service as statuswriter
from dralloc.statuswriter.sinks import read_all

DRALLOC = str(Path(sys.executable).parent / "dralloc")  # the console script of this environment


def committed(name: str, uid: str, device: str) -> ev.AllocationCommitted:
    result = DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="node-1", device=device)
    claim = ResourceClaim(
        metadata=ObjectMeta(name=name, namespace="ml", uid=uid),
        status=ResourceClaimStatus(allocation=AllocationResult(devices=DeviceAllocationResult(results=[result]))),
    )
    return ev.AllocationCommitted(claim=claim, node="node-1")


async def run_writer(bus: Bus, until_pending_zero: bool = True) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(statuswriter.serve(bus, statuswriter.Config(), stop))
    async with asyncio.timeout(10):
        while True:
            await asyncio.sleep(0.05)
            try:
                info = await jetstream(bus).consumer_info("ALLOCATIONS", "statuswriter-local")
            except Exception:
                continue
            if info.num_pending == 0 and info.num_ack_pending == 0:
                break
    stop.set()
    await task


async def test_store_keeps_the_latest_decision_per_claim(bus: Bus, nats_url: str):
    await bus.publish(ev.AllocationFailed(namespace="ml", name="a", uid="ua", generation=1, reason="unsatisfiable", message="no fit"))
    await bus.publish(committed("a", "ua", "gpu-0"))  # retried after inventory grew
    await bus.publish(committed("b", "ub", "gpu-1"))
    await bus.publish(ev.AllocationFailed(namespace="ml", name="c", uid="uc", generation=1, reason="error", message="bad CEL"))
    await bus.publish(committed("d", "ud", "gpu-2"))
    await bus.publish(ev.AllocationReleased(namespace="ml", name="d", uid="ud"))
    await run_writer(bus)

    statuses = await read_all(await bus.key_value("dralloc-claims"))
    assert [(s.claim, s.state, s.node, s.devices, s.message) for s in statuses] == [
        ("ml/a", "allocated", "node-1", ["gpu.nvidia.com/node-1/gpu-0"], ""),
        ("ml/b", "allocated", "node-1", ["gpu.nvidia.com/node-1/gpu-1"], ""),
        ("ml/c", "error", None, [], "bad CEL"),
    ]

    # The CLI shows the same store, as stable JSON for machines.
    env = {**os.environ, "NATS_URL": nats_url}
    out = await asyncio.to_thread(subprocess.run, [DRALLOC, "get", "claims", "-o", "json"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert [c["claim"] for c in doc["claims"]] == ["ml/a", "ml/b", "ml/c"]
    assert doc["claims"][0]["allocation"]["devices"]["results"][0]["device"] == "gpu-0"
    table = await asyncio.to_thread(subprocess.run, [DRALLOC, "get", "claims"], env=env, capture_output=True, text=True, timeout=60)
    rows = [line.split()[:4] for line in table.stdout.splitlines()]  # an AGE column follows
    assert ["ml/b", "allocated", "node-1", "gpu-1"] in rows
    assert ["ml/c", "error", "bad", "CEL"] in rows


async def test_a_redelivered_old_event_does_not_undo_a_newer_state(bus: Bus):
    await bus.publish(committed("a", "ua", "gpu-0"))
    await run_writer(bus)
    # A stale failure of the same claim object (an older attempt) arrives after the commit.
    await bus.publish(ev.AllocationFailed(namespace="ml", name="a", uid="ua", generation=1, reason="unsatisfiable", message="old"))
    # A release of a previous object with the same name must not delete the current one's status.
    await bus.publish(ev.AllocationReleased(namespace="ml", name="a", uid="older-uid"))
    await run_writer(bus)
    (status,) = await read_all(await bus.key_value("dralloc-claims"))
    assert (status.state, status.uid) == ("allocated", "ua")


def test_get_claims_without_a_server_says_so_in_one_line():
    env = {**os.environ, "NATS_URL": "nats://127.0.0.1:9"}
    out = subprocess.run([DRALLOC, "get", "claims"], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 1
    assert out.stderr.startswith("dralloc: cannot connect to NATS at nats://127.0.0.1:9")
    assert "Traceback" not in out.stderr and len(out.stderr.strip().splitlines()) == 1
