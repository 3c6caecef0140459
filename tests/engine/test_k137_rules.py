"""Kubernetes 1.37 rules beyond the conformance table: what a table cannot say (a shareID is
present and unique, a message names the device and the remedy, validation of fractional ranges)."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.schemas.resource import DeviceClass, ResourceClaim, ResourceSlice
from dralloc.schemas.validation import validate

DRIVER = "vgpu.example.com"


def _slice(policy: dict, multi: bool = True) -> ResourceSlice:
    return msgspec.convert(
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-1",
                "devices": [{"name": "v0", "allowMultipleAllocations": multi, "capacity": {"bw": {"value": "2", "requestPolicy": policy}}}],
            },
        },
        ResourceSlice,
    )


def _engine(policy: dict) -> Engine:
    engine = Engine(scoring=False)
    engine.apply(msgspec.convert({"metadata": {"name": "v"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass))
    engine.apply(_slice(policy))
    return engine


def _claim(name: str, **exactly: object) -> ResourceClaim:
    return msgspec.convert(
        {"metadata": {"name": name, "uid": f"uid-{name}"}, "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "v", **exactly}}]}}},
        ResourceClaim,
    )


POLICY = {"default": "500m", "validRange": {"min": "500m", "max": "1.5", "step": "250m"}}


def test_every_allocation_of_a_shared_device_has_its_own_share_id_admin_access_too() -> None:
    engine = _engine(POLICY)
    outcomes = engine.allocate([_claim("a"), _claim("b"), _claim("watch", adminAccess=True)], node="node-1")
    ids = [o.allocation.devices.results[0].share_id for o in outcomes]
    assert all(ids) and len(set(ids)) == 3
    # admin access consumes nothing: of 2, the two shares hold 1; two more of 0.5 fit, a third does not
    more = engine.allocate([_claim(f"m{i}") for i in range(3)], node="node-1")
    assert [o.status for o in more] == ["allocated", "allocated", "unsatisfiable"]


@pytest.mark.parametrize(("request_", "consumed"), [("600m", "750m"), ("1", "1"), ("1001m", "1250m"), ("100m", "500m")])
def test_fractional_range_rounds_up_to_min_plus_steps(request_: str, consumed: str) -> None:
    [outcome] = _engine(POLICY).allocate([_claim("a", capacity={"requests": {"bw": request_}})], node="node-1")
    assert outcome.allocation.devices.results[0].consumed_capacity == {"bw": consumed}


def test_fractional_range_over_max_is_refused() -> None:
    [outcome] = _engine(POLICY).allocate([_claim("a", capacity={"requests": {"bw": "1501m"}})], node="node-1")
    assert outcome.status == "unsatisfiable"


@pytest.mark.parametrize(("field", "value", "ok"), [("step", "250m", True), ("step", "0.25", True), ("min", "0.0005", False), ("max", "1500001u", False)])
def test_fractional_range_has_at_most_three_decimals(field: str, value: str, ok: bool) -> None:
    policy = {"default": "500m", "validRange": {"min": "500m", "max": "1.5", "step": "250m", field: value}}
    errors = [str(e) for e in validate(_slice(policy))]
    assert (errors == []) == ok, errors
    if not ok:
        assert f"validRange.{field}" in errors[0] and "3 decimal places" in errors[0]


def test_cel_runtime_error_names_selector_device_and_remedy() -> None:
    engine = _engine(POLICY)
    [outcome] = engine.allocate([_claim("a", selectors=[{"cel": {"expression": f'device.attributes["{DRIVER}"].model == "x"'}}])], node="node-1")
    assert outcome.status == "error"
    assert f"selector #0 on device {DRIVER}/p/v0: CEL runtime error" in outcome.message
    assert "has(" in outcome.message and "optional chaining" in outcome.message


def _held(name: str, *share_ids: str | None) -> ResourceClaim:
    results = [
        {"request": "r", "driver": DRIVER, "pool": "p", "device": "v0", **({"shareID": s, "consumedCapacity": {"bw": "500m"}} if s else {})} for s in share_ids
    ]
    return msgspec.convert(
        {
            "metadata": {"name": name, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "v"}}]}},
            "status": {"allocation": {"devices": {"results": results}}},
        },
        ResourceClaim,
    )


def test_a_result_without_share_id_holds_a_shared_device_whole_until_released() -> None:
    engine = _engine(POLICY)
    assert engine.restore(_held("old", None)) == []
    [outcome] = engine.allocate([_claim("new")], node="node-1")
    assert outcome.status == "unsatisfiable"
    [watch] = engine.allocate([_claim("watch", adminAccess=True)], node="node-1")
    assert watch.status == "allocated"  # admin access may still watch it
    engine.release("default/old")
    [outcome] = engine.allocate([_claim("again")], node="node-1")
    assert outcome.status == "allocated" and outcome.allocation.devices.results[0].share_id


def test_a_shared_device_listed_twice_without_share_id_is_counted_once() -> None:
    engine = _engine(POLICY)
    problems = engine.restore(_held("old", None, None))
    assert problems and "listed twice" in problems[0]
    engine.release("default/old")
    assert engine.ledger.used_bits == 0 and engine.ledger.exclusive == {}
    [outcome] = engine.allocate([_claim("new")], node="node-1")
    assert outcome.status == "allocated"


def test_an_existing_share_leaves_room_for_more_shares() -> None:
    engine = _engine(POLICY)
    assert engine.restore(_held("old", "11111111-1111-4111-8111-111111111111")) == []
    outcomes = engine.allocate([_claim(f"n{i}") for i in range(4)], node="node-1")
    assert [o.status for o in outcomes] == ["allocated", "allocated", "allocated", "unsatisfiable"]
