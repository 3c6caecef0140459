"""Property tests over random small fleets and claims (hypothesis).

For every generated inventory and claim sequence:
- every allocation is valid (independent oracle: no device given twice unless
  admin access or shared within capacity, counters and capacity within
  bounds, constraints hold, taints tolerated, devices reachable);
- every chosen device satisfies its class and its request's selectors;
- a claim reported unsatisfiable has no valid assignment (brute force);
- releasing every claim returns the ledger exactly to its initial state.
"""

from __future__ import annotations

import itertools
import sys
from pathlib import Path
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "conformance"))
from allocation_validity import check

from dralloc.allocator.engine import Engine
from dralloc.schemas.resource import (
    AllocationResult,
    DeviceAllocationResult,
    DeviceClass,
    DeviceRequestAllocationResult,
    Node,
    ResourceClaim,
    ResourceClaimStatus,
    ResourceSlice,
)

DRIVER = "gpu.example.com"
MODELS = ["a", "b"]


@st.composite
def fleets(draw: Any) -> dict:
    devices = []
    for i in range(draw(st.integers(1, 6))):
        devices.append(
            {
                "name": f"dev-{i}",
                "model": draw(st.sampled_from(MODELS)),
                "numa": draw(st.integers(0, 1)),
                "node": draw(st.sampled_from(["node-1", "node-1", "node-2", "all"])),
                "taint": draw(st.sampled_from([None, None, "NoSchedule", "NoExecute", "None"])),
                "counter": draw(st.sampled_from([None, None, 1, 2])),
                "shared": draw(st.booleans()) and i % 3 == 0,
            }
        )
    return {"devices": devices, "counter_total": draw(st.integers(1, 3))}


@st.composite
def claim_specs(draw: Any) -> list[dict]:
    claims = []
    for c in range(draw(st.integers(1, 4))):
        requests = []
        for r in range(draw(st.integers(1, 2))):
            requests.append(
                {
                    "name": f"r{r}",
                    "count": draw(st.integers(1, 2)),
                    "model": draw(st.sampled_from([None, *MODELS])),
                    "tolerate": draw(st.booleans()),
                    "admin": draw(st.integers(0, 5)) == 0,
                    "memory": draw(st.sampled_from([None, 10, 30])),
                }
            )
        constraint = draw(st.sampled_from([None, "match", "distinct"]))
        claims.append({"name": f"c{c}", "requests": requests, "constraint": constraint})
    return claims


def build(fleet: dict) -> list:
    objects: list = [
        msgspec.convert({"apiVersion": "v1", "kind": "Node", "metadata": {"name": n, "labels": {"kubernetes.io/hostname": n}}}, Node)
        for n in ("node-1", "node-2")
    ]
    objects.append(
        msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass)
    )
    groups: dict[str, list[dict]] = {}
    for d in fleet["devices"]:
        groups.setdefault(d["node"], []).append(d)
    for where, devs in sorted(groups.items()):
        spec: dict = {"driver": DRIVER, "pool": {"name": f"pool-{where}", "generation": 1, "resourceSliceCount": 1}}
        if where == "all":
            spec["allNodes"] = True
        else:
            spec["nodeName"] = where
        spec["sharedCounters"] = [{"name": "chip", "counters": {"units": {"value": str(fleet["counter_total"])}}}]
        spec["devices"] = []
        for d in devs:
            device: dict = {
                "name": d["name"],
                "attributes": {"model": {"string": d["model"]}, "numa": {"int": d["numa"]}},
                "capacity": {"memory": {"value": "40Gi"}},
            }
            if d["taint"]:
                device["taints"] = [{"key": "example.com/t", "effect": d["taint"]}]
            if d["counter"]:
                device["consumesCounters"] = [{"counterSet": "chip", "counters": {"units": {"value": str(d["counter"])}}}]
            if d["shared"]:
                device["allowMultipleAllocations"] = True
            spec["devices"].append(device)
        objects.append(msgspec.convert({"metadata": {"name": f"slice-{where}"}, "spec": spec}, ResourceSlice))
    return objects


def claim_object(spec: dict) -> ResourceClaim:
    requests = []
    for r in spec["requests"]:
        exactly: dict = {"deviceClassName": "gpu", "count": r["count"]}
        if r["model"]:
            exactly["selectors"] = [{"cel": {"expression": f'device.attributes["{DRIVER}"].model == "{r["model"]}"'}}]
        if r["tolerate"]:
            exactly["tolerations"] = [{"operator": "Exists"}]
        if r["admin"]:
            exactly["adminAccess"] = True
        if r["memory"]:
            exactly["capacity"] = {"requests": {"memory": f"{r['memory']}Gi"}}
        requests.append({"name": r["name"], "exactly": exactly})
    devices: dict = {"requests": requests}
    if spec["constraint"]:
        devices["constraints"] = [{f"{spec['constraint']}Attribute": f"{DRIVER}/numa"}]
    return msgspec.convert({"metadata": {"name": spec["name"], "namespace": "default"}, "spec": {"devices": devices}}, ResourceClaim)


def _eligible(fleet: dict, request: dict, node: str) -> list[dict]:
    """Devices a request may take on `node` by class, selector and reachability (not use)."""
    return [d for d in fleet["devices"] if d["node"] in (node, "all") and (request["model"] is None or d["model"] == request["model"])]


def _brute_force(fleet: dict, objects: list, spec: dict, node: str) -> bool:
    """Whether some assignment of devices to the claim's requests is valid."""
    claim = claim_object(spec)
    options = []
    for r in spec["requests"]:
        # a device serves one request at most once, shared or not
        options.append([(r, c) for c in itertools.combinations(_eligible(fleet, r, node), r["count"])])
    pool_of = {d["name"]: f"pool-{d['node']}" for d in fleet["devices"]}
    for choice in itertools.product(*options):
        results = []
        for r, combo in choice:
            for d in combo:
                result = DeviceRequestAllocationResult(
                    request=r["name"], driver=DRIVER, pool=pool_of[d["name"]], device=d["name"], admin_access=True if r["admin"] else None
                )
                if r["tolerate"]:
                    result.tolerations = claim.spec.devices.requests[int(r["name"][1:])].exactly.tolerations
                if d["shared"]:
                    result.consumed_capacity = {"memory": f"{r['memory'] or 40}Gi"}
                results.append(result)
        allocation = AllocationResult(devices=DeviceAllocationResult(results=results))
        if not check([*objects, claim], {claim.key: allocation}, node):
            return True
    return False


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(fleet=fleets(), specs=claim_specs())
def test_random_fleets_and_claims(fleet: dict, specs: list[dict]):
    objects = build(fleet)
    engine = Engine(scoring=False)
    for obj in objects:
        assert engine.apply(obj) == []
    initial = _ledger_state(engine)
    done: list[ResourceClaim] = []  # allocated claims, with status, as existing allocations
    for spec in specs:
        claim = claim_object(spec)
        (outcome,) = engine.allocate([claim], node="node-1")
        assert outcome.status != "error", outcome.message
        context = [*objects, *done]
        if outcome.status == "allocated":
            problems = check([*context, claim], {claim.key: outcome.allocation}, "node-1")
            assert problems == [], problems
            by_name = {d["name"]: d for d in fleet["devices"]}
            for result in outcome.allocation.devices.results:
                request = next(r for r in spec["requests"] if r["name"] == result.request)
                device = by_name[result.device]
                assert request["model"] is None or device["model"] == request["model"]
            claim.status = ResourceClaimStatus(allocation=outcome.allocation)
            done.append(claim)
        else:
            assert not _brute_force(fleet, context, spec, "node-1"), f"engine said unsatisfiable, but a valid assignment exists: {spec}"
    # releasing everything returns the inventory to its initial state
    for claim in done:
        assert engine.release(claim.key)
    assert _ledger_state(engine) == initial


@settings(max_examples=150, deadline=None)
@given(fleet=fleets(), specs=claim_specs())
def test_together_is_all_or_nothing_and_valid(fleet: dict, specs: list[dict]):
    objects = build(fleet)
    engine = Engine(scoring=False)
    for obj in objects:
        engine.apply(obj)
    claims = [claim_object(s) for s in specs]
    outcomes = engine.allocate(claims, node="node-1", together=True)
    statuses = {o.status for o in outcomes}
    assert len(statuses) == 1
    if statuses == {"allocated"}:
        assert check([*objects, *claims], {o.claim: o.allocation for o in outcomes}, "node-1") == []
        # the same input gives the same answer
        again = Engine(scoring=False)
        for obj in objects:
            again.apply(obj)
        assert [msgspec.to_builtins(o.allocation) for o in again.allocate(claims, node="node-1", together=True)] == [
            msgspec.to_builtins(o.allocation) for o in outcomes
        ]


def _ledger_state(engine: Engine) -> tuple:
    ledger = engine.ledger
    return (
        ledger.used_bits,
        dict(ledger.counter_used),
        {k: dict(v) for k, v in ledger.cap_used.items()},
        dict(ledger.free_local),
        list(ledger.free_ge),
        dict(ledger.exclusive),
        dict(ledger.shares),
    )
