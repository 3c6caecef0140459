"""Selectors made of literal == tests joined by && (the usual class selectors) are settled on the
device's values without an evaluator: the verdict, error or not, must be the reference interpreter's."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine.cel import CelRuntimeError, compile_selector, device_env
from dralloc.schemas.resource import Device

CLASS = "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"

DEVICES = {
    "gpu": ("gpu.nvidia.com", {"name": "g", "attributes": {"type": {"string": "gpu"}, "mig": {"bool": False}}}),
    "mig": ("gpu.nvidia.com", {"name": "m", "attributes": {"type": {"string": "mig"}}}),
    "qualified": ("gpu.nvidia.com", {"name": "q", "attributes": {"gpu.nvidia.com/type": {"string": "gpu"}}}),
    "no type": ("gpu.nvidia.com", {"name": "n", "attributes": {}}),
    "int type": ("gpu.nvidia.com", {"name": "i", "attributes": {"type": {"int": 1}}}),
    "other driver": ("nic.example.com", {"name": "x", "attributes": {}}),
    "unrepresentable": ("gpu.nvidia.com", {"name": "u", "attributes": {"type": {"string": "gpu"}, "big": {"int": 2**70}}}),
}


def verdict(decide, env) -> bool | str:
    try:
        return decide(env)
    except CelRuntimeError:
        return "error"


@pytest.mark.parametrize("expression", [
    CLASS,
    "device.attributes['gpu.nvidia.com'].type == 'gpu' && device.driver == 'gpu.nvidia.com'",
    'device.attributes["gpu.nvidia.com"]["mig"] == false',
    "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu' && device.attributes['gpu.nvidia.com'].mig == false",
])  # fmt: skip
@pytest.mark.parametrize("device", DEVICES)
def test_literal_tests_agree_with_the_interpreter(expression: str, device: str):
    selector = compile_selector(expression)
    assert selector._tests is not None  # settled without an evaluator where the values allow
    driver, raw = DEVICES[device]
    env = device_env(driver, msgspec.convert(raw, Device))
    assert verdict(selector.matches, env) == verdict(selector.evaluate, env)


def test_a_missing_attribute_is_an_error_unless_another_test_is_false():
    selector = compile_selector(CLASS)
    envs = {name: device_env(driver, msgspec.convert(raw, Device)) for name, (driver, raw) in DEVICES.items()}
    assert [verdict(selector.matches, envs[n]) for n in ("gpu", "mig", "qualified", "no type", "other driver")] == [
        True, False, True, "error", False,
    ]  # fmt: skip
    assert not envs["gpu"]._ctxs  # the evaluator's context was never needed


@pytest.mark.parametrize("expression", [
    "device.driver != 'gpu.nvidia.com'",
    "device.attributes['gpu.nvidia.com'].type == 'gpu' || device.driver == 'x'",
    "device.attributes['gpu.nvidia.com'].count == 1",
    "device.attributes[device.driver].type == 'gpu'",
    "'gpu' == device.attributes['gpu.nvidia.com'].type",
])  # fmt: skip
def test_other_shapes_go_to_the_evaluators(expression: str):
    assert compile_selector(expression)._tests is None


def test_a_selector_gets_a_context_with_only_what_it_reads():
    """A selector that reads one flat attribute map gets a context without the nested device
    map or the capacity map, and still decides right; one reading `device` as a whole gets it."""
    env = device_env(
        "gpu.nvidia.com",
        msgspec.convert(
            {"name": "gpu-0", "attributes": {"index": {"int": 3}, "driverVersion": {"version": "550.54.15"}}, "capacity": {"memory": {"value": "80Gi"}}}, Device
        ),
    )
    flat = compile_selector("device.attributes['gpu.nvidia.com'].index > 2")
    whole = compile_selector(
        "device.attributes.exists(d, d == 'gpu.nvidia.com') && device.attributes['gpu.nvidia.com'].driverVersion.isGreaterThan(semver('550.0.0'))"
    )
    quantity = compile_selector("device.capacity['gpu.nvidia.com'].memory.compareTo(quantity('40Gi')) > 0")
    assert quantity.matches(env)
    assert flat.matches(env) and whole.matches(env)
    assert len(env._ctxs) == 3
    needs_flat, needs_whole, needs_quantity = flat._needs, whole._needs, quantity._needs
    assert needs_flat.variables == {"__dra_attributes"} and not needs_flat.functions
    assert "device" in needs_whole.variables and needs_whole.functions
    assert needs_quantity.variables == {"__dra_capacity"}  # a literal quantity folds into a string comparison
