"""A claim that arrives with `status.allocation` is adopted only when it conflicts with nothing held:
another claim's device (any namespace), share id, a shared device's capacity, a partition's
counters. Otherwise it fails with an error naming the holder and holds nothing. The engine
(`Engine.adopt`) and the book (`Decisions`); tests/fault/test_adoption_process.py runs a real
allocator process."""

from __future__ import annotations

import uuid
from pathlib import Path

import msgspec

from dralloc.allocator.decisions import Adopt, Allocate, Decisions
from dralloc.allocator.engine import Engine
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.resource import AllocationResult, DeviceClass, Node, ResourceClaim, ResourceClaimStatus, ResourceSlice

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"


def _slice(devices: list[dict], counters: list | None = None) -> ResourceSlice:
    spec = {"driver": "gpu.example.com", "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": devices}
    if counters:
        spec["sharedCounters"] = counters
    return msgspec.convert({"metadata": {"name": "node-1-gpus"}, "spec": spec}, ResourceSlice)


def _engine(devices: list[dict], counters: list | None = None) -> Engine:
    engine = Engine(scoring=False)
    engine.apply(msgspec.convert({"metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}}}, Node))
    engine.apply(
        msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}, DeviceClass)
    )
    assert engine.apply(_slice(devices, counters)) == []
    return engine


def _claim(name: str, namespace: str = "ns", results: list[dict] | None = None, **exactly) -> ResourceClaim:
    doc: dict = {
        "metadata": {"name": name, "namespace": namespace, "uid": f"uid-{namespace}-{name}"},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", **exactly}}]}},
    }
    if results is not None:
        doc["status"] = {"allocation": {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-1", **r} for r in results]}}}
    return msgspec.convert(doc, ResourceClaim)


def _state(engine: Engine) -> tuple:
    ledger = engine.ledger
    return (
        dict(ledger.exclusive),
        {k: dict(v) for k, v in ledger.shares.items()},
        ledger.used_bits,
        dict(ledger.counter_used),
        {k: dict(v) for k, v in ledger.cap_used.items()},
    )


def test_another_claims_device_in_any_namespace_is_not_adopted_and_nothing_is_held():
    engine = _engine([{"name": "gpu-0"}, {"name": "gpu-1"}])
    (a,) = engine.allocate([_claim("a")], node="node-1")
    assert [r.device for r in a.allocation.devices.results] == ["gpu-0"]
    before = _state(engine)
    thief = _claim("thief", namespace="other", results=[{"device": "gpu-1"}, {"device": "gpu-0"}])
    conflicts = engine.adopt(thief)
    assert conflicts == ["claim other/thief: device gpu.example.com/node-1/gpu-0 is already allocated to claim ns/a; not counted twice"]
    assert _state(engine) == before and "other/thief" not in engine.ledger.claims  # gpu-1 is not held either
    assert engine.adopt(_claim("fine", results=[{"device": "gpu-1"}])) == []
    assert engine.ledger.exclusive[("gpu.example.com", "node-1", "gpu-1")] == "ns/fine"


def test_a_device_listed_twice_or_a_share_on_an_exclusive_device_is_refused():
    engine = _engine([{"name": "gpu-0"}, {"name": "gpu-1"}])
    assert engine.adopt(_claim("twice", results=[{"device": "gpu-0"}, {"device": "gpu-0"}])) == ["device gpu.example.com/node-1/gpu-0 is listed twice"]
    engine.allocate([_claim("a")], node="node-1")
    before = _state(engine)
    conflicts = engine.adopt(_claim("sharer", results=[{"device": "gpu-0", "shareID": "s-1"}]))
    assert conflicts == ["device gpu.example.com/node-1/gpu-0 is allocated to claim ns/a"]
    assert _state(engine) == before


def test_capacity_and_share_ids_of_a_shared_device_are_respected():
    shared = [{"name": "vgpu", "allowMultipleAllocations": True, "capacity": {"memory": {"value": "80Gi"}}}]
    engine = _engine(shared)
    (a,) = engine.allocate([_claim("a", capacity={"requests": {"memory": "50Gi"}})], node="node-1")
    share = a.allocation.devices.results[0].share_id
    before = _state(engine)
    too_much = _claim("big", namespace="other", results=[{"device": "vgpu", "shareID": "s-2", "consumedCapacity": {"memory": "40Gi"}}])
    (conflict,) = engine.adopt(too_much)
    assert conflict.startswith("device gpu.example.com/node-1/vgpu: capacity gpu.example.com/memory has ")
    assert conflict.endswith("(shared with claim ns/a)")
    assert _state(engine) == before
    same_share = _claim("same", namespace="other", results=[{"device": "vgpu", "shareID": share, "consumedCapacity": {"memory": "1Gi"}}])
    assert engine.adopt(same_share) == [f"share {share} of device gpu.example.com/node-1/vgpu belongs to claim ns/a"]
    assert _state(engine) == before  # ns/a's share is still there
    fits = _claim("fits", namespace="other", results=[{"device": "vgpu", "shareID": "s-3", "consumedCapacity": {"memory": "30Gi"}}])
    assert engine.adopt(fits) == []


def test_counters_a_partitions_siblings_use_are_respected():
    counters = [{"name": "chip", "counters": {"slices": {"value": "2"}}}]
    devices = [{"name": f"part-{i}", "consumesCounters": [{"counterSet": "chip", "counters": {"slices": {"value": "1"}}}]} for i in range(3)]
    engine = _engine(devices, counters)
    engine.allocate([_claim("a"), _claim("b")], node="node-1")  # part-0, part-1: the chip is full
    before = _state(engine)
    (conflict,) = engine.adopt(_claim("c", namespace="other", results=[{"device": "part-2"}]))
    assert conflict == "device gpu.example.com/node-1/part-2: counter chip/slices of pool gpu.example.com/node-1 is used up by claim ns/a, ns/b"
    assert _state(engine) == before
    engine.release("ns/b")
    assert engine.adopt(_claim("c", namespace="other", results=[{"device": "part-2"}])) == []


def test_a_device_not_in_the_inventory_is_adopted_and_then_held():
    engine = _engine([{"name": "gpu-0"}])
    assert engine.adopt(_claim("early", results=[{"device": "gpu-9"}])) == []
    engine.apply(_slice([{"name": "gpu-0"}, {"name": "gpu-9"}]))  # its slice arrives later
    (b,) = engine.allocate([_claim("b", count=2)], node="node-1")
    assert b.status == "unsatisfiable"  # gpu-9 is not given out a second time


def _book() -> Decisions:
    book = Decisions(max_gang=8)
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        book.apply_inventory(event)
    for _, slices in build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": "n"}]):
        for s in slices:
            book.apply_inventory(ev.ResourceSlicePublished(slice=s))
    return book


def gpu_claim(name: str, gpus: int) -> ResourceClaim:
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "bench", "uid": str(uuid.uuid4())},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
        },
        ResourceClaim,
    )


def _allocated_as(claim: ResourceClaim, allocation: AllocationResult | None, name: str, namespace: str) -> ResourceClaim:
    meta = msgspec.structs.replace(claim.metadata, name=name, namespace=namespace, uid=f"uid-{name}")
    return msgspec.structs.replace(claim, metadata=meta, status=ResourceClaimStatus(allocation=allocation))


def test_the_book_fails_a_conflicting_allocation_naming_the_holder_and_writes_it_once():
    book = _book()
    first = gpu_claim("a", 2)
    assert book.submitted(first) == Allocate(first)
    _, commit = book.allocate(first)
    assert commit is not None
    book.commit_written(commit)
    thief = _allocated_as(first, commit.allocation, "thief", "team-b")
    failure = book.submitted(thief)
    assert isinstance(failure, ev.AllocationFailed) and failure.reason == "error" and failure.key == "team-b/thief"
    assert failure.message.startswith("status.allocation not adopted, it conflicts with allocations held: claim team-b/thief: device gpu.nvidia.com/")
    assert "is already allocated to claim bench/a" in failure.message
    assert set(book.engine.ledger.claims) == {"bench/a"} and "team-b/thief" not in book.committed
    book.failure_sent(failure)
    assert book.submitted(thief) is None  # the same failure is not written twice in a term
    # A free device written by hand is adopted: consistent with everything held.
    _, other = book.allocate(gpu_claim("b", 1))
    assert other is not None
    book.commit_not_written("bench/b")  # nothing holds it now
    step = book.submitted(_allocated_as(first, other.allocation, "by-hand", "team-b"))
    assert isinstance(step, Adopt) and set(book.engine.ledger.claims) == {"bench/a", "team-b/by-hand"}
