"""Fleets of simulated nodes (discovery's hardware profiles) in an engine, and claims."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.discovery.fleet import build_fleet, fleet_nodes
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.resource import DeviceClass, ResourceClaim

EXAMPLES = Path(__file__).parents[2] / "examples"

NIC_CLASS = msgspec.convert(
    {
        "metadata": {"name": "nic"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'dra.net'"}}]},
    },
    DeviceClass,
)


def make_engine(spec: list[tuple[str, int]], *, scoring: bool = True, keep_whole: float = 0.0) -> Engine:
    engine = Engine(scoring=scoring, keep_whole=keep_whole)
    for node in fleet_nodes(spec):
        engine.apply(node)
    for item in load_paths([EXAMPLES / "deviceclasses.yaml"]).objects:
        engine.apply(item.obj)
    engine.apply(NIC_CLASS)
    for _, slices in build_fleet(spec):
        for s in slices:
            engine.apply(s)
    return engine


def claim(
    name: str,
    gpus: int = 0,
    *,
    nics: int = 0,
    mig: str | None = None,
    match: str | None = None,
    annotations: dict | None = None,
) -> ResourceClaim:
    requests = []
    if gpus:
        exactly: dict = {"deviceClassName": "gpu.nvidia.com", "count": gpus}
        if mig:
            exactly = {
                "deviceClassName": "mig.nvidia.com",
                "count": gpus,
                "selectors": [{"cel": {"expression": f"device.attributes['gpu.nvidia.com'].profile == '{mig}'"}}],
            }
        requests.append({"name": "gpus", "exactly": exactly})
    if nics:
        requests.append({"name": "nics", "exactly": {"deviceClassName": "nic", "count": nics}})
    spec: dict = {"devices": {"requests": requests}}
    if match:
        spec["devices"]["constraints"] = [{"matchAttribute": match}]
    meta: dict = {"name": name, "namespace": "default", "uid": f"uid-{name}"}
    if annotations:
        meta["annotations"] = annotations
    return msgspec.convert({"metadata": meta, "spec": spec}, ResourceClaim)


def devices(outcome) -> list[str]:
    assert outcome.status == "allocated", outcome.message
    return sorted(r.device for r in outcome.allocation.devices.results)


@pytest.fixture
def engine_of():
    return make_engine


@pytest.fixture
async def fleet_bus(bus: Bus) -> Bus:
    """The private nats-server (the `bus` fixture) with the project's DeviceClasses and two H100 nodes (n-0, n-1)."""
    for event in events_from_manifests(load_paths([str(EXAMPLES / "deviceclasses.yaml")]), print):
        await bus.publish(event)
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 2, "prefix": "n"}]):
        for s in slices:
            await bus.publish(ev.ResourceSlicePublished(slice=s))
    return bus


def submitted(name: str, gpus: int, annotations: dict[str, str] | None = None) -> ev.ClaimSubmitted:
    """A ClaimSubmitted for `gpus` whole GPUs in namespace ml, with a fresh uid."""
    claim = msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ml", "uid": str(uuid.uuid4()), "generation": 1, "annotations": annotations or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )  # fmt: skip
    return ev.ClaimSubmitted(claim=claim)


async def decisions(bus: Bus) -> list[ev.Event]:
    """Every event in ALLOCATIONS, in order."""
    last = (await bus.stream_state("ALLOCATIONS")).last_sequence
    return [ev.decode((await jetstream(bus).get_msg("ALLOCATIONS", seq=seq)).data) for seq in range(1, last + 1)]
