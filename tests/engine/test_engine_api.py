"""The Engine API others build on: apply/remove, restore, allocate, release, allocation_of."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice


def _node(name: str) -> Node:
    return msgspec.convert({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}, Node)


def _class(name: str = "gpu", driver: str = "gpu.example.com") -> DeviceClass:
    return msgspec.convert({"metadata": {"name": name}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{driver}"'}}]}}, DeviceClass)


def _slice(
    node: str, devices: list[dict], *, pool: str | None = None, generation: int = 1, counters: list | None = None, name: str | None = None
) -> ResourceSlice:
    spec = {
        "driver": "gpu.example.com",
        "pool": {"name": pool or node, "generation": generation, "resourceSliceCount": 1},
        "nodeName": node,
        "devices": devices,
    }
    if counters:
        spec["sharedCounters"] = counters
    return msgspec.convert({"metadata": {"name": name or f"{node}-gpus"}, "spec": spec}, ResourceSlice)


def _claim(name: str, count: int = 1, **exactly) -> ResourceClaim:
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ns", "uid": f"uid-{name}"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count, **exactly}}]}},
        },
        ResourceClaim,
    )


def _engine(*slices: ResourceSlice) -> Engine:
    engine = Engine(scoring=False)
    engine.apply(_node("node-1"))
    engine.apply(_node("node-2"))
    engine.apply(_class())
    for s in slices:
        assert engine.apply(s) == []
    return engine


GPUS = [{"name": f"gpu-{i}"} for i in range(2)]


def _devices(outcome) -> list[str]:
    return [r.device for r in outcome.allocation.devices.results]


def test_allocate_commits_and_release_returns_devices():
    engine = _engine(_slice("node-1", GPUS))
    a, b, c = engine.allocate([_claim("a"), _claim("b"), _claim("c")], node="node-1")
    assert [a.status, b.status, c.status] == ["allocated", "allocated", "unsatisfiable"]
    assert engine.allocation_of("ns/a") == a.allocation
    assert engine.release("ns/a") is True
    assert engine.release("ns/a") is False
    assert engine.allocation_of("ns/a") is None
    (again,) = engine.allocate([_claim("c")], node="node-1")
    assert again.status == "allocated" and _devices(again) == ["gpu-0"]


def test_allocate_is_idempotent_per_claim_key():
    engine = _engine(_slice("node-1", GPUS))
    (first,) = engine.allocate([_claim("a")])
    (second,) = engine.allocate([_claim("a")])
    assert second.status == "allocated" and second.allocation == first.allocation
    (other,) = engine.allocate([_claim("b")])
    assert _devices(other) == ["gpu-1"]  # the repeat took nothing new


def test_restore_rebuilds_the_ledger_even_before_slices_arrive():
    engine = _engine()
    existing = msgspec.convert(
        {
            **msgspec.to_builtins(_claim("old")),
            "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}]}}},
        },
        ResourceClaim,
    )
    assert engine.restore(existing) == []
    engine.apply(_slice("node-1", GPUS))
    (outcome,) = engine.allocate([_claim("new", count=2)], node="node-1")
    assert outcome.status == "unsatisfiable"
    assert engine.release("ns/old")
    (outcome,) = engine.allocate([_claim("new", count=2)], node="node-1")
    assert outcome.status == "allocated"


def test_restore_refuses_a_device_held_by_another_claim():
    engine = _engine(_slice("node-1", GPUS))
    engine.allocate([_claim("a")])
    taken = msgspec.convert(
        {
            **msgspec.to_builtins(_claim("b")),
            "status": {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", "device": "gpu-0"}]}}},
        },
        ResourceClaim,
    )
    problems = engine.restore(taken)
    assert len(problems) == 1 and "already allocated to claim ns/a" in problems[0]


def test_release_returns_counters():
    counters = [{"name": "chip", "counters": {"slices": {"value": "2"}}}]
    devices = [{"name": f"part-{i}", "consumesCounters": [{"counterSet": "chip", "counters": {"slices": {"value": "1"}}}]} for i in range(3)]
    engine = _engine(_slice("node-1", devices, counters=counters))
    outcomes = engine.allocate([_claim("a"), _claim("b"), _claim("c")], node="node-1")
    assert [o.status for o in outcomes] == ["allocated", "allocated", "unsatisfiable"]
    engine.release("ns/b")
    (outcome,) = engine.allocate([_claim("c")], node="node-1")
    assert outcome.status == "allocated"


def test_release_returns_capacity():
    shared = [{"name": "vgpu", "allowMultipleAllocations": True, "capacity": {"memory": {"value": "80Gi"}}}]
    engine = _engine(_slice("node-1", shared))
    a, b = engine.allocate([_claim("a", capacity={"requests": {"memory": "50Gi"}}), _claim("b", capacity={"requests": {"memory": "50Gi"}})], node="node-1")
    assert (a.status, b.status) == ("allocated", "unsatisfiable")
    assert a.allocation.devices.results[0].share_id
    assert a.allocation.devices.results[0].consumed_capacity == {"memory": "50Gi"}
    engine.release("ns/a")
    (b,) = engine.allocate([_claim("b", capacity={"requests": {"memory": "50Gi"}})], node="node-1")
    assert b.status == "allocated"


def test_slice_update_keeps_allocations_and_new_generation_replaces_devices():
    engine = _engine(_slice("node-1", GPUS))
    engine.allocate([_claim("a")], node="node-1")
    # a new generation of the pool: gpu-0 still exists (and is still in use), gpu-1 is gone
    engine.apply(_slice("node-1", [{"name": "gpu-0"}, {"name": "gpu-2"}], generation=2, name="node-1-gpus-v2"))
    (b,) = engine.allocate([_claim("b")], node="node-1")
    assert _devices(b) == ["gpu-2"]
    (c,) = engine.allocate([_claim("c")], node="node-1")
    assert c.status == "unsatisfiable"


def test_remove_slice_and_class():
    engine = _engine(_slice("node-1", GPUS))
    engine.remove("ResourceSlice", "node-1-gpus")
    (a,) = engine.allocate([_claim("a")])
    assert a.status == "unsatisfiable"
    engine.remove("DeviceClass", "gpu")
    (b,) = engine.allocate([_claim("b")])
    assert b.status == "error" and "device class 'gpu' not found" in b.message
    with pytest.raises(ValueError):
        engine.remove("Pod", "x")


def test_invalid_pool_is_reported_and_skipped():
    engine = _engine()
    problems = engine.apply(_slice("node-1", [{"name": "gpu-0"}, {"name": "gpu-0"}]))
    assert problems and "duplicate device name 'gpu-0'" in problems[0]
    (a,) = engine.allocate([_claim("a")], explain=True)
    assert a.status == "unsatisfiable"
    assert "invalid" in " ".join(a.explanation.notes)
    (b,) = engine.allocate([_claim("b")])
    assert b.status == "unsatisfiable" and b.explanation is None  # only explain pays for an explanation


def test_engine_picks_the_first_node_with_room():
    engine = _engine(_slice("node-1", GPUS), _slice("node-2", GPUS))
    outcomes = engine.allocate([_claim("a", count=2), _claim("b", count=2), _claim("c")])
    assert [o.node for o in outcomes] == ["node-1", "node-2", None]
    assert outcomes[2].status == "unsatisfiable"


def test_search_budget_ends_in_an_error():
    # one device per pair (6 pairs, distinctAttribute), an even device costs A=1 and B=1, an odd one
    # A=2: A <= 8 needs four evens, B <= 3 allows three. No bound rules it out; only a search does.
    counters = [{"name": "chip", "counters": {"a": {"value": "8"}, "b": {"value": "3"}}}]
    devices = [
        {
            "name": f"gpu-{i:02d}",
            "attributes": {"pair": {"int": i // 2}},
            "consumesCounters": [{"counterSet": "chip", "counters": {"a": {"value": "1"}, "b": {"value": "1"}} if i % 2 == 0 else {"a": {"value": "2"}}}],
        }
        for i in range(12)
    ]
    engine = _engine(_slice("node-1", devices, counters=counters))
    claim = msgspec.convert(
        {
            "metadata": {"name": "wide", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 6}}],
                    "constraints": [{"distinctAttribute": "gpu.example.com/pair"}],
                }
            },
        },
        ResourceClaim,
    )
    engine.budget = 20
    (outcome,) = engine.allocate([claim], node="node-1")
    assert outcome.status == "error" and "search budget of 20 steps" in outcome.message
    engine.budget = 1_000_000
    (outcome,) = engine.allocate([claim], node="node-1")
    assert outcome.status == "unsatisfiable"


def test_counters_short_of_room_fail_without_searching():
    # 24 partitions of one counter set that holds 12: 13 cannot fit, known without a search
    counters = [{"name": "chip", "counters": {"units": {"value": "12"}}}]
    devices = [{"name": f"part-{i:02d}", "consumesCounters": [{"counterSet": "chip", "counters": {"units": {"value": "1"}}}]} for i in range(24)]
    engine = _engine(_slice("node-1", devices, counters=counters))
    engine.budget = 50
    (outcome,) = engine.allocate([_claim("wide", count=13)], node="node-1")
    assert outcome.status == "unsatisfiable"
    (outcome,) = engine.allocate([_claim("fits", count=12)], node="node-1")
    assert outcome.status == "allocated"


def test_distinct_attribute_short_of_values_fails_without_searching():
    devices = [{"name": f"gpu-{i:02d}", "attributes": {"numa": {"int": i % 6}}} for i in range(12)]
    engine = _engine(_slice("node-1", devices))
    engine.budget = 50  # far too small to search 12-choose-7 combinations
    claim = msgspec.convert(
        {
            "metadata": {"name": "wide", "namespace": "ns"},
            "spec": {
                "devices": {
                    "requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": 7}}],
                    "constraints": [{"distinctAttribute": "gpu.example.com/numa"}],
                }
            },
        },
        ResourceClaim,
    )
    (outcome,) = engine.allocate([claim], node="node-1")
    assert outcome.status == "unsatisfiable"


def test_explain_on_success_names_the_chosen_devices():
    engine = _engine(_slice("node-1", GPUS))
    (outcome,) = engine.allocate([_claim("a")], node="node-1", explain=True)
    (report,) = outcome.explanation.nodes
    (request,) = report.requests
    assert request.devices == ["gpu.example.com/node-1/gpu-0"]
    assert [f.filter for f in request.filters][:4] == ["pool", "class", "selectors", "node"]
    assert {f.filter: f.left for f in request.filters}["in use"] == 2  # counted before this claim took one


def test_explain_on_failure_names_the_emptying_filter():
    engine = _engine(_slice("node-1", GPUS))
    engine.allocate([_claim("a", count=2)], node="node-1")
    (outcome,) = engine.allocate([_claim("b")], node="node-1", explain=True)
    (request,) = outcome.explanation.nodes[0].requests
    assert request.emptied_by == "in use"
    assert {f.filter: f.left for f in request.filters}["node"] == 2


def test_cel_length_limit_is_an_error_naming_the_limit():
    engine = _engine(_slice("node-1", GPUS))
    long = " || ".join(['device.driver == "x"'] * 600)  # over 10 KiB
    (outcome,) = engine.allocate([_claim("a", selectors=[{"cel": {"expression": long}}])])
    assert outcome.status == "error" and "too long" in outcome.message and "10240" in outcome.message


def test_explain_counts_every_usable_device_before_the_node_filter():
    engine = _engine(_slice("node-1", GPUS), _slice("node-2", GPUS))
    (outcome,) = engine.allocate([_claim("a", count=3)], node="node-1", explain=True)
    (request,) = outcome.explanation.nodes[0].requests
    counts = {f.filter: f.left for f in request.filters}
    assert (counts["pool"], counts["class"], counts["selectors"], counts["node"]) == (4, 4, 4, 2)
    assert request.emptied_by == "node"


def test_a_claim_listed_twice_gets_one_allocation():
    engine = _engine(_slice("node-1", GPUS))
    first, again = engine.allocate([_claim("a"), _claim("a")], node="node-1")
    assert first.status == again.status == "allocated" and again.allocation == first.allocation
    (b,) = engine.allocate([_claim("b")], node="node-1")
    assert _devices(b) == ["gpu-1"]
    engine.release("ns/a")
    engine.release("ns/b")
    one, twice = engine.allocate([_claim("c"), _claim("c")], node="node-1", together=True)
    assert one.status == "allocated" and twice.status == "error" and "listed twice" in twice.message


def test_hostile_quantities_are_errors_not_tracebacks():
    engine = _engine()
    problems = engine.apply(_slice("node-1", [{"name": "gpu-0", "capacity": {"memory": {"value": "lots"}}}]))
    assert problems and "invalid quantity 'lots'" in problems[0]
    engine.apply(_slice("node-1", GPUS))
    (outcome,) = engine.allocate([_claim("a", capacity={"requests": {"memory": "12Zi"}})])
    assert outcome.status == "error" and "capacity" in outcome.message and "12Zi" in outcome.message
    (outcome,) = engine.allocate([_claim("b", count=10**9)])
    assert outcome.status == "error" and "exceeds the claim limit of 32" in outcome.message
