"""Plans remembered per claim spec (plan.Planner): a claim with a spec planned before gets the same
plan as a fresh one, its own name in every message, its metadata still checked, and a changed
class is seen at once; the memory stays bounded."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine import Engine, cel, plan
from dralloc.allocator.engine.plan import Planner, plan_claim
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice


def _class(expression: str) -> DeviceClass:
    return msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": expression}}]}}, DeviceClass)


def _claim(name: str, count: int = 1, namespace: str = "ns") -> ResourceClaim:
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": count}}]}},
        },
        ResourceClaim,
    )


def _engine() -> Engine:
    engine = Engine(scoring=False)
    engine.apply(msgspec.convert({"metadata": {"name": "node-1"}}, Node))
    engine.apply(_class('device.driver == "gpu.example.com"'))
    devices = [{"name": f"gpu-{i}", "attributes": {"model": {"string": "a" if i < 2 else "b"}}} for i in range(4)]
    spec = {"driver": "gpu.example.com", "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": devices}
    assert engine.apply(msgspec.convert({"metadata": {"name": "s"}, "spec": spec}, ResourceSlice)) == []
    return engine


def _fresh(engine: Engine, claim: ResourceClaim) -> plan.ClaimPlan:
    inv = engine.inventory
    return plan_claim(claim, inv.classes, inv.class_versions, cel.compile_selector, cel.CelCompileError)


def test_a_remembered_spec_plans_as_a_fresh_one_under_its_own_name() -> None:
    engine = _engine()
    inv = engine.inventory
    first = engine.planner.plan(_claim("a"), inv.classes, inv.class_versions)
    second = engine.planner.plan(_claim("b"), inv.classes, inv.class_versions)
    assert second.requests is first.requests  # shared, not rebuilt
    assert second.key == "ns/b" and second.claim.metadata.name == "b"
    fresh = _fresh(engine, _claim("b"))
    assert msgspec.to_builtins([[(a.result_name, a.verdict_key, a.count) for a in r.alts] for r in second.requests]) == msgspec.to_builtins(
        [[(a.result_name, a.verdict_key, a.count) for a in r.alts] for r in fresh.requests]
    )
    (a,) = engine.allocate([_claim("a", 3)])
    (b,) = engine.allocate([_claim("b", 3)])
    assert a.status == "allocated" and b.status == "unsatisfiable"
    assert b.message.startswith("cannot allocate the claim") and "ns/a" not in b.message


def test_metadata_is_checked_on_every_claim() -> None:
    engine = _engine()
    assert engine.allocate([_claim("good")])[0].status == "allocated"
    (bad,) = engine.allocate([_claim("Not_A_Name")])
    assert bad.status == "error"
    assert bad.message == _fresh(engine, _claim("Not_A_Name")).error


def test_a_changed_class_is_seen_at_once() -> None:
    engine = _engine()
    assert engine.allocate([_claim("a")])[0].status == "allocated"
    engine.apply(_class('device.driver == "gpu.example.com" && device.attributes["gpu.example.com"].model == "b"'))
    (b,) = engine.allocate([_claim("b")])
    assert b.status == "allocated"
    assert [r.device for r in b.allocation.devices.results] == ["gpu-2"]
    engine.remove("DeviceClass", "gpu")
    (c,) = engine.allocate([_claim("c")])
    assert c.status == "error" and "device class 'gpu' not found" in c.message


def test_the_memory_is_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(plan, "PLAN_MEMORY", 3)
    engine = _engine()
    inv = engine.inventory
    planner = Planner(cel.compile_selector, cel.CelCompileError)
    for n in range(1, 8):
        assert planner.plan(_claim(f"c{n}", n), inv.classes, inv.class_versions).error is None
    assert len(planner._memory) == 3
