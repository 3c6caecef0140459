"""Fleets of simulated nodes (discovery's hardware profiles) in an engine, and claims."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.discovery.fleet import build_fleet, fleet_nodes
from dralloc.manifests import load_paths
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
