"""When the cluster's copy of an allocation is dralloc's (`dralloc.schemas.allocation.same_allocation`)."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from dralloc.schemas.allocation import GATED_RESULT_FIELDS, same_allocation
from dralloc.schemas.resource import AllocationResult, DeviceRequestAllocationResult

OURS: dict[str, Any] = {
    "devices": {
        "results": [
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-0", "device": "gpu-0", "bindingConditions": ["attached"], "bindingFailureConditions": ["failed"]},
            {"request": "gpu", "driver": "gpu.nvidia.com", "pool": "node-0", "device": "gpu-1", "shareID": "6f0b2c7e-1c1e-5d6a-9a4e-2b7f0c3d4e5f", "consumedCapacity": {"memory": "8Gi"}},
            {"request": "nic", "driver": "nic.example.com", "pool": "node-0", "device": "nic-0", "adminAccess": True, "skipNodeOperations": ["Prepare"]},
        ],
        "config": [{"source": "FromClass", "requests": ["gpu"], "opaque": {"driver": "gpu.nvidia.com", "parameters": {"sharing": "time-slicing"}}}],
    },
    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]},
}  # fmt: skip


def allocation(change: Any = None) -> AllocationResult:
    doc = msgspec.json.decode(msgspec.json.encode(OURS))
    if change is not None:
        change(doc)
    return msgspec.convert(doc, AllocationResult)


def test_the_same_allocation_written_at_another_time_is_the_same() -> None:
    assert same_allocation(allocation(lambda d: d.update(allocationTimestamp="2026-12-04T23:00:00Z")), allocation())


@pytest.mark.parametrize(
    "dropped",
    [("bindingConditions", "bindingFailureConditions"), ("shareID", "consumedCapacity"), ("adminAccess",), ("skipNodeOperations",)],
)
def test_gated_fields_the_server_dropped_are_no_difference(dropped: tuple[str, ...]) -> None:
    def drop(doc: dict[str, Any]) -> None:
        for result in doc["devices"]["results"]:
            for name in dropped:
                result.pop(name, None)

    assert same_allocation(allocation(drop), allocation())
    assert not same_allocation(allocation(), allocation(drop))  # a field only the cluster's has: not ours


def test_every_gated_field_is_a_field_of_a_device_result_with_its_empty_value() -> None:
    fields = {f.name: f for f in msgspec.structs.fields(DeviceRequestAllocationResult)}
    empty = {name: fields[name].default_factory() if fields[name].default is msgspec.NODEFAULT else fields[name].default for name in GATED_RESULT_FIELDS}
    assert empty == GATED_RESULT_FIELDS


@pytest.mark.parametrize(
    "change",
    [
        lambda d: d["devices"]["results"][0].update(device="gpu-7"),
        lambda d: d["devices"]["results"].pop(),
        lambda d: d["devices"]["results"].reverse(),
        lambda d: d["devices"]["results"][0].update(bindingConditions=["other"]),  # kept, but not ours
        lambda d: d["devices"]["results"][1].update(shareID="00000000-0000-5000-8000-000000000000"),
        lambda d: d["devices"]["results"][0].update(tolerations=[{"key": "k", "operator": "Exists"}]),
        lambda d: d["devices"].pop("config"),
        lambda d: d["nodeSelector"]["nodeSelectorTerms"][0]["matchFields"][0].update(values=["node-1"]),
        lambda d: d.pop("nodeSelector"),
    ],
)
def test_other_devices_config_or_node_are_another_allocation(change: Any) -> None:
    assert not same_allocation(allocation(change), allocation())
