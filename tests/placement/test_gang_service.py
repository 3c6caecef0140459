"""Gangs through the allocator service (real nats-server): members wait for each other, then
all are committed inside one NVLink clique, or none is."""

from __future__ import annotations

import asyncio
from pathlib import Path

from dralloc import demo
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_text
from dralloc.schemas import events as ev

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TWO_TRAYS = [{"profile": "gb200-nvl72", "count": 2}]  # one NVL72 clique, 2 trays of 4 GPUs


def gang(name: str, size: int, gpus: int) -> list[ev.ClaimSubmitted]:
    docs = [
        f"""apiVersion: resource.k8s.io/v1
kind: ResourceClaim
metadata:
  name: {name}-{i}
  namespace: ml
  annotations: {{dralloc.dev/gang: {name}, dralloc.dev/gang-size: "{size}"}}
spec:
  devices:
    requests:
    - name: gpus
      exactly: {{deviceClassName: gpu.nvidia.com, count: {gpus}}}
"""
        for i in range(size)
    ]
    return [e for e in events_from_manifests(load_text("---\n".join(docs), "gang.yaml"), print) if isinstance(e, ev.ClaimSubmitted)]


async def decisions(bus: Bus) -> list[ev.Event]:
    info = await jetstream(bus).stream_info("ALLOCATIONS")
    return [ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data) for seq in range(1, info.state.last_seq + 1)]


async def wait_until(bus: Bus, done, timeout: float = 15.0) -> list[ev.Event]:
    async with asyncio.timeout(timeout):
        while True:
            found = await decisions(bus)
            if done(found):
                return found
            await asyncio.sleep(0.05)


async def test_gang_waits_for_all_members_then_commits_all_or_none(bus: Bus, nats_url: str, tmp_path: Path):
    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    first, second = gang("train", 2, 4)
    big = gang("big", 2, 4)
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=TWO_TRAYS):
        async with asyncio.timeout(10):
            while ev.ResourceSlicePublished not in {type(e) for e in (await bus.replay("INVENTORY"))[0]}:
                await asyncio.sleep(0.05)
        await bus.publish(first)
        await asyncio.sleep(1.0)
        assert await decisions(bus) == []  # one member alone: no decision, no devices
        await bus.publish(second)
        found = await wait_until(bus, lambda d: sum(isinstance(e, ev.AllocationCommitted) for e in d) == 2)
        nodes = {e.node for e in found if isinstance(e, ev.AllocationCommitted)}
        assert nodes == {"gb200-nvl72-0", "gb200-nvl72-1"}  # a tray each, one clique
        # a second gang finds no room: both members fail, neither holds devices
        for event in big:
            await bus.publish(event)
        found = await wait_until(bus, lambda d: sum(isinstance(e, ev.AllocationFailed) for e in d) >= 2)
        failed = [e for e in found if isinstance(e, ev.AllocationFailed)]
        assert {e.key for e in failed} == {"ml/big-0", "ml/big-1"}
        assert "none holds devices" in failed[0].message
        # the first gang leaves: the second is retried and placed whole
        for event in (first, second):
            await bus.publish(ev.ClaimDeleted(namespace="ml", name=event.claim.metadata.name, uid=event.claim.metadata.uid))
        found = await wait_until(bus, lambda d: {e.key for e in d if isinstance(e, ev.AllocationCommitted)} >= {"ml/big-0", "ml/big-1"})
    commits = [e.key for e in found if isinstance(e, ev.AllocationCommitted)]
    assert sorted(commits) == ["ml/big-0", "ml/big-1", "ml/train-0", "ml/train-1"]
