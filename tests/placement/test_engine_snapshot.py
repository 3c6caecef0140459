"""Observers read `Engine.snapshot()`: immutable, unchanged by later work, and what the metrics report.

Simulated H100 SXM nodes (8 GPUs in one NVSwitch domain each) and A100 PCIe (MIG
partitions sharing each GPU's counters) with the examples' DeviceClasses.
"""

from __future__ import annotations

import asyncio
import random
import threading
from pathlib import Path

import msgspec
import pytest
from conftest import claim, make_engine

from dralloc.allocator.engine import EngineSnapshot
from dralloc.allocator.service import Allocator
from dralloc.bus import Bus
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.metrics import FRESH_S, allocator_metrics, fleet_readings
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim

GPU, MIG = "gpu.nvidia.com", "mig.nvidia.com"
FLEET = [("h100-sxm", 3)]
PER_NODE = 8


def gpu_free(snapshot: EngineSnapshot) -> dict[str, int]:
    return {u.node: u.free for u in snapshot.usage if u.device_class == GPU}


def test_a_snapshot_is_not_changed_by_later_allocations_or_releases() -> None:
    engine = make_engine(FLEET)
    before = engine.snapshot(fleet=True)
    kept = msgspec.to_builtins(before)
    assert set(gpu_free(before).values()) == {PER_NODE} and before.holders == () and before.claims == 0

    (outcome,) = engine.allocate([claim("four", 4)])
    assert outcome.status == "allocated"
    after = engine.snapshot(fleet=True)
    assert msgspec.to_builtins(before) == kept  # the earlier picture is as it was
    assert sorted(gpu_free(after).values()) == [4, PER_NODE, PER_NODE]
    assert after.holders == ((outcome.node, ("default/four",)),) and after.claims == 1

    assert engine.release("default/four")
    released = engine.snapshot(fleet=True)
    assert after.holders == ((outcome.node, ("default/four",)),)  # taken before the release: still says so
    assert released.holders == () and set(gpu_free(released).values()) == {PER_NODE}
    with pytest.raises(AttributeError):
        after.claims = 0  # type: ignore[misc]  # frozen


def test_a_gpu_in_use_leaves_none_of_its_partitions_free() -> None:
    engine = make_engine([("a100-pcie", 1)])  # MIG partitions share each GPU's counters
    before = {u.device_class: u for u in engine.snapshot(fleet=True).usage}
    (outcome,) = engine.allocate([claim("whole", 1)])
    after = {u.device_class: u for u in engine.snapshot(fleet=True).usage}
    assert outcome.status == "allocated" and after[GPU].free == before[GPU].free - 1
    per_gpu = before[MIG].total // before[GPU].total
    assert after[MIG].free == before[MIG].free - per_gpu and after[MIG].total == before[MIG].total


def test_without_fleet_only_the_holders_are_taken() -> None:
    engine = make_engine(FLEET)
    (outcome,) = engine.allocate([claim("one", 1)])
    light = engine.snapshot()
    assert light.fleet is False and light.usage == () and light.holders_by_node() == {outcome.node: ["default/one"]}


def test_the_metrics_report_what_the_snapshot_says() -> None:
    engine = make_engine(FLEET)
    (one,) = engine.allocate([claim("one", 1)])
    (two,) = engine.allocate([claim("two", 2)])
    snapshot = engine.snapshot(fleet=True)
    metrics = allocator_metrics()
    metrics.observed(snapshot, {"h100-sxm-0": 8})

    free = {(o.attributes["node"], o.attributes["device_class"]): o.value for o in metrics._observe_free(None)}
    assert free == {(u.node, u.device_class): u.free for u in snapshot.usage}
    node_fragmentation = {(o.attributes["node"], o.attributes["device_class"]): o.value for o in metrics._observe_node_fragmentation(None)}
    assert node_fragmentation == {(u.node, u.device_class): u.fragmentation for u in snapshot.usage}
    # and what the claims say, worked out here: best fit put both on one node (5 GPUs free there)
    assert one.node == two.node
    assert sorted(free[(node, GPU)] for node in gpu_free(snapshot)) == [5, PER_NODE, PER_NODE]
    assert all(node_fragmentation[(node, GPU)] == 0 for node in gpu_free(snapshot))  # one NVSwitch domain per node
    (gpu_class,) = [o.value for o in metrics._observe_class_fragmentation(None) if o.attributes["device_class"] == GPU]
    assert gpu_class == pytest.approx(5 / 21)  # 5 of the 21 free GPUs are on the partly used node
    assert [(o.value, dict(o.attributes)) for o in metrics._observe_reserved(None)] == [(8, {"node": "h100-sxm-0"})]


def test_an_observer_thread_reads_consistent_values_while_the_engine_allocates() -> None:
    """The owner allocates and releases, handing each snapshot over; a reader thread meanwhile checks
    that every snapshot and every gauge reading agrees with itself (no exception, no torn state)."""
    engine = make_engine(FLEET)
    metrics = allocator_metrics()
    latest: list[EngineSnapshot] = [engine.snapshot(fleet=True)]
    sizes: dict[str, int] = {}
    live: set[str] = set()
    problems: list[str] = []
    reads = [0]
    done = threading.Event()

    def check_once() -> None:
        snapshot = latest[0]
        held = sum(sizes[key] for _, keys in snapshot.holders for key in keys)
        free = sum(gpu_free(snapshot).values())
        if free != PER_NODE * len(gpu_free(snapshot)) - held:
            problems.append(f"snapshot: {free} GPUs free with {held} held")
        view = metrics.view
        gpus = {node: n for (node, cls), n in view.free if cls == GPU}
        spare = sum(gpus.values())
        stranded = sum(n for n in gpus.values() if n < PER_NODE)
        reported = dict(view.class_fragmentation).get(GPU, 0.0)
        if spare and reported != pytest.approx(stranded / spare):
            problems.append(f"view: class fragmentation {reported} with {stranded}/{spare} stranded")
        for observe in (metrics._observe_free, metrics._observe_node_fragmentation, metrics._observe_class_fragmentation, metrics._observe_reserved):
            list(observe(None))
        reads[0] += 1

    def reader() -> None:
        try:
            while not done.is_set():
                check_once()
        except Exception as exc:  # noqa: BLE001 - the assertion below names it
            problems.append(f"reader: {type(exc).__name__}: {exc}")

    thread = threading.Thread(target=reader)
    thread.start()
    rng = random.Random(7)
    try:
        for i in range(60):
            if live and rng.random() < 0.4:
                key = rng.choice(sorted(live))
                live.discard(key)
                assert engine.release(key)
            else:
                name = f"c{i}"
                (outcome,) = engine.allocate([claim(name, rng.choice([1, 2, 4]))])
                if outcome.status == "allocated":
                    sizes[outcome.claim] = len(outcome.allocation.devices.results)
                    live.add(outcome.claim)
            snapshot = engine.snapshot(fleet=True)
            metrics.observed(snapshot, {})
            # (sizes only grows: a released claim's size stays known for snapshots the reader still holds)
            latest[0] = snapshot
    finally:
        done.set()
        thread.join()
    check_once()  # the last state, at least once
    assert problems == [], problems[:5]
    assert reads[0] >= 1
    assert fleet_readings(latest[0], {}) == metrics.view


async def test_a_collection_in_another_thread_gets_a_snapshot_the_allocators_loop_takes(bus: Bus) -> None:
    """The exporter's case: the gauges, read in another thread, ask the allocator's loop for a snapshot
    and wait for it; what they report is the engine as it is now, not as it was at an earlier snapshot."""
    for event in events_from_manifests(load_paths([str(Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml")]), print):
        await bus.publish(event)
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": "n"}]):
        for s in slices:
            await bus.publish(ev.ResourceSlicePublished(slice=s))
    allocator = Allocator(bus)
    await allocator.rebuild()
    metrics = allocator_metrics()

    def free_gpus() -> dict[str, int]:  # in a worker thread, as the SDK's exporter collects
        return {o.attributes["node"]: o.value for o in metrics._observe_free(None) if o.attributes["device_class"] == GPU}

    await asyncio.sleep(FRESH_S)  # whatever view an earlier test left is too old to serve
    assert await asyncio.to_thread(free_gpus) == {"n-0": PER_NODE}
    three = msgspec.convert(
        {
            "metadata": {"name": "three", "namespace": "ml", "uid": "uid-three"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": GPU, "count": 3}}]}},
        },
        ResourceClaim,
    )
    submitted = ev.ClaimSubmitted(claim=three)
    await bus.publish(submitted)
    await allocator.on_claim(submitted)
    await asyncio.sleep(FRESH_S)
    assert await asyncio.to_thread(free_gpus) == {"n-0": PER_NODE - 3}
