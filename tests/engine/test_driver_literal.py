"""The driver-literal shortcut: a selector that is exactly `device.driver == "x"` (the usual class
selector) is decided by the device's driver, without a CEL environment, and so without the error
Kubernetes gives every selector on a device it cannot represent. Pinned here: that shortcut is
dralloc's behaviour today (an unrepresentable device of the driver matches the driver test), and a
selector that reads anything else still fails on such a device, naming it."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.cel import compile_selector
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"
DEVICES = [
    {"name": "gpu-0", "attributes": {"ok": {"bool": True}}},
    {"name": "gpu-1", "attributes": {"ok": {"bool": True}, "huge": {"int": 2**70}}},  # CEL cannot hold 2**70
]


def _engine(class_selector: str | None) -> Engine:
    engine = Engine(scoring=False)
    engine.apply(msgspec.convert({"metadata": {"name": "node-1"}}, Node))
    selectors = [] if class_selector is None else [{"cel": {"expression": class_selector}}]
    engine.apply(msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": selectors}}, DeviceClass))
    spec = {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": DEVICES}
    assert engine.apply(msgspec.convert({"metadata": {"name": "s"}, "spec": spec}, ResourceSlice)) == []
    return engine


def _claim(count: int, selector: str | None = None) -> ResourceClaim:
    exactly: dict = {"deviceClassName": "gpu", "count": count}
    if selector is not None:
        exactly["selectors"] = [{"cel": {"expression": selector}}]
    return msgspec.convert(
        {"metadata": {"name": "c", "namespace": "ns", "uid": "u"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": exactly}]}}}, ResourceClaim
    )


# any spelling of the same test is the same test (before the two copies were merged, only the
# double-quoted form without parentheses took the shortcut)
@pytest.mark.parametrize("form", [f'device.driver == "{DRIVER}"', f'  device.driver=="{DRIVER}" ', f"(device.driver == '{DRIVER}')"])
def test_the_driver_test_takes_an_unrepresentable_device_of_that_driver(form: str) -> None:
    (outcome,) = _engine(form).allocate([_claim(2)])
    assert outcome.status == "allocated", outcome.message
    assert sorted(r.device for r in outcome.allocation.devices.results) == ["gpu-0", "gpu-1"]


def test_the_driver_test_as_a_request_selector_takes_it_too() -> None:
    (outcome,) = _engine(None).allocate([_claim(2, f'device.driver == "{DRIVER}"')])
    assert outcome.status == "allocated", outcome.message
    assert sorted(r.device for r in outcome.allocation.devices.results) == ["gpu-0", "gpu-1"]


def test_any_other_selector_fails_on_the_unrepresentable_device() -> None:
    # `true` reads no field, yet Kubernetes fails every selector on a device it cannot represent
    (outcome,) = _engine("true").allocate([_claim(1)], node="node-1")
    assert outcome.status == "error"
    assert "gpu-1" in outcome.message and "CEL runtime error" in outcome.message


def test_another_driver_is_no_match_and_no_error() -> None:
    (outcome,) = _engine('device.driver == "nic.example.com"').allocate([_claim(1)])
    assert outcome.status == "unsatisfiable"
    assert "CEL runtime error" not in outcome.message


def test_a_selector_that_reads_more_fails_on_the_unrepresentable_device() -> None:
    selector = f'device.driver == "{DRIVER}" && device.attributes["{DRIVER}"].ok'
    (outcome,) = _engine(selector).allocate([_claim(1)], node="node-1")
    assert outcome.status == "error"
    assert "gpu-1" in outcome.message and "CEL runtime error" in outcome.message


def test_a_request_selector_after_the_driver_test_still_fails_there() -> None:
    (outcome,) = _engine(f'device.driver == "{DRIVER}"').allocate([_claim(1, f'device.attributes["{DRIVER}"].ok')], node="node-1")
    assert outcome.status == "error"
    assert "gpu-1" in outcome.message


def test_the_shortcut_is_recognised_on_the_compiled_selector() -> None:
    assert compile_selector(f'device.driver == "{DRIVER}"').driver == DRIVER
    for other in (f'device.driver != "{DRIVER}"', f'device.driver == "{DRIVER}" && true', 'device.attributes["d"].x == "y"', "true"):
        assert compile_selector(other).driver is None
