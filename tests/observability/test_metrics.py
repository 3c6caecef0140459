"""The allocator's decision metrics and every durable consumer's lag, read with an in-memory reader
while the services run on a real nats-server."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from dralloc import demo
from dralloc.bus import AckPolicy, Bus, ConsumerConfig, embedded_nats, report_lag
from dralloc.bus.raw import jetstream
from dralloc.metrics import consumer_lag

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from pipeline import CLASSES, claim_event  # noqa: E402

ONE_NODE = [{"profile": "h100-sxm", "count": 1, "prefix": "h100"}]  # 8 GPUs


async def test_decisions_latency_devices_and_lag_are_reported(until, tmp_path):
    (tmp_path / "classes.yaml").write_text(CLASSES.read_text())
    before = await until(lambda found: True)  # counters add up over the session: this test counts from here

    def added(found, metric: str, outcome: str):
        now, then = found.get(metric, {}).get((outcome,)), before.get(metric, {}).get((outcome,))
        if metric == "dralloc.allocation.duration":
            return (now.count - (then.count if then else 0), now.sum - (then.sum if then else 0)) if now else (0, 0.0)
        return (now or 0) - (then or 0)

    async with embedded_nats() as url, await Bus.connect(url, name="test") as bus:
        await bus.ensure_streams()
        async with demo.running(url, paths=[str(tmp_path)], fleet=ONE_NODE, services=("discovery", "ingestor", "allocator", "statuswriter")):
            await bus.publish(claim_event("four", gpus=4))
            await bus.publish(claim_event("too-many", gpus=8))  # 4 left: unsatisfiable

            def settled(found):
                lag = found["dralloc.consumer.lag"]  # keys: (consumer, stream)
                return (
                    added(found, "dralloc.claims", "committed") == 1
                    and added(found, "dralloc.claims", "unsatisfiable") >= 1
                    and lag.get(("allocator", "CLAIMS")) == 0
                    and lag.get(("statuswriter-local", "ALLOCATIONS")) == 0
                )

            found = await until(settled)

    assert added(found, "dralloc.claims", "committed") == 1
    count, seconds = added(found, "dralloc.allocation.duration", "committed")
    assert count == 1 and 0 < seconds < 5
    assert found["dralloc.devices.allocated"] == {("gpu.nvidia.com", "h100-0"): 4}
    # Both durable consumers, each reported by the service that reads it, and all caught up.
    lag = found["dralloc.consumer.lag"]
    assert lag[("allocator", "CLAIMS")] == 0 and lag[("statuswriter-local", "ALLOCATIONS")] == 0
    # Stopped services no longer speak for their consumers.
    assert not {("CLAIMS", "allocator"), ("ALLOCATIONS", "statuswriter-local")} & set(consumer_lag().backlog)


async def test_lag_counts_what_a_consumer_has_not_acked(bus: Bus):
    # A durable consumer that reads nothing yet.
    await jetstream(bus).add_consumer("CLAIMS", ConsumerConfig(durable_name="slow", ack_policy=AckPolicy.EXPLICIT))
    for name in ("a", "b", "c"):
        await bus.publish(claim_event(name))
    stop = asyncio.Event()
    reporting = asyncio.create_task(report_lag(bus, "CLAIMS", "slow", stop, every=0.05))
    async with asyncio.timeout(5):
        while consumer_lag().backlog.get(("CLAIMS", "slow")) != 3:
            await asyncio.sleep(0.02)
    # Delivered and acked: the backlog drains.
    sub = await jetstream(bus).pull_subscribe("", durable="slow", stream="CLAIMS")
    for msg in await sub.fetch(2, timeout=2):
        await msg.ack()
    async with asyncio.timeout(5):
        while consumer_lag().backlog.get(("CLAIMS", "slow")) != 1:
            await asyncio.sleep(0.02)
    stop.set()
    await reporting
    assert ("CLAIMS", "slow") not in consumer_lag().backlog
