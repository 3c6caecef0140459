"""Free devices and fragmentation per node and device class, worked out from the allocator's engine,
as claims are committed and released (real nats-server, the services in-process, an in-memory reader)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from dralloc import demo
from dralloc.bus import Bus, embedded_nats
from dralloc.metrics import FleetReadings, allocator_metrics
from dralloc.schemas import events as ev

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from pipeline import CLASSES, NAMESPACE, claim_event  # noqa: E402

GPU, MIG = "gpu.nvidia.com", "mig.nvidia.com"
FREE, NODE_FRAG, CLASS_FRAG = "dralloc.devices.free", "dralloc.node.fragmentation", "dralloc.class.fragmentation"
# Keys of the readings are attribute values sorted by attribute name: (device_class, node).


async def committed(bus: Bus) -> dict[str, list[str]]:
    """Claim name -> its devices, for the claims committed and not released."""
    held: dict[str, list[str]] = {}
    for event in (await bus.replay("ALLOCATIONS"))[0]:
        if isinstance(event, ev.AllocationCommitted):
            held[event.claim.metadata.name] = [r.device for r in event.allocation.devices.results]
        elif isinstance(event, ev.AllocationReleased):
            held.pop(event.name, None)
    return held


@pytest.fixture
async def system(tmp_path, request):
    """discovery (the fleet the test names), ingestor (the DeviceClasses) and allocator."""
    allocator_metrics().view = FleetReadings()  # not the view an earlier test's allocator left behind
    (tmp_path / "classes.yaml").write_text(CLASSES.read_text())
    async with embedded_nats() as url, await Bus.connect(url, name="test") as bus:
        await bus.ensure_streams()
        async with demo.running(url, paths=[str(tmp_path)], fleet=request.param, services=("discovery", "ingestor", "allocator")):
            yield bus


@pytest.mark.parametrize("system", [[{"profile": "a100-pcie", "count": 1, "prefix": "a100"}]], indirect=True)
async def test_free_devices_and_nvlink_fragmentation_of_a_node(system: Bus, until):
    """A100 PCIe: 8 GPUs in 4 NVLink-bridged pairs, MIG partitions sharing each GPU's counters."""
    bus = system
    found = await until(lambda f: f[FREE][(GPU, "a100-0")] == 8 and f[FREE][(MIG, "a100-0")] > 0)
    assert found[FREE][(GPU, "a100-0")] == 8
    partitions = found[FREE][(MIG, "a100-0")]
    assert partitions > 8  # several partition profiles per GPU
    assert found[NODE_FRAG][(GPU, "a100-0")] == 0 and found[CLASS_FRAG][(GPU,)] == 0

    for i in range(8):
        await bus.publish(claim_event(f"one-{i}"))
    found = await until(lambda f: f[FREE][(GPU, "a100-0")] == 0 and f[FREE][(MIG, "a100-0")] == 0)
    assert found[FREE][(GPU, "a100-0")] == 0
    # Every GPU in use holds its counters: no MIG partition can be made on it.
    assert found[FREE][(MIG, "a100-0")] == 0
    assert found[NODE_FRAG][(GPU, "a100-0")] == 0  # nothing free, nothing fragmented

    # Release one GPU of each pair: 4 free, but no two of them NVLink-connected.
    held = await committed(bus)
    by_device = {devices[0]: name for name, devices in held.items()}
    assert sorted(by_device) == [f"gpu-{i}" for i in range(8)]
    for device in ("gpu-0", "gpu-2", "gpu-4", "gpu-6"):
        await bus.publish(ev.ClaimDeleted(namespace=NAMESPACE, name=by_device[device]))
    found = await until(lambda f: f[FREE][(GPU, "a100-0")] == 4 and f[NODE_FRAG][(GPU, "a100-0")] > 0)
    assert found[FREE][(GPU, "a100-0")] == 4
    assert found[NODE_FRAG][(GPU, "a100-0")] == pytest.approx(0.5)  # 1 - largest block 1 / pair of 2
    assert found[CLASS_FRAG][(GPU,)] == 1.0  # the only node is partly used: all free GPUs are stranded
    assert 0 < found[FREE][(MIG, "a100-0")] < partitions  # the freed GPUs' partitions only

    # Free the rest of pair 0: a whole NVLink pair is free again.
    await bus.publish(ev.ClaimDeleted(namespace=NAMESPACE, name=by_device["gpu-1"]))
    found = await until(lambda f: f[FREE][(GPU, "a100-0")] == 5)
    assert found[FREE][(GPU, "a100-0")] == 5 and found[NODE_FRAG][(GPU, "a100-0")] == 0


@pytest.mark.parametrize("system", [[{"profile": "h100-sxm", "count": 2, "prefix": "h100"}]], indirect=True)
async def test_class_fragmentation_across_nodes(system: Bus, until):
    """Two H100 SXM nodes (one NVSwitch domain of 8 each): a one-GPU claim breaks one node."""
    bus = system
    found = await until(lambda f: f[FREE][(GPU, "h100-0")] == 8 and f[FREE][(GPU, "h100-1")] == 8)
    assert found[CLASS_FRAG][(GPU,)] == 0

    await bus.publish(claim_event("one"))
    found = await until(lambda f: sorted(f[FREE][(GPU, n)] for n in ("h100-0", "h100-1")) == [7, 8])
    assert sorted(found[FREE][(GPU, n)] for n in ("h100-0", "h100-1")) == [7, 8]
    assert found[CLASS_FRAG][(GPU,)] == pytest.approx(7 / 15)  # 7 of the 15 free GPUs are on the broken node
    assert found[NODE_FRAG][(GPU, "h100-0")] == 0 and found[NODE_FRAG][(GPU, "h100-1")] == 0  # one NVLink domain each
    node = next(n for n in ("h100-0", "h100-1") if found[FREE][(GPU, n)] == 7)
    assert found["dralloc.devices.allocated"][(GPU, node)] == 1

    await bus.publish(ev.ClaimDeleted(namespace=NAMESPACE, name="one"))
    found = await until(lambda f: f[FREE][(GPU, node)] == 8)
    assert found[FREE][(GPU, node)] == 8 and found[CLASS_FRAG][(GPU,)] == 0
