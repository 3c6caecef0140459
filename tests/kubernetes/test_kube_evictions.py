"""Moves in a cluster: a large gated Pod that waits gets room by evicting the Pods in its way.

First the emulated API server's eviction subresource alone (policy/v1 Eviction, PodDisruptionBudgets,
as kube-apiserver answers), over the real client. Then the whole path, as test_kube_pods.py runs it:
the real ingestor, allocator (`DRALLOC_ALLOCATOR_MOVES`) and status writer over a real nats-server,
the kube-scheduler stand-in binding what dralloc ungates, and the emulator playing the resourceclaim
controller for deleted Pods: two 4-GPU nodes each hold two 1-GPU Pods, a 4-GPU Pod arrives.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest
from kube_emulator import DISRUPTION_BUDGET, ApiServer
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api
from test_kube_pods import INFRA, NS, Cluster, _verb, claim, granted, node_of, node_slice, render, start_cluster, template

from dralloc.bus import Bus, streamcheck
from dralloc.bus.raw import jetstream
from dralloc.ingestor.podgate import GATE
from dralloc.kube import body_of, user_agent
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceClaim, ResourceClaimConsumerReference
from dralloc.statuswriter import service as statuswriter
from dralloc.statuswriter.evictions import EVICTED, REFUSED
from dralloc.statuswriter.kubernetes import KubernetesSink
from dralloc.statuswriter.sinks import KVSink, read_all

REPLICA_SET = [{"apiVersion": "apps/v1", "kind": "ReplicaSet", "name": "small", "uid": "uid-small-rs", "controller": True}]
"""The controller that makes an evicted Pod again (what the status writer looks for before it evicts)."""


def a_pod(
    name: str,
    *,
    labels: dict[str, str] | None = None,
    phase: str | None = None,
    templates: dict[str, str] | None = None,
    owners: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": NS, "labels": labels or {}, "ownerReferences": owners or []},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": entry, "resourceClaimTemplateName": t} for entry, t in (templates or {}).items()],
        },
    }
    if templates:
        obj["spec"]["schedulingGates"] = [{"name": GATE}]
    if phase:
        obj["status"] = {"phase": phase}
    return obj


def budget(name: str, allowed: int, labels: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"minAvailable": 2, "selector": {"matchLabels": labels}},
        "status": {"observedGeneration": 1, "disruptionsAllowed": allowed, "desiredHealthy": 2, "currentHealthy": 2 + allowed, "expectedPods": 2 + allowed},
    }


ALLOCATION = {"devices": {"results": [{"request": "gpu", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-0"}]}}
"""One GPU of node-0, as a claim's `status.allocation`."""


def allocated_claim(apiserver: ApiServer, name: str, *users: dict[str, Any], finalizers: list[str] | None = None) -> dict[str, Any]:
    """A ResourceClaim `name` stored with `ALLOCATION` and reserved for the Pods `users` (as stored)."""
    metadata: dict[str, Any] = {"name": name, "namespace": NS}
    if finalizers:
        metadata["finalizers"] = finalizers
    refs = [{"resource": "pods", "name": p["metadata"]["name"], "uid": p["metadata"]["uid"]} for p in users]
    return apiserver.apply(
        {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": metadata,
            "spec": {"devices": {"requests": []}},
            "status": {"allocation": ALLOCATION, "reservedFor": refs},
        }
    )


async def evict(api: ApiClient, name: str, *, uid: str = "", kind: str = "Eviction") -> int:
    """POST pods/{name}/eviction; the status code (an error's too)."""
    body = {"apiVersion": "policy/v1", "kind": kind, "metadata": {"name": name, "namespace": NS}}
    if uid:
        body["deleteOptions"] = {"preconditions": {"uid": uid}}
    try:
        await body_of(CoreV1Api(api).create_namespaced_pod_eviction(name, NS, body, _preload_content=False))  # type: ignore[arg-type]
    except ApiException as exc:
        return exc.status
    return 201


# --- the emulator's eviction subresource ---------------------------------------------------------


async def test_an_eviction_deletes_the_pod_unless_its_budget_forbids_it(apiserver: ApiServer, api: ApiClient) -> None:
    apiserver.apply(a_pod("free", phase="Running"))
    assert await evict(api, "free") == 201
    assert apiserver.read("pods", NS, "free") is None
    assert await evict(api, "free") == 404  # gone already

    apiserver.apply(budget("web", 0, {"app": "web"}))
    apiserver.apply(a_pod("guarded", labels={"app": "web"}, phase="Running"))
    try:
        await body_of(
            CoreV1Api(api).create_namespaced_pod_eviction(
                "guarded", NS, {"apiVersion": "policy/v1", "kind": "Eviction", "metadata": {"name": "guarded"}}, _preload_content=False
            )  # type: ignore[arg-type]
        )
        raise AssertionError("the budget allows no disruption: the eviction must be refused")
    except ApiException as exc:
        assert exc.status == 429
        status = json.loads(exc.body)
        assert status["reason"] == "TooManyRequests" and status["message"] == DISRUPTION_BUDGET
        assert status["details"]["causes"] == [{"reason": "DisruptionBudget", "message": "The disruption budget web needs 2 healthy pods and has 2 currently"}]
    assert apiserver.read("pods", NS, "guarded") is not None

    # A Pod not running (no phase: Pending, the API server's default) is evicted without asking its budget.
    apiserver.apply(a_pod("starting", labels={"app": "web"}))
    assert await evict(api, "starting") == 201 and apiserver.read("pods", NS, "starting") is None
    # A budget of another selector does not guard it.
    apiserver.apply(a_pod("other", labels={"app": "db"}, phase="Running"))
    assert await evict(api, "other") == 201


async def test_a_budget_allowing_one_disruption_spends_it(apiserver: ApiServer, api: ApiClient) -> None:
    apiserver.apply(budget("web", 1, {"app": "web"}))
    for name in ("a", "b"):
        apiserver.apply(a_pod(name, labels={"app": "web"}, phase="Running"))
    assert await evict(api, "a") == 201
    spent = apiserver.read("poddisruptionbudgets", NS, "web")["status"]
    assert spent["disruptionsAllowed"] == 0 and set(spent["disruptedPods"]) == {"a"}
    assert await evict(api, "b") == 429 and apiserver.read("pods", NS, "b") is not None


async def test_an_eviction_checks_its_body_and_preconditions_and_deletes_as_a_delete_does(apiserver: ApiServer, api: ApiClient) -> None:
    pod = apiserver.apply({**a_pod("held", phase="Running"), "metadata": {"name": "held", "namespace": NS, "finalizers": ["example.com/keep"]}})
    assert await evict(api, "held", kind="Pod") == 400
    assert await evict(api, "held", uid="another-uid") == 409  # a new Pod of that name is not the one meant
    assert apiserver.read("pods", NS, "held")["metadata"].get("deletionTimestamp") is None
    assert await evict(api, "held", uid=pod["metadata"]["uid"]) == 201
    assert apiserver.read("pods", NS, "held")["metadata"]["deletionTimestamp"]  # a finalizer holds it, terminating


async def test_the_claim_controller_stand_in_deallocates_a_claim_its_last_pod_left(apiserver: ApiServer, api: ApiClient) -> None:
    apiserver.claim_controller = True
    a, b = apiserver.apply(a_pod("a", phase="Running")), apiserver.apply(a_pod("b", phase="Running"))
    refs = allocated_claim(apiserver, "shared", a, b, finalizers=["resource.kubernetes.io/delete-protection"])["status"]["reservedFor"]
    assert await evict(api, "a") == 201
    claim = apiserver.read("resourceclaims", NS, "shared")
    assert claim["status"] == {"allocation": ALLOCATION, "reservedFor": refs[1:]}  # still used by b
    assert await evict(api, "b") == 201
    claim = apiserver.read("resourceclaims", NS, "shared")
    assert claim["status"] == {} and not claim["metadata"].get("finalizers")  # its last consumer gone: deallocated


# --- the whole path -------------------------------------------------------------------------------


@pytest.fixture
async def moves_on(apiserver: ApiServer, bus: Bus, api: ApiClient) -> AsyncIterator[Cluster]:
    apiserver.claim_controller = True
    async for cluster in start_cluster(apiserver, bus, api, gpus=4, moves="early"):
        yield cluster


@pytest.fixture
async def moves_off(apiserver: ApiServer, bus: Bus, api: ApiClient) -> AsyncIterator[Cluster]:
    apiserver.claim_controller = True
    async for cluster in start_cluster(apiserver, bus, api, gpus=4):
        yield cluster


async def scattered(cluster: Cluster, kept: tuple[int, ...] = (2, 2)) -> dict[str, list[str]]:
    """1-GPU Pods fill the 4-GPU nodes (one per `kept`); all but `kept` leave each (in node order): node ->
    the small Pods left on it (by default two on each of two nodes: 2 GPUs free on each, 4 in all, none
    whole). They run (phase Running, as the kubelet would say)."""
    api = cluster.apiserver
    api.apply(template("one-gpu"))
    count = 4 * len(kept)
    for i in range(count):
        api.apply(a_pod(f"small-{i}", labels={"app": "small"}, templates={"gpu": "one-gpu"}, owners=REPLICA_SET))
    on: dict[str, list[str]] = {}
    for i in range(count):
        on.setdefault(await cluster.bound(f"small-{i}"), []).append(f"small-{i}")
    assert sorted(len(names) for names in on.values()) == [4] * len(kept)
    leave = dict(zip(sorted(on), (4 - k for k in kept)))
    for node, names in on.items():
        for name in names[: leave[node]]:
            (made,) = cluster.claims_of(name)
            api.remove("pods", NS, name)
            await cluster.gone("resourceclaims", made["metadata"]["name"])
            await cluster.decision(made["metadata"]["name"], ev.AllocationReleased)
        on[node] = names[leave[node] :]
    for names in on.values():
        for name in names:
            current = api.read("pods", NS, name)
            api.apply({**current, "status": {**(current.get("status") or {}), "phase": "Running"}})
    return on


def events_about(api: ApiServer, name: str, reason: str) -> list[dict[str, Any]]:
    return [e for e in api.objects_of("events") if e["involvedObject"]["name"] == name and e["reason"] == reason]


def evictions(api: ApiServer) -> list[Any]:
    return [r for r in api._requests if r.resource is not None and r.resource.plural == "pods" and r.subresource == "eviction"]


async def test_with_moves_on_the_pods_in_a_large_pods_way_are_evicted_and_it_takes_their_node(moves_on: Cluster) -> None:
    cluster, api = moves_on, moves_on.apiserver
    on = await scattered(cluster)
    claims = {name: cluster.claims_of(name)[0]["metadata"]["name"] for names in on.values() for name in names}
    api.apply(template("four-gpus", count=4))
    api.apply(a_pod("big", templates={"gpus": "four-gpus"}))
    node = await cluster.bound("big")
    (claim,) = cluster.claims_of("big")
    assert node_of(claim) == node and len(claim["status"]["allocation"]["devices"]["results"]) == 4
    # The two Pods on its node were evicted (deleted through the Eviction API), the two elsewhere kept.
    (other,) = [n for n in on if n != node]
    assert all(api.read("pods", NS, name) is None for name in on[node])
    assert all(api.read("pods", NS, name) is not None for name in on[other])
    assert {r.name for r in evictions(api)} == set(on[node])
    for name in on[node]:
        (event,) = events_about(api, name, EVICTED)
        assert event["type"] == "Normal" and f"to make room for Pod {NS}/big on node {node}" in event["message"]
    # The allocator's requests are on the bus: one per claim in the way, naming its Pod and the node.
    for name in on[node]:
        subject = ev.subject("allocations", NS, claims[name], "evict")
        requested = ev.decode((await jetstream(cluster.bus).get_last_msg("ALLOCATIONS", subject)).data)
        assert isinstance(requested, ev.EvictionRequested) and [p.name for p in requested.pods] == [name]
        assert (requested.for_pod, requested.node) == ("big", node)
    # Their controllers make them again (a ReplicaSet would): dralloc places them beside the others.
    for name in on[node]:
        api.apply(a_pod(name, labels={"app": "small"}, templates={"gpu": "one-gpu"}, owners=REPLICA_SET))
    for name in on[node]:
        assert await cluster.bound(name) == other
    # RBAC: every call the status writer made here, its eviction included, is granted.
    agent = user_agent("statuswriter")
    calls = {
        (r.resource.group, r.resource.plural + (f"/{r.subresource}" if r.subresource else ""), _verb(r))
        for r in api._requests
        if r.headers.get("User-Agent") == agent and r.resource is not None
    }
    assert ("", "pods/eviction", "create") in calls
    assert calls <= granted(render(INFRA), "dralloc-statuswriter")


async def test_a_pod_with_two_claims_gets_room_for_both_on_one_node(moves_on: Cluster) -> None:
    """Two 2-GPU claims of one Pod (4 GPUs, a whole node; 2 free on each): the Pods on one node are
    evicted and both claims are allocated there."""
    cluster, api = moves_on, moves_on.apiserver
    on = await scattered(cluster)
    api.apply(template("two-gpus", count=2))
    api.apply(a_pod("big", templates={"left": "two-gpus", "right": "two-gpus"}))
    node = await cluster.bound("big")
    claims = cluster.claims_of("big")
    assert len(claims) == 2 and {node_of(c) for c in claims} == {node}
    assert all(len(c["status"]["allocation"]["devices"]["results"]) == 2 for c in claims)
    assert {r.name for r in evictions(api)} == set(on[node])
    (other,) = [n for n in on if n != node]
    assert all(api.read("pods", NS, name) is not None for name in on[other])


@pytest.fixture
async def three_nodes(apiserver: ApiServer, bus: Bus, api: ApiClient) -> AsyncIterator[Cluster]:
    apiserver.claim_controller = True
    async for cluster in start_cluster(apiserver, bus, api, gpus=4, nodes=3, moves="early"):
        yield cluster


async def test_a_gang_of_pods_gets_room_by_evicting_the_pods_in_its_way(three_nodes: Cluster) -> None:
    """A gang of two 4-GPU Pods over three 4-GPU nodes with one small Pod left on each of two and two on
    the third (none whole): the small Pods on the first two are evicted (their claims would fit on the
    third), and the gang takes those two nodes; the third node's Pods stay."""
    cluster, api = three_nodes, three_nodes.apiserver
    on = await scattered(cluster, (1, 1, 2))
    emptied = sorted(n for n, names in on.items() if len(names) == 1)
    claims = {name: cluster.claims_of(name)[0]["metadata"]["name"] for names in on.values() for name in names}
    gang = {"dralloc.dev/gang": "job", "dralloc.dev/gang-size": "2", "dralloc.dev/gang-domain": ""}
    api.apply(template("four-gpus", count=4, annotations=gang))
    for name in ("g0", "g1"):
        api.apply(a_pod(name, templates={"gpus": "four-gpus"}))
    assert sorted([await cluster.bound("g0"), await cluster.bound("g1")]) == emptied
    assert {r.name for r in evictions(api)} == {on[n][0] for n in emptied}
    (kept,) = [n for n in on if n not in emptied]
    assert all(api.read("pods", NS, name) is not None for name in on[kept])
    for node in emptied:
        (event,) = events_about(api, on[node][0], EVICTED)
        assert f"to make room for gang {NS}/job (Pod {NS}/g0) on node {', '.join(emptied)}" in event["message"]
        subject = ev.subject("allocations", NS, claims[on[node][0]], "evict")
        requested = ev.decode((await jetstream(cluster.bus).get_last_msg("ALLOCATIONS", subject)).data)
        assert isinstance(requested, ev.EvictionRequested) and (requested.gang, requested.for_pod) == ("job", "g0")


async def test_a_refusal_for_a_gang_is_told_on_every_members_pod(three_nodes: Cluster) -> None:
    """A budget forbids evicting the small Pods in a gang of two 4-GPU Pods' way: each member's Pod gets
    the Warning Event naming the refusal (not only the first member's), and no Pod is evicted."""
    cluster, api = three_nodes, three_nodes.apiserver
    api.apply(budget("small", 0, {"app": "small"}))
    on = await scattered(cluster, (1, 1, 2))
    gang = {"dralloc.dev/gang": "job", "dralloc.dev/gang-size": "2", "dralloc.dev/gang-domain": ""}
    api.apply(template("four-gpus", count=4, annotations=gang))
    for name in ("g0", "g1"):
        api.apply(a_pod(name, templates={"gpus": "four-gpus"}))
    in_way = [on[n][0] for n in on if len(on[n]) == 1]
    async with asyncio.timeout(30):  # one Event per Pod refused (its message names it), on each member's Pod
        while any(len(events_about(api, name, REFUSED)) < len(in_way) for name in ("g0", "g1")):
            await asyncio.sleep(0.05)
    for name in ("g0", "g1"):
        refused = events_about(api, name, REFUSED)
        assert {e["involvedObject"]["uid"] for e in refused} == {api.read("pods", NS, name)["metadata"]["uid"]}
        assert all(f"to make room for this Pod's gang job: {DISRUPTION_BUDGET}" in e["message"] for e in refused)
        assert sorted(next(p for p in in_way if f"Pod {NS}/{p} " in e["message"]) for e in refused) == sorted(in_way)
    assert all(api.read("pods", NS, name) is not None for names in on.values() for name in names)


async def test_a_claim_submitted_of_its_own_gets_room_by_evicting_the_pods_in_its_way(moves_on: Cluster) -> None:
    """A 4-GPU claim of its own (published on the bus as `dralloc submit` does: no Pod, no claim in the
    API server) with 2 GPUs free on each node, held only by Pods' claims: it is refused at once, asking
    for nothing; once moves are due (the next retry round) the Pods on one node are evicted and the claim
    takes it."""
    cluster, api = moves_on, moves_on.apiserver
    on = await scattered(cluster)
    submitted = ev.ClaimSubmitted(
        claim=msgspec.convert({**claim("batch-job", 4), "metadata": {"name": "batch-job", "namespace": NS, "uid": "uid-batch"}}, ResourceClaim)
    )
    await cluster.bus.publish(submitted)
    api.apply(node_slice("node-2", gpus=1))  # room changes (still no node with four): a retry round comes
    committed = await cluster.decision("batch-job", ev.AllocationCommitted)
    # Its decisions as stored (the retry round after scattered's releases may be the one that moved it):
    # first a refusal asking for no eviction, then the refusals telling of the evictions, then the commit.
    decided: list[Any] = []
    await cluster.bus.scan("ALLOCATIONS", lambda m: decided.append(ev.decode(m.data)), subjects=[committed.subject])
    first, *_, last = decided
    assert isinstance(first, ev.AllocationFailed) and first.reason == "unsatisfiable" and "asked to evict" not in first.message
    assert any(isinstance(d, ev.AllocationFailed) and "asked to evict" in d.message for d in decided) and last == committed
    node = committed.node
    assert {r.name for r in evictions(api)} == set(on[node])
    (other,) = [n for n in on if n != node]
    assert all(api.read("pods", NS, name) is not None for name in on[other])
    for name in on[node]:
        (event,) = events_about(api, name, EVICTED)
        assert f"to make room for claim {NS}/batch-job on node {node}" in event["message"]


def using(obj: dict[str, Any], shared: str) -> dict[str, Any]:
    """The Pod `obj` also using the ResourceClaim `shared` (by name), gated for dralloc."""
    obj["spec"]["resourceClaims"].append({"name": "data", "resourceClaimName": shared})
    obj["spec"]["schedulingGates"] = [{"name": GATE}]
    return obj


async def test_a_pod_tied_to_a_node_by_its_shared_claim_gets_room_made_on_that_node(moves_on: Cluster) -> None:
    """ml/shared (2 GPUs) is placed on node X for the Pod sharer; X's other two GPUs hold two 1-GPU Pods,
    the other node two (2 free). A Pod using ml/shared and a 2-GPU claim of its own can run only on X:
    X's two small Pods are evicted (they fit on the other node), not the other node's, and it runs on X."""
    cluster, api = moves_on, moves_on.apiserver
    api.apply(claim("shared", 2))
    api.apply(using(a_pod("sharer", owners=REPLICA_SET), "shared"))
    x = await cluster.bound("sharer")
    api.apply(template("one-gpu"))
    for i in range(6):
        api.apply(a_pod(f"small-{i}", labels={"app": "small"}, templates={"gpu": "one-gpu"}, owners=REPLICA_SET))
    on: dict[str, list[str]] = {}
    for i in range(6):
        on.setdefault(await cluster.bound(f"small-{i}"), []).append(f"small-{i}")
    (y,) = [n for n in on if n != x]
    assert len(on[x]) == 2 and len(on[y]) == 4
    for name in on[y][:2]:  # two leave the other node: 2 GPUs free there, none on X
        (made,) = cluster.claims_of(name)
        api.remove("pods", NS, name)
        await cluster.gone("resourceclaims", made["metadata"]["name"])
        await cluster.decision(made["metadata"]["name"], ev.AllocationReleased)
    for name in [*on[x], *on[y][2:]]:
        current = api.read("pods", NS, name)
        api.apply({**current, "status": {**(current.get("status") or {}), "phase": "Running"}})
    api.apply(template("two-gpus", count=2))
    api.apply(using(a_pod("big", templates={"gpus": "two-gpus"}), "shared"))
    assert await cluster.bound("big") == x
    assert {r.name for r in evictions(api)} == set(on[x])
    assert all(api.read("pods", NS, name) is not None for name in on[y][2:])
    own = [c for c in cluster.claims_of("big") if c["metadata"]["name"] != "shared"]
    assert [node_of(c) for c in own] == [x]
    for name in on[x]:
        (event,) = events_about(api, name, EVICTED)
        assert f"to make room for Pod {NS}/big on node {x}" in event["message"]


async def test_with_moves_off_nothing_is_evicted(moves_off: Cluster) -> None:
    cluster, api = moves_off, moves_off.apiserver
    on = await scattered(cluster)
    api.apply(template("four-gpus", count=4))
    api.apply(a_pod("big", templates={"gpus": "four-gpus"}))
    async with asyncio.timeout(30):
        while not events_about(api, "big", "AllocationFailed"):
            await asyncio.sleep(0.05)
    await asyncio.sleep(1.0)
    assert evictions(api) == []
    assert all(api.read("pods", NS, name) is not None for names in on.values() for name in names)
    assert api.read("pods", NS, "big")["spec"]["schedulingGates"] == [{"name": GATE}]


async def test_a_disruption_budget_refusing_leaves_the_pods_and_says_so_on_the_waiting_pod(moves_on: Cluster) -> None:
    cluster, api = moves_on, moves_on.apiserver
    api.apply(budget("small", 0, {"app": "small"}))
    on = await scattered(cluster)
    api.apply(template("four-gpus", count=4))
    api.apply(a_pod("big", templates={"gpus": "four-gpus"}))
    async with asyncio.timeout(30):  # one Event per Pod refused (its message names it): both on the node emptied
        while len(events_about(api, "big", REFUSED)) < 2:
            await asyncio.sleep(0.05)
    refused = events_about(api, "big", REFUSED)
    assert all(e["type"] == "Warning" and DISRUPTION_BUDGET in e["message"] and "The disruption budget small" in e["message"] for e in refused)
    assert {e["involvedObject"]["uid"] for e in refused} == {api.read("pods", NS, "big")["metadata"]["uid"]}
    assert all(api.read("pods", NS, name) is not None for names in on.values() for name in names)
    (claim,) = cluster.claims_of("big")
    assert not (claim.get("status") or {}).get("allocation")
    assert api.read("pods", NS, "big")["spec"]["schedulingGates"] == [{"name": GATE}]
    # The allocator hears the refusals (EvictionRefused on CLAIMS, from the status writer): what it held
    # for the waiting Pod is let go at once, and its failure says who refused, why, and when it asks again.
    told = []
    for name in [n for names in on.values() for n in names]:
        subject = ev.subject("claims", NS, cluster.claims_of(name)[0]["metadata"]["name"], "evictrefused")
        try:
            told.append((name, ev.decode((await jetstream(cluster.bus).get_last_msg("CLAIMS", subject)).data)))
        except Exception:  # noqa: BLE001 - not asked to go: no refusal for it
            continue
    assert len(told) == 2
    for name, refused in told:
        assert isinstance(refused, ev.EvictionRefused) and (refused.pod, refused.for_pod) == (name, "big") and DISRUPTION_BUDGET in refused.message
    async with asyncio.timeout(30):
        while True:
            failed = await cluster.decision(claim["metadata"]["name"], ev.AllocationFailed)
            if failed.message.count("Cannot evict pod") == 2:
                break
            await asyncio.sleep(0.05)
    assert "the cluster refused" in failed.message and "nothing is held for it now, and it asks again after" in failed.message
    assert failed.reserved_nodes == [] and failed.reserved_until == 0.0
    # Asked once per Pod, not again and again (after a refusal, only once a backoff is over).
    asked = len(evictions(api))
    assert asked == 2
    await asyncio.sleep(1.0)
    assert len(evictions(api)) == asked


async def test_the_local_store_ignores_an_eviction_request_and_the_stream_takes_it(bus: Bus) -> None:
    """Without Kubernetes there is no Pod to evict: the local sink writes nothing for it, and a consumer
    of ALLOCATIONS takes it as belonging there (never dead-lettered)."""
    pods = [ResourceClaimConsumerReference(resource="pods", name="p", uid="u")]
    request = ev.EvictionRequested(namespace=NS, name="c", uid="uid-c", pods=pods, for_namespace=NS, for_pod="big")
    kv = await bus.key_value("evictions-status")
    assert await statuswriter.apply(KVSink(kv), request) is None
    assert await read_all(kv) == []
    assert streamcheck.misplaced("ALLOCATIONS", request.subject, ev.decode(ev.encode(request))) is None
    assert streamcheck.misplaced("ALLOCATIONS", ev.subject("allocations", NS, "c"), request) is not None  # not as the claim's decision


async def test_the_status_writer_evicts_only_pods_the_claim_is_still_reserved_for(apiserver: ApiServer, api: ApiClient) -> None:
    """Zero trust: a request naming a Pod that does not use the claim (or a claim gone, or re-created)
    evicts nothing; one naming its consumer evicts it and says so on it."""
    user = apiserver.apply(a_pod("user", phase="Running", owners=REPLICA_SET))
    bystander = apiserver.apply(a_pod("bystander", phase="Running", owners=REPLICA_SET))
    ref = ResourceClaimConsumerReference(resource="pods", name="user", uid=user["metadata"]["uid"])
    claim = allocated_claim(apiserver, "c", user)
    sink = KubernetesSink(api=api)

    def request(*pods: ResourceClaimConsumerReference, uid: str = claim["metadata"]["uid"]) -> ev.EvictionRequested:
        return ev.EvictionRequested(namespace=NS, name="c", uid=uid, pods=list(pods), for_namespace=NS, for_pod="big", node="node-0")

    stranger = ResourceClaimConsumerReference(resource="pods", name="bystander", uid=bystander["metadata"]["uid"])
    assert [e.outcome for e in await sink.evictor.evict(request(stranger))] == ["skipped"]
    assert [e.outcome for e in await sink.evictor.evict(request(ref, uid="another-claim"))] == ["gone"]
    assert evictions(apiserver) == [] and apiserver.read("pods", NS, "bystander") is not None
    assert [e.outcome for e in await sink.evictor.evict(request(ref))] == ["evicted"]
    assert apiserver.read("pods", NS, "user") is None and apiserver.read("pods", NS, "bystander") is not None
    (event,) = events_about(apiserver, "user", EVICTED)
    assert event["involvedObject"]["uid"] == ref.uid and "to make room for Pod ml/big on node node-0" in event["message"]
    assert [e.outcome for e in await sink.evictor.evict(request(ref))] == ["gone"]  # redelivered: 404, fine


@pytest.mark.parametrize(
    ("metadata", "why"),
    [
        ({}, "no controller would make it again (a bare Pod)"),
        ({"ownerReferences": [{"apiVersion": "apps/v1", "kind": "DaemonSet", "name": "d", "uid": "u", "controller": True}]}, "DaemonSet"),
        ({"ownerReferences": REPLICA_SET, "annotations": {"kubernetes.io/config.mirror": "x"}}, "static Pod"),
    ],
    ids=["bare", "daemonset", "mirror"],
)
async def test_pods_drain_would_not_evict_are_not_evicted_and_the_waiting_pod_is_told(
    apiserver: ApiServer, api: ApiClient, metadata: dict[str, Any], why: str
) -> None:
    big = apiserver.apply(a_pod("big", phase="Pending"))
    pod = a_pod("user", phase="Running")
    pod["metadata"].update(metadata)
    user = apiserver.apply(pod)
    ref = ResourceClaimConsumerReference(resource="pods", name="user", uid=user["metadata"]["uid"])
    claim = allocated_claim(apiserver, "c", user)
    request = ev.EvictionRequested(namespace=NS, name="c", uid=claim["metadata"]["uid"], pods=[ref], for_namespace=NS, for_pod="big", asked_at=1000.0)
    told: list[ev.EvictionRefused] = []

    async def tell(refused: ev.EvictionRefused) -> None:
        told.append(refused)

    (done,) = await KubernetesSink(api=api, tell=tell).evictor.evict(request)
    assert done.outcome == "refused" and why in done.message
    assert evictions(apiserver) == [] and apiserver.read("pods", NS, "user") is not None
    (event,) = events_about(apiserver, "big", REFUSED)
    assert event["involvedObject"]["uid"] == big["metadata"]["uid"] and why in event["message"]
    # The allocator is told, naming the asking it answers (and the bus would take it: a valid event).
    (refused,) = told
    assert (refused.key, refused.uid, refused.pod, refused.for_pod, refused.asked_at) == (request.key, request.uid, "user", "big", 1000.0)
    assert 1000.0 < refused.refused_at <= time.time()  # (when: the allocator backs off from then)
    assert why in refused.message and ev.decode(ev.encode(refused)) == refused

    async def bus_down(refused: ev.EvictionRefused) -> None:
        raise TimeoutError("no ack")

    # Telling it is advisory: the bus down, the request is still done with (never evicted again for it).
    (done,) = await KubernetesSink(api=api, tell=bus_down).evictor.evict(request)
    assert done.outcome == "refused"


async def test_a_refusal_for_a_claim_of_its_own_is_told_to_the_allocator_only(apiserver: ApiServer, api: ApiClient) -> None:
    """An eviction asked for a claim of its own (``forClaim``, no Pod waits) that is refused: the
    allocator is told (the claim named), and no Event is recorded, there being no waiting Pod to tell."""
    user = apiserver.apply(a_pod("user", phase="Running"))  # a bare Pod: drain would not evict it
    ref = ResourceClaimConsumerReference(resource="pods", name="user", uid=user["metadata"]["uid"])
    claim = allocated_claim(apiserver, "c", user)
    request = ev.EvictionRequested(
        namespace=NS, name="c", uid=claim["metadata"]["uid"], pods=[ref], for_namespace=NS, for_pod="", for_claim="batch", asked_at=1000.0
    )
    told: list[ev.EvictionRefused] = []

    async def tell(refused: ev.EvictionRefused) -> None:
        told.append(refused)

    (done,) = await KubernetesSink(api=api, tell=tell).evictor.evict(request)
    assert done.outcome == "refused" and apiserver.read("pods", NS, "user") is not None
    (refused,) = told
    assert (refused.for_pod, refused.for_claim, refused.pod) == ("", "batch", "user") and ev.decode(ev.encode(refused)) == refused
    assert [e for e in apiserver.objects_of("events") if e["reason"] == REFUSED] == []
