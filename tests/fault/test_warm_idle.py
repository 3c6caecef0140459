"""The allocator warms its engine when idle (`Allocator.warm_engine`), so the first claim of a class
does not pay for the fleet's devices on its way (a real nats-server, the project's classes)."""

from __future__ import annotations

import asyncio

import msgspec
import pytest

from dralloc.allocator.engine import projection
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


async def test_the_engine_is_warmed_after_the_rebuild_and_after_each_inventory_change(bus: Bus, monkeypatch: pytest.MonkeyPatch):
    allocator = Allocator(bus)
    await allocator.rebuild()
    loop = asyncio.get_running_loop()
    done = asyncio.Event()  # set when a hop found nothing more to do
    warm = allocator.engine.warm

    def noting(seconds: float) -> bool:
        more = warm(seconds)
        if not more:
            loop.call_soon_threadsafe(done.set)
        return more

    monkeypatch.setattr(allocator.engine, "warm", noting)
    stop = asyncio.Event()
    task = asyncio.create_task(allocator.warm_engine(stop))
    await asyncio.wait_for(done.wait(), 60)
    calls = [0]
    real = projection.representable

    def counting(driver: str, device: object) -> bool:
        calls[0] += 1
        return real(driver, device)  # type: ignore[arg-type]

    monkeypatch.setattr(projection, "representable", counting)
    pending = await allocator.take_claim(_mig_claim("m0"))  # the MIG class's first: past 20 H100 nodes
    assert pending is not None
    await pending
    assert allocator.committed["ml/m0"].allocation is not None
    assert calls[0] == 0  # warmed: no device of the walk was checked on the claim's time
    done.clear()
    (_, slices), *_ = build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": "late"}])
    await allocator.on_inventory(ev.ResourceSlicePublished(slice=slices[0]))
    await asyncio.wait_for(done.wait(), 60)
    assert calls[0] == len(slices[0].spec.devices)  # the new devices, warmed after the change
    stop.set()
    await asyncio.wait_for(task, 10)  # and it ends with the term
