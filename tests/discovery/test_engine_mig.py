"""MIG counters in the engine: a whole GPU and any slice of it are never allocated together."""

from __future__ import annotations

import json

import pytest

from dralloc.allocator.engine import Engine
from dralloc.discovery.nvml import read_inventory
from dralloc.discovery.profiles import simulate
from dralloc.discovery.replay import ReplaySource
from dralloc.discovery.slices import build_slices
from dralloc.schemas.resource import (
    CELDeviceSelector,
    DeviceClaim,
    DeviceClass,
    DeviceClassSpec,
    DeviceRequest,
    DeviceSelector,
    ExactDeviceRequest,
    ObjectMeta,
    ResourceClaim,
    ResourceClaimSpec,
)


def device_class(name: str, expression: str) -> DeviceClass:
    return DeviceClass(
        metadata=ObjectMeta(name=name),
        spec=DeviceClassSpec(selectors=[DeviceSelector(cel=CELDeviceSelector(expression=expression))]),
    )


def claim(name: str, cls: str, count: int = 1) -> ResourceClaim:
    request = DeviceRequest(name="r", exactly=ExactDeviceRequest(device_class_name=cls, count=count))
    return ResourceClaim(metadata=ObjectMeta(name=name, namespace="default"), spec=ResourceClaimSpec(devices=DeviceClaim(requests=[request])))


def engine_for(slices) -> Engine:
    engine = Engine()
    for s in slices:
        assert engine.apply(s) == [], s.metadata.name
    gpu = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == "
    engine.apply(device_class("gpu", gpu + "'gpu'"))
    for profile in ("1g.18gb", "3g.71gb", "7g.141gb"):
        engine.apply(device_class(f"mig-{profile.replace('.', '-')}", gpu + f"'mig' && device.attributes['gpu.nvidia.com'].profile == '{profile}'"))
    return engine


def status(engine: Engine, c: ResourceClaim) -> str:
    [outcome] = engine.allocate([c])
    return outcome.status


@pytest.fixture
def h200_slices(shared_dir):
    def build(layout: str):
        capture = json.loads((shared_dir / "fixtures/hardware/h200-vm/nvml-inventory.json").read_text())
        return build_slices(read_inventory(ReplaySource(capture), "h200-vm"), layout=layout)

    return build


@pytest.mark.parametrize("layout", ["1.35", "1.34"])
def test_whole_gpu_and_slices_exclude_each_other(h200_slices, layout: str) -> None:
    engine = engine_for(h200_slices(layout))
    assert status(engine, claim("whole", "gpu")) == "allocated"
    assert status(engine, claim("slice", "mig-1g-18gb")) == "unsatisfiable"
    assert engine.release("default/whole")

    assert status(engine, claim("sevenths", "mig-1g-18gb", count=7)) == "allocated"
    assert status(engine, claim("whole-again", "gpu")) == "unsatisfiable"
    assert status(engine, claim("eighth", "mig-1g-18gb")) == "unsatisfiable"
    assert engine.release("default/sevenths")

    # Two 3g.71gb take all 8 memory slices: nothing else fits, the whole GPU neither.
    assert status(engine, claim("halves", "mig-3g-71gb", count=2)) == "allocated"
    assert status(engine, claim("small", "mig-1g-18gb")) == "unsatisfiable"
    assert status(engine, claim("whole-3", "gpu")) == "unsatisfiable"
    assert engine.release("default/halves")
    assert status(engine, claim("full", "mig-7g-141gb")) == "allocated"
    assert status(engine, claim("whole-4", "gpu")) == "unsatisfiable"


def test_on_an_8_gpu_node_slices_of_one_gpu_leave_the_others_whole() -> None:
    engine = engine_for(build_slices(simulate("h200-sxm-mig", "n1")))
    assert status(engine, claim("slices", "mig-1g-18gb", count=3)) == "allocated"
    # Seven whole GPUs remain; the eighth is (partly) sliced.
    assert status(engine, claim("seven", "gpu", count=7)) == "allocated"
    assert status(engine, claim("one-more", "gpu")) == "unsatisfiable"
