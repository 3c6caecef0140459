"""The emulator behaves like an API server where dralloc relies on it (real client, real HTTP)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from kube_emulator import ApiServer
from kubernetes_asyncio.client import ApiClient, ApiException, ResourceV1Api


def claim(name: str, namespace: str = "default", **extra: Any) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": namespace, **extra},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    }


ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0"}]}}


async def read_events(api: ApiClient, count: int, **params: Any) -> list[dict[str, Any]]:
    """`count` watch events, raw, through the generated client (as the ingestor reads them)."""
    resp = await ResourceV1Api(api).list_resource_claim_for_all_namespaces(watch=True, _preload_content=False, **params)
    events = []
    try:
        async with asyncio.timeout(5):
            while len(events) < count:
                line = await resp.content.readline()
                if not line:
                    break
                events.append(json.loads(line))
    finally:
        resp.release()
    return events


async def test_create_stamps_metadata_and_bumps_resource_version(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    a = await v1.create_namespaced_resource_claim("default", claim("a"))
    b = await v1.create_namespaced_resource_claim("default", claim("b"))
    assert a.metadata.uid and a.metadata.uid != b.metadata.uid
    assert int(b.metadata.resource_version) > int(a.metadata.resource_version)
    assert a.metadata.generation == 1
    listed = await v1.list_resource_claim_for_all_namespaces()
    assert [c.metadata.name for c in listed.items] == ["a", "b"]
    assert listed.metadata.resource_version == b.metadata.resource_version
    with pytest.raises(ApiException) as exc:
        await v1.create_namespaced_resource_claim("default", claim("a"))
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "AlreadyExists"


async def test_generate_name_and_not_found(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    made = await v1.create_namespaced_resource_claim("ns1", claim("", "ns1", generateName="pod-gpu-"))
    assert made.metadata.name.startswith("pod-gpu-") and len(made.metadata.name) > len("pod-gpu-")
    with pytest.raises(ApiException) as exc:
        await v1.read_namespaced_resource_claim("nope", "ns1")
    assert exc.value.status == 404


async def test_watch_from_resource_version_replays_only_later_events(api: ApiClient, apiserver: ApiServer) -> None:
    v1 = ResourceV1Api(api)
    await v1.create_namespaced_resource_claim("default", claim("early"))
    listed = await v1.list_resource_claim_for_all_namespaces()
    await v1.create_namespaced_resource_claim("default", claim("late"))
    await v1.delete_namespaced_resource_claim("early", "default")
    events = await read_events(api, 2, resource_version=listed.metadata.resource_version)
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "late"), ("DELETED", "early")]


async def test_watch_without_version_starts_with_current_state_then_goes_live(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    await v1.create_namespaced_resource_claim("default", claim("one"))
    reader = asyncio.create_task(read_events(api, 2))
    await asyncio.sleep(0.05)
    await v1.create_namespaced_resource_claim("default", claim("two"))
    events = await reader
    assert [(e["type"], e["object"]["metadata"]["name"]) for e in events] == [("ADDED", "one"), ("ADDED", "two")]


async def test_bookmarks_carry_the_current_resource_version(api: ApiClient, apiserver: ApiServer) -> None:
    apiserver.bookmark_interval = 0.02
    created = await ResourceV1Api(api).create_namespaced_resource_claim("default", claim("a"))
    events = await read_events(api, 1, resource_version=created.metadata.resource_version, allow_watch_bookmarks=True)
    assert events[0]["type"] == "BOOKMARK"
    assert events[0]["object"]["metadata"]["resourceVersion"] == created.metadata.resource_version
    # Without allowWatchBookmarks, no bookmark comes: the server-side timeout ends the stream empty.
    apiserver.max_watch_seconds = 0.2
    assert await read_events(api, 1, resource_version=created.metadata.resource_version, timeout_seconds=1) == []


async def test_compacted_resource_version_is_410_gone(api: ApiClient, apiserver: ApiServer) -> None:
    old = await ResourceV1Api(api).create_namespaced_resource_claim("default", claim("a"))
    await ResourceV1Api(api).create_namespaced_resource_claim("default", claim("b"))
    apiserver.compact()
    events = await read_events(api, 1, resource_version=old.metadata.resource_version)
    assert events[0]["type"] == "ERROR"
    assert events[0]["object"]["code"] == 410 and events[0]["object"]["reason"] == "Expired"


async def test_history_window_expires_old_versions(api: ApiClient, apiserver: ApiServer) -> None:
    apiserver.history = 2
    v1 = ResourceV1Api(api)
    first = await v1.create_namespaced_resource_claim("default", claim("a"))
    for name in "bcd":
        await v1.create_namespaced_resource_claim("default", claim(name))
    events = await read_events(api, 1, resource_version=first.metadata.resource_version)
    assert events[0]["type"] == "ERROR" and events[0]["object"]["code"] == 410


async def test_status_patch_with_stale_resource_version_is_409(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    made = await v1.create_namespaced_resource_claim("default", claim("a"))
    await v1.patch_namespaced_resource_claim("a", "default", {"metadata": {"labels": {"x": "y"}}}, _content_type="application/merge-patch+json")
    stale = {"metadata": {"resourceVersion": made.metadata.resource_version}, "status": {"allocation": ALLOCATION}}
    with pytest.raises(ApiException) as exc:
        await v1.patch_namespaced_resource_claim_status("a", "default", stale, _content_type="application/merge-patch+json")
    assert exc.value.status == 409 and json.loads(exc.value.body)["reason"] == "Conflict"
    fresh = await v1.read_namespaced_resource_claim("a", "default")
    stale["metadata"]["resourceVersion"] = fresh.metadata.resource_version
    done = await v1.patch_namespaced_resource_claim_status("a", "default", stale, _content_type="application/merge-patch+json")
    assert done.status.allocation.devices.results[0].device == "gpu-0"


async def test_status_subresource_isolates_status_from_spec(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    await v1.create_namespaced_resource_claim("default", {**claim("a"), "status": {"allocation": ALLOCATION}})
    created = await v1.read_namespaced_resource_claim("a", "default")
    assert created.status is None or created.status.allocation is None  # create drops status
    # A main-resource patch cannot write status; a status patch cannot change metadata labels.
    await v1.patch_namespaced_resource_claim("a", "default", {"status": {"allocation": ALLOCATION}}, _content_type="application/merge-patch+json")
    assert (await v1.read_namespaced_resource_claim("a", "default")).status is None
    await v1.patch_namespaced_resource_claim_status(
        "a", "default", {"metadata": {"labels": {"x": "y"}}, "status": {"allocation": ALLOCATION}}, _content_type="application/merge-patch+json"
    )
    after = await v1.read_namespaced_resource_claim("a", "default")
    assert after.status.allocation.devices.results[0].pool == "node-0" and not after.metadata.labels


async def test_allocation_cannot_be_replaced_and_reserved_for_needs_allocation(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    await v1.create_namespaced_resource_claim("default", claim("a"))
    bad = {"status": {"reservedFor": [{"resource": "pods", "name": "p", "uid": "u"}]}}
    with pytest.raises(ApiException) as exc:
        await v1.patch_namespaced_resource_claim_status("a", "default", bad, _content_type="application/merge-patch+json")
    assert exc.value.status == 422
    await v1.patch_namespaced_resource_claim_status("a", "default", {"status": {"allocation": ALLOCATION}}, _content_type="application/merge-patch+json")
    other = json.loads(json.dumps(ALLOCATION).replace("gpu-0", "gpu-1"))
    with pytest.raises(ApiException) as exc:
        await v1.patch_namespaced_resource_claim_status("a", "default", {"status": {"allocation": other}}, _content_type="application/merge-patch+json")
    assert exc.value.status == 422 and "may not be changed" in json.loads(exc.value.body)["message"]


async def test_json_patch_test_op_and_finalizers(api: ApiClient) -> None:
    v1 = ResourceV1Api(api)
    await v1.create_namespaced_resource_claim("default", claim("a", finalizers=["example.com/hold"]))
    deleted = await v1.delete_namespaced_resource_claim("a", "default")
    assert deleted.metadata.deletion_timestamp  # held by its finalizer
    ops = [{"op": "test", "path": "/metadata/finalizers/0", "value": "example.com/hold"}, {"op": "remove", "path": "/metadata/finalizers"}]
    await v1.patch_namespaced_resource_claim("a", "default", ops)  # a list body: application/json-patch+json
    with pytest.raises(ApiException) as exc:
        await v1.read_namespaced_resource_claim("a", "default")
    assert exc.value.status == 404


async def test_held_watches_wait_and_closed_watches_end(api: ApiClient, apiserver: ApiServer) -> None:
    apiserver.hold_watches()
    reader = asyncio.create_task(read_events(api, 1))
    await ResourceV1Api(api).create_namespaced_resource_claim("default", claim("a"))
    await asyncio.sleep(0.05)
    assert not reader.done() and apiserver.open_watches == 0
    apiserver.release_watches()
    assert [e["type"] for e in await reader] == ["ADDED"]
    reader = asyncio.create_task(read_events(api, 5, resource_version=str(apiserver.resource_version)))
    await asyncio.sleep(0.05)
    apiserver.close_watches()
    assert await reader == []


async def test_a_test_reaction_overrides_the_emulator(api: ApiClient, apiserver: ApiServer) -> None:
    apiserver["patch", apiserver.resource("resource.k8s.io", "v1", "resourceclaims")] << 503
    await ResourceV1Api(api).create_namespaced_resource_claim("default", claim("a"))
    with pytest.raises(ApiException) as exc:
        await ResourceV1Api(api).patch_namespaced_resource_claim_status(
            "a", "default", {"status": {"allocation": ALLOCATION}}, _content_type="application/merge-patch+json"
        )
    assert exc.value.status == 503


def gated_pod(name: str, gates: list[str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "default"},
        "spec": {"containers": [{"name": "main", "image": "busybox"}], "schedulingGates": [{"name": g} for g in gates]},
    }


async def test_scheduling_gates_may_only_be_removed_and_a_gated_pod_is_not_bound(api: ApiClient) -> None:
    from kubernetes_asyncio.client import CoreV1Api

    from dralloc.kube import body_of

    core = CoreV1Api(api)
    await core.create_namespaced_pod("default", gated_pod("p", ["a.example/one"]))
    binding = {"apiVersion": "v1", "kind": "Binding", "metadata": {"name": "p"}, "target": {"kind": "Node", "name": "node-0"}}
    with pytest.raises(ApiException) as refused:
        await body_of(core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False))
    assert refused.value.status == 422 and b"schedulingGates" in refused.value.body
    with pytest.raises(ApiException) as added:
        await core.patch_namespaced_pod(
            "p", "default", {"spec": {"schedulingGates": [{"name": "a.example/one"}, {"name": "b.example/two"}]}}, _content_type="application/merge-patch+json"
        )
    assert added.value.status == 422 and "only deletion is allowed" in added.value.body
    await core.patch_namespaced_pod("p", "default", {"spec": {"schedulingGates": None}}, _content_type="application/merge-patch+json")
    await body_of(core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False))
    assert (await core.read_namespaced_pod("p", "default")).spec.node_name == "node-0"
    with pytest.raises(ApiException) as twice:
        await body_of(core.create_namespaced_pod_binding("p", "default", binding, _preload_content=False))
    assert twice.value.status == 409


async def test_deleting_an_owner_deletes_its_dependents_finalizers_holding_them(apiserver: ApiServer, api: ApiClient) -> None:
    owner = apiserver.apply(gated_pod("owner", []))
    ref = {"apiVersion": "v1", "kind": "Pod", "name": "owner", "uid": owner["metadata"]["uid"], "controller": True}
    apiserver.apply(claim("free", ownerReferences=[ref]))
    apiserver.apply(claim("held", ownerReferences=[ref], finalizers=["example.com/hold"]))
    apiserver.apply(claim("other"))
    apiserver.remove("pods", "default", "owner")
    assert apiserver.read("resourceclaims", "default", "free") is None
    assert apiserver.read("resourceclaims", "default", "held")["metadata"]["deletionTimestamp"]
    assert apiserver.read("resourceclaims", "default", "other") is not None
