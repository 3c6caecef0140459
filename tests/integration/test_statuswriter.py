"""The status writer's local store (JetStream KV) and `dralloc get claims`, against a real nats-server."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
from collections.abc import Coroutine
from pathlib import Path
from typing import Any

import msgspec

from dralloc.bus import MAX_IN_FLIGHT, Bus, LocalServer
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
from dralloc.schemas.status import ClaimStatus, kv_key
from dralloc.statuswriter import service as statuswriter
from dralloc.statuswriter.sinks import KVSink, read_all

DRALLOC = str(Path(sys.executable).parent / "dralloc")  # the console script of this environment


def committed(name: str, uid: str, device: str) -> ev.AllocationCommitted:
    result = DeviceRequestAllocationResult(request="gpu", driver="gpu.nvidia.com", pool="node-1", device=device)
    claim = ResourceClaim(
        metadata=ObjectMeta(name=name, namespace="ml", uid=uid),
        status=ResourceClaimStatus(allocation=AllocationResult(devices=DeviceAllocationResult(results=[result]))),
    )
    return ev.AllocationCommitted(claim=claim, node="node-1")


async def run_writer(bus: Bus, until_pending_zero: bool = True, sink: KVSink | None = None) -> None:
    stop = asyncio.Event()
    task = asyncio.create_task(statuswriter.serve(bus, statuswriter.Config(), stop, sink=sink))
    async with asyncio.timeout(30):
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


async def test_the_writer_remembers_what_is_in_flight_and_a_bounded_few_more(bus: Bus):
    # More claims live at once than a consumer has in flight; a third of them released; late
    # failures of claims written long before (forgotten: their checks read the bucket).
    live, released = MAX_IN_FLIGHT + 300, 600
    events: list[ev.Event] = [committed(f"c{i}", f"u{i}", "gpu-0") for i in range(live + released)]
    events += [ev.AllocationReleased(namespace="ml", name=f"c{i}", uid=f"u{i}") for i in range(released)]
    events += [ev.AllocationFailed(namespace="ml", name=f"c{i}", uid=f"u{i}", generation=1, reason="unsatisfiable", message="old") for i in (600, 601, 602)]
    for ack in [await bus.send(event) for event in events]:
        await ack
    kv = await bus.key_value("dralloc-claims")
    sink = KVSink(kv, bus, remembered=16)
    await run_writer(bus, sink=sink)

    assert len(sink.written) <= MAX_IN_FLIGHT + 2 * 16 + 1  # not one entry per claim
    statuses = await read_all(kv)
    assert len(statuses) == live and {s.state for s in statuses} == {"allocated"}  # the late failures hid no commit


def without_waiting(coro: Coroutine[Any, Any, Any]) -> Any:
    """What `coro` returns, when it completes without waiting for anything; fails the test if it waits."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("it waited (to read the bucket from a stopped server)")


async def test_a_check_behind_a_put_in_flight_reads_the_put_not_the_bucket(tmp_path: Path):
    server = LocalServer(tmp_path)
    await server.start()
    try:
        assert server.proc is not None
        async with await Bus.connect(server.url, name="test") as bus:
            kv = await bus.key_value("dralloc-claims")
            older = ClaimStatus(claim="ml/a", uid="ua", state="unsatisfiable", message="no fit")
            await kv.put(kv_key("ml/a"), msgspec.json.encode(older))
            sink = KVSink(kv, bus, remembered=0)
            os.kill(server.proc.pid, signal.SIGSTOP)  # the commit's put stays in flight: its answer cannot come
            try:
                answer = await sink.committed(committed("a", "ua", "gpu-0"))
                # Checks behind it read what the sink is writing, never the bucket (it still holds the older record).
                assert without_waiting(sink._current("ml/a")) == ("allocated", "ua")
                late = ev.AllocationFailed(namespace="ml", name="a", uid="ua", generation=1, reason="unsatisfiable", message="old")
                assert without_waiting(sink.failed(late)) is None  # a late failure does not replace the commit
            finally:
                os.kill(server.proc.pid, signal.SIGCONT)
            assert answer is not None
            await answer
            (status,) = await read_all(kv)
            assert (status.state, status.uid) == ("allocated", "ua")
            # Stored, it is forgotten when the sink next cuts its memory (remembered=0: all that is stored);
            # from then on a check reads the bucket (made to differ again, to tell).
            for name in ("b", "c"):
                assert (other := await sink.committed(committed(name, f"u{name}", "gpu-1"))) is not None
                await other
            assert "ml/a" not in sink.written
            await kv.put(kv_key("ml/a"), msgspec.json.encode(older))
            assert await sink._current("ml/a") == ("unsatisfiable", "ua")
    finally:
        await server.stop()
