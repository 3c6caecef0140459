"""The fault tests' core on a 3-server JetStream cluster (loopback, `dralloc.bus.LocalCluster`):
streams and KV buckets replicated 3 times, the active allocator killed and one server restarted at a time."""

from __future__ import annotations

import asyncio

from pipeline import Options, Stack, StreamReader, chaos, check, offer, settle

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream

CLAIMS = [f"c-{i}" for i in range(60)]


async def test_streams_are_replicated_and_nothing_is_lost_while_servers_restart_one_at_a_time():
    async with Stack(nodes=8, allocators=2, cluster=3) as stack:  # 64 GPUs: every 1-GPU claim fits
        bus = await Bus.connect(stack.nats.url, name="test")
        try:
            await stack.ready(bus)
            for stream in ("INVENTORY", "CLAIMS", "ALLOCATIONS", "DEADLETTER", "KV_dralloc-leader"):
                info = await jetstream(bus).stream_info(stream)
                assert info.config.num_replicas == 3 and len(info.cluster.replicas or []) == 2, stream

            stop, events = asyncio.Event(), []
            chaos_task = asyncio.create_task(chaos(stack, bus, Options(kill_every=2.0, restart_every=3.0), stop, events))
            await offer(bus, CLAIMS, 10, asyncio.Event())  # 6 s of claims
            async with asyncio.timeout(60):  # chaos runs until it has killed and restarted twice each, however fast the claims go
                while stack.nats.restarts < 2 or sum("kill -9" in e for e in events) < 2:
                    await asyncio.sleep(0.2)
            verdict = await settle(bus, set(CLAIMS), 60)  # chaos goes on while the backlog drains
            stop.set()
            await chaos_task

            assert stack.nats.restarts >= 2 and sum("kill -9" in e for e in events) >= 2, events
            assert (verdict.submitted, verdict.lost, verdict.duplicated) == (len(CLAIMS), 0, 0), verdict.duplicates
            decisions, claims = StreamReader(bus, "ALLOCATIONS"), StreamReader(bus, "CLAIMS")
            await decisions.read_new()
            await claims.read_new()
            assert check(claims.seen, decisions.seen).double_allocated_devices == 0
        finally:
            await bus.close()
