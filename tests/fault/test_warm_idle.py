"""The allocator warms its engine when idle (`Allocator.warm_engine`), so the first claim of a class
does not pay for the fleet's devices on its way (a real nats-server, the project's classes)."""

from __future__ import annotations

import asyncio
import time

import msgspec
import pytest

from dralloc.allocator import shell
from dralloc.allocator.engine import projector
from dralloc.allocator.service import Allocator
from dralloc.bus import Bus
from dralloc.discovery.fleet import build_fleet
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim


@pytest.fixture
def fleet() -> list[dict]:
    return [{"profile": "h100-sxm", "count": 20, "prefix": "n"}, {"profile": "h200-sxm-mig", "count": 1, "prefix": "mig"}]


def _mig_claim(name: str) -> ev.ClaimSubmitted:
    request = {"name": "mig", "exactly": {"deviceClassName": "mig.nvidia.com", "count": 1}}
    claim = {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}", "generation": 1}, "spec": {"devices": {"requests": [request]}}}
    return ev.ClaimSubmitted(claim=msgspec.convert(claim, ResourceClaim))


async def _warming(
    bus: Bus, monkeypatch: pytest.MonkeyPatch, hops: list[float] | None = None
) -> tuple[Allocator, asyncio.Queue[float], asyncio.Event, asyncio.Task[None]]:
    """An allocator rebuilt from `bus`, its warm task started and its first round ended: (the
    allocator, a queue that gets the time each later round ends, the task's stop, the task). Each
    hop's start is noted in `hops`."""
    allocator = Allocator(bus)
    await allocator.rebuild()
    loop = asyncio.get_running_loop()
    ended: asyncio.Queue[float] = asyncio.Queue()
    warm = allocator.engine.warm

    def noting(seconds: float) -> bool:
        if hops is not None:
            hops.append(time.monotonic())
        more = warm(seconds)
        if not more:  # (a hop that found nothing more to do ends the round)
            loop.call_soon_threadsafe(ended.put_nowait, time.monotonic())
        return more

    monkeypatch.setattr(allocator.engine, "warm", noting)
    stop = asyncio.Event()
    task = asyncio.create_task(allocator.warm_engine(stop))
    await asyncio.wait_for(ended.get(), 60)
    return allocator, ended, stop, task


async def test_the_engine_is_warmed_after_the_rebuild_and_after_each_inventory_change(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    allocator, ended, stop, task = await _warming(bus, monkeypatch)
    calls = [0]
    real = projector.representable

    def counting(driver: str, device: object) -> bool:
        calls[0] += 1
        return real(driver, device)  # type: ignore[arg-type]

    monkeypatch.setattr(projector, "representable", counting)
    pending = await allocator.take_claim(_mig_claim("m0"))  # the MIG class's first: past 20 H100 nodes
    assert pending is not None
    await pending
    assert allocator.committed["ml/m0"].allocation is not None
    assert calls[0] == 0  # warmed: no device of the walk was checked on the claim's time
    (_, slices), *_ = build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": "late"}])
    await allocator.on_inventory(ev.ResourceSlicePublished(slice=slices[0]))
    await asyncio.wait_for(ended.get(), 60)
    assert calls[0] == len(slices[0].spec.devices)  # the new devices, warmed after the change
    stop.set()
    await asyncio.wait_for(task, 10)  # and it ends with the term


async def test_warm_waits_for_a_lull_in_the_inventory(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    """A fleet arrives as thousands of inventory events: a warm round after each would pay the
    round's pass over every node (the multi-node domains) thousands of times, and each claim
    meanwhile would wait for a hop."""
    monkeypatch.setattr(shell, "WARM_LULL_S", 2.0)
    monkeypatch.setattr(shell, "WARM_DEFER_S", 60.0)
    hops: list[float] = []
    allocator, ended, stop, task = await _warming(bus, monkeypatch, hops)
    before = len(hops)
    arrived = []
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 10, "prefix": "late"}]):
        await allocator.on_inventory(ev.ResourceSlicePublished(slice=slices[0]))
        arrived.append(time.monotonic())
        await asyncio.sleep(0.05)  # a slice every 50 ms: no lull of 2 s (a stall that long would fail this)
    assert len(hops) == before  # no round while they came
    await asyncio.wait_for(ended.get(), 60)
    assert hops[before] >= arrived[-1] + 1.95  # one round, after the lull (2 s after the last change)
    stop.set()
    await asyncio.wait_for(task, 10)


async def test_warm_under_an_inventory_that_never_rests_runs_once_a_defer(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(shell, "WARM_LULL_S", 0.5)
    monkeypatch.setattr(shell, "WARM_DEFER_S", 0.3)
    allocator, rounds, stop, task = await _warming(bus, monkeypatch)
    began = time.monotonic()
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 40, "prefix": "late"}]):
        await allocator.on_inventory(ev.ResourceSlicePublished(slice=slices[0]))
        await asyncio.sleep(0.05)
    ended = time.monotonic()
    finished = []
    while not rounds.empty():
        finished.append(rounds.get_nowait())
    assert finished  # warmed while the changes went on (never a lull of 0.5 s)
    assert len(finished) <= (ended - began) / 0.3 + 2  # at most a round a defer, not one a change (40)
    stop.set()
    await asyncio.wait_for(task, 10)
