"""The Kubernetes status sink against the emulated API server, through the real client."""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest
from kube_emulator import ApiServer
from kubernetes_asyncio.client import ApiClient

from dralloc.bus import Permanent
from dralloc.schemas import events as ev
from dralloc.schemas.allocation import GATED_RESULT_FIELDS
from dralloc.schemas.resource import DeviceRequestAllocationResult, ResourceClaim
from dralloc.statuswriter.kubernetes import KubernetesSink, Outcome, Result

ALLOCATION = {
    "devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0"}]},
    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]},
}


def claim(name: str = "c", namespace: str = "default", **meta: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, **meta},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    }


def committed(stored: dict[str, Any], allocation: dict[str, Any] = ALLOCATION) -> ev.AllocationCommitted:
    obj = copy.deepcopy(stored)
    obj["status"] = {"allocation": allocation}
    return ev.AllocationCommitted(claim=msgspec.convert(obj, ResourceClaim), node="node-0")


def released(stored: dict[str, Any]) -> ev.AllocationReleased:
    meta = stored["metadata"]
    return ev.AllocationReleased(namespace=meta["namespace"], name=meta["name"], uid=meta["uid"])


@pytest.fixture
def results() -> list[Result]:
    return []


@pytest.fixture
async def sink(api: ApiClient, results: list[Result]) -> KubernetesSink:
    return KubernetesSink(api=api, report=results.append)


def status_writes(apiserver: ApiServer) -> int:
    return sum(1 for verb, sub, _ in apiserver.writes if sub == "status")


async def test_commit_writes_allocation_and_consumer(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    pod_ref = {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "pod-uid-1", "controller": True, "blockOwnerDeletion": True}
    stored = apiserver.apply(claim(ownerReferences=[pod_ref]))
    await sink.committed(committed(stored))
    status = apiserver.read("resourceclaims", "default", "c")["status"]
    assert status["allocation"] == ALLOCATION
    assert status["reservedFor"] == [{"resource": "pods", "name": "trainer", "uid": "pod-uid-1"}]
    assert results[-1].outcome is Outcome.WRITTEN
    # Redelivered: nothing written again.
    await sink.committed(committed(stored))
    assert results[-1].outcome is Outcome.UNCHANGED and status_writes(apiserver) == 1


async def test_claim_without_consumer_gets_no_reserved_for(apiserver: ApiServer, sink: KubernetesSink) -> None:
    stored = apiserver.apply(claim())
    await sink.committed(committed(stored))
    status = apiserver.read("resourceclaims", "default", "c")["status"]
    assert status["allocation"] == ALLOCATION and "reservedFor" not in status


async def test_conflicting_write_is_read_again_and_retried(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    stored = apiserver.apply(claim())
    changed = []

    def someone_else_writes_first(request: Any) -> None:
        if not changed:  # between the sink's read and its patch, another client changes the claim
            changed.append(request)
            apiserver.apply({**apiserver.read("resourceclaims", "default", "c"), "metadata": {"name": "c", "namespace": "default", "labels": {"x": "y"}}})

    patches = apiserver["patch", apiserver.resource("resource.k8s.io", "v1", "resourceclaims")]
    patches >> someone_else_writes_first
    await sink.committed(committed(stored))
    # The first (the finalizer, added before the status as kube-scheduler does) got 409 Conflict from
    # the server; read again, it went through, then the status.
    assert len(patches) == 3
    assert status_writes(apiserver) == 1
    final = apiserver.read("resourceclaims", "default", "c")
    assert final["status"]["allocation"] == ALLOCATION and final["metadata"]["labels"] == {"x": "y"}
    assert results[-1].outcome is Outcome.WRITTEN


async def test_allocation_from_elsewhere_is_never_overwritten(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    theirs = copy.deepcopy(ALLOCATION)
    theirs["devices"]["results"][0]["device"] = "gpu-7"
    stored = apiserver.apply({**claim(), "status": {"allocation": theirs}})
    await sink.committed(committed(stored))
    assert results[-1].outcome is Outcome.KEPT_FOREIGN and "gpu-7" in results[-1].message
    assert apiserver.read("resourceclaims", "default", "c")["status"]["allocation"] == theirs
    assert status_writes(apiserver) == 0
    # Nor cleared when dralloc releases its (never written) allocation of that claim.
    await sink.released(released(stored))
    assert results[-1].outcome is Outcome.KEPT_FOREIGN
    assert apiserver.read("resourceclaims", "default", "c")["status"]["allocation"] == theirs
    assert status_writes(apiserver) == 0


async def test_release_clears_only_dralloc_allocation(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    stored = apiserver.apply(claim(ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}]))
    await sink.committed(committed(stored))
    await sink.released(released(stored))
    assert results[-1].outcome is Outcome.CLEARED
    assert not apiserver.read("resourceclaims", "default", "c").get("status")
    await sink.released(released(stored))
    assert results[-1].outcome is Outcome.UNCHANGED


async def test_release_keeps_an_allocation_that_is_not_the_one_written(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    stored = apiserver.apply(claim())
    await sink.committed(committed(stored))
    # Someone else cleared it and allocated other devices in the meantime.
    other = copy.deepcopy(ALLOCATION)
    other["devices"]["results"][0]["device"] = "gpu-3"
    current = apiserver.read("resourceclaims", "default", "c")
    apiserver.apply({**current, "status": {}})
    apiserver.apply({**apiserver.read("resourceclaims", "default", "c"), "status": {"allocation": other}})
    await sink.released(released(stored))
    assert results[-1].outcome is Outcome.KEPT_FOREIGN
    assert apiserver.read("resourceclaims", "default", "c")["status"]["allocation"] == other


async def test_gone_or_recreated_claims_are_left_alone(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    stored = apiserver.apply(claim())
    apiserver.remove("resourceclaims", "default", "c")
    await sink.committed(committed(stored))
    assert results[-1].outcome is Outcome.GONE
    await sink.released(released(stored))
    assert results[-1].outcome is Outcome.GONE
    apiserver.apply(claim())  # same name, new uid
    await sink.committed(committed(stored))
    assert results[-1].outcome is Outcome.GONE
    assert not apiserver.read("resourceclaims", "default", "c").get("status")


async def test_refused_write_is_permanent_and_server_errors_are_retried(apiserver: ApiServer, sink: KubernetesSink) -> None:
    stored = apiserver.apply(claim())
    reaction = apiserver["patch", apiserver.resource("resource.k8s.io", "v1", "resourceclaims")]
    reaction << 403
    with pytest.raises(Permanent, match="403"):
        await sink.committed(committed(stored))


async def test_server_errors_are_not_permanent(apiserver: ApiServer, sink: KubernetesSink) -> None:
    stored = apiserver.apply(claim())
    apiserver["get", apiserver.resource("resource.k8s.io", "v1", "resourceclaims")] << 503
    with pytest.raises(Exception) as exc:
        await sink.committed(committed(stored))
    assert not isinstance(exc.value, Permanent)


async def test_a_restarted_writer_clears_only_the_allocation_the_allocator_released(
    apiserver: ApiServer, api: ApiClient, sink: KubernetesSink, results: list[Result]
) -> None:
    """A decision lost to kube-scheduler is released by the allocator; the writer that saw the loss may
    have restarted since (what it wrote, forgotten): the release names its allocation, so the
    cluster's own is kept."""
    theirs = copy.deepcopy(ALLOCATION)
    theirs["devices"]["results"][0]["device"] = "gpu-7"
    stored = apiserver.apply({**claim(), "status": {"allocation": theirs}})
    fresh = KubernetesSink(api=api, report=results.append)  # knows nothing of earlier writes
    release = msgspec.structs.replace(released(stored), allocation=committed(stored).allocation)
    await fresh.released(release)
    assert results[-1].outcome is Outcome.KEPT_FOREIGN
    assert apiserver.read("resourceclaims", "default", "c")["status"]["allocation"] == theirs
    # The allocation it names is cleared.
    await fresh.released(msgspec.structs.replace(released(stored), allocation=committed(stored, theirs).allocation))
    assert results[-1].outcome is Outcome.CLEARED
    assert "allocation" not in (apiserver.read("resourceclaims", "default", "c").get("status") or {})


async def test_fields_a_server_drops_leave_the_allocation_dralloc_s(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    """With binding conditions and consumable capacity off in the API server (a slice written while
    they were on keeps its fields), the server drops them from the allocation dralloc writes: that
    allocation is still dralloc's, so a redelivery changes nothing and the release clears it."""
    apiserver.disabled_gates |= {"DRADeviceBindingConditions", "DRAConsumableCapacity"}
    ours = copy.deepcopy(ALLOCATION)
    ours["devices"]["results"][0].update(
        bindingConditions=["attached"], bindingFailureConditions=["failed"], shareID="0b1c2d3e-0000-4000-8000-000000000000", consumedCapacity={"memory": "8Gi"}
    )
    stored = apiserver.apply(claim(ownerReferences=[{"apiVersion": "v1", "kind": "Pod", "name": "p", "uid": "u", "controller": True}]))
    await sink.committed(committed(stored, ours))
    assert results[-1].outcome is Outcome.WRITTEN
    assert apiserver.read("resourceclaims", "default", "c")["status"]["allocation"] == ALLOCATION  # the gated fields dropped
    await sink.committed(committed(stored, ours))  # redelivered
    assert results[-1].outcome is Outcome.UNCHANGED
    await sink.released(released(stored))  # what this writer wrote, recognised
    assert results[-1].outcome is Outcome.CLEARED
    assert "allocation" not in (apiserver.read("resourceclaims", "default", "c").get("status") or {})
    # A restarted writer, told which allocation is released, recognises it too.
    stored = apiserver.read("resourceclaims", "default", "c")
    await sink.committed(committed(stored, ours))
    fresh = KubernetesSink(api=sink._api, report=results.append)
    await fresh.released(msgspec.structs.replace(released(stored), allocation=committed(stored, ours).allocation))
    assert results[-1].outcome is Outcome.CLEARED


async def test_a_server_with_the_gates_on_keeps_the_fields(apiserver: ApiServer, sink: KubernetesSink, results: list[Result]) -> None:
    # (the emulator's gates: on unless switched off, so the test above is about the drop)
    ours = copy.deepcopy(ALLOCATION)
    ours["devices"]["results"][0].update(bindingConditions=["attached"])
    stored = apiserver.apply(claim())
    await sink.committed(committed(stored, ours))
    assert apiserver.read("resourceclaims", "default", "c")["status"]["allocation"] == ours


def test_the_emulator_drops_the_fields_dralloc_counts_as_dropped() -> None:
    """The emulator's gates (written from the API server's strategy) and the contract's list
    (`dralloc.schemas.allocation`) name the same result fields: one drifting from the other would
    leave a trimmed write untested, or a difference excused."""
    wire = {f.name: f.encode_name for f in msgspec.structs.fields(DeviceRequestAllocationResult)}
    dropped = {name for names in ApiServer.GATED_RESULT_FIELDS.values() for name in names}
    assert dropped == {wire[name] for name in GATED_RESULT_FIELDS}
