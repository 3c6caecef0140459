"""The candidate filters are one pipeline (engine/filters.py): `explain` reports what each stage
left, in FILTERS order, from the same stages the search runs, and the search's candidates are the
explanation's."""

from __future__ import annotations

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.filters import FILTERS, candidates, node_devices
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice

DRIVER = "gpu.example.com"
DEVICES = [
    {"name": "gpu-0", "attributes": {"model": {"string": "a"}}},  # taken by the first claim: "in use"
    {"name": "gpu-1", "attributes": {"model": {"string": "a"}}, "taints": [{"key": "k", "value": "v", "effect": "NoSchedule"}]},
    {"name": "gpu-2", "attributes": {}},  # no model: the matchAttribute cannot cover it
    {"name": "gpu-3", "attributes": {"model": {"string": "a"}}},
    {"name": "gpu-4", "attributes": {"model": {"string": "a"}}},
]


def _engine() -> Engine:
    engine = Engine(scoring=False)
    engine.apply(msgspec.convert({"metadata": {"name": "node-1"}}, Node))
    engine.apply(msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass))
    spec = {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": DEVICES}
    assert engine.apply(msgspec.convert({"metadata": {"name": "s"}, "spec": spec}, ResourceSlice)) == []
    return engine


def _claim(name: str, count: int, match: bool) -> ResourceClaim:
    devices: dict = {"requests": [{"name": "r", "exactly": {"deviceClassName": "gpu", "count": count}}]}
    if match:
        devices["constraints"] = [{"matchAttribute": f"{DRIVER}/model"}]
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns", "uid": name}, "spec": {"devices": devices}}, ResourceClaim)


def test_explain_counts_what_each_stage_left_and_the_search_refuses_with_the_same_stage() -> None:
    engine = _engine()
    (first,) = engine.allocate([_claim("first", 1, False)])
    assert [r.device for r in first.allocation.devices.results] == ["gpu-0"]
    (outcome,) = engine.allocate([_claim("c", 3, True)], node="node-1", explain=True)
    assert outcome.status == "unsatisfiable"
    assert outcome.message.endswith("only 2 device(s) left after the 'constraints' filter, 3 wanted")
    (report,) = outcome.explanation.nodes[0].requests
    assert [(f.filter, f.left) for f in report.filters] == list(zip(FILTERS, [5, 5, 5, 5, 4, 4, 4, 3, 2]))
    assert report.emptied_by == "constraints"
    assert report.note.startswith(f"device {DRIVER}/p/gpu-1 is tainted: k=v:NoSchedule")


def test_the_search_and_explain_get_the_same_candidates() -> None:
    engine = _engine()
    engine.allocate([_claim("first", 1, False)])
    plan = engine.planner.plan(_claim("c", 2, True), engine.inventory.classes, engine.inventory.class_versions)
    alt = plan.requests[0].alts[0]
    devices = node_devices(engine.inventory, "node-1")
    verdict = engine.verdicts.get(alt, devices[0])
    quick = candidates(engine.inventory, engine.ledger, plan, alt, verdict, devices, "node-1")
    counted = candidates(engine.inventory, engine.ledger, plan, alt, verdict, devices, "node-1", explain=True)
    assert [r.name for r in quick.recs] == [r.name for r in counted.recs] == ["gpu-3", "gpu-4"]
    assert quick.problem == counted.problem == ""
    assert quick.note == "" and counted.note.startswith(f"device {DRIVER}/p/gpu-1 is tainted")


def test_the_search_counts_a_short_list_as_explain_does() -> None:
    # the search's one-pass filter counts what each stage dropped; explain runs the stages one by one
    engine = _engine()
    engine.allocate([_claim("first", 1, False)])
    plan = engine.planner.plan(_claim("c", 3, True), engine.inventory.classes, engine.inventory.class_versions)
    alt = plan.requests[0].alts[0]
    devices = node_devices(engine.inventory, "node-1")
    verdict = engine.verdicts.get(alt, devices[0])
    quick = candidates(engine.inventory, engine.ledger, plan, alt, verdict, devices, "node-1")
    counted = candidates(engine.inventory, engine.ledger, plan, alt, verdict, devices, "node-1", explain=True)
    assert quick.left == counted.left == [("in use", 4), ("counters", 4), ("capacity", 4), ("taints", 3), ("constraints", 2)]
    assert quick.emptied_by == counted.emptied_by == "constraints"
    assert quick.problem == counted.problem == "only 2 device(s) left after the 'constraints' filter, 3 wanted"
    assert [r.name for r in quick.recs] == [r.name for r in counted.recs] == ["gpu-3", "gpu-4"]
