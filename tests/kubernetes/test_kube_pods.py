"""dralloc in a cluster beside kube-scheduler: gated Pods are allocated as units, then bound.

The real ingestor (Kubernetes source: claims, classes, slices, gated Pods; it also plays the
resourceclaim controller's template part), allocator and status writer over a real
nats-server, against the emulated API server through the real client, with a stand-in for
kube-scheduler (`kube_scheduler.py`) that allocates for ungated Pods and binds every ungated
Pod to a node its claims allow. Each test ends with every Pod bound (or, for the
unsatisfiable one, with its Event).
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import msgspec
import pytest
from kube_emulator import ApiServer
from kube_scheduler import SchedulerStandIn, allowed_nodes
from kubernetes_asyncio.client import ApiClient

from dralloc.allocator import service as allocator
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.ingestor import service as ingestor
from dralloc.ingestor.kubernetes import KubernetesSource, KubeSourceOptions
from dralloc.ingestor.podgate import GATE
from dralloc.kube import KubeSettings, user_agent
from dralloc.schemas import events as ev
from dralloc.schemas.resource import ResourceSlice
from dralloc.statuswriter import service as statuswriter
from dralloc.statuswriter.kubernetes import KubernetesSink

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
from kustomize_render import granted, render  # noqa: E402

INFRA = Path(__file__).resolve().parents[2] / "infra"
NS = "ml"
DRIVER = "gpu.example.com"

CLASS = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceClass",
    "metadata": {"name": DRIVER},
    "spec": {"selectors": [{"cel": {"expression": f"device.driver == '{DRIVER}'"}}], "extendedResourceName": "nvidia.com/gpu"},
}


def node_slice(node: str, gpus: int = 2) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-gpu"},
        "spec": {
            "driver": DRIVER,
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
            "devices": [{"name": f"gpu-{i}", "attributes": {"index": {"int": i}}} for i in range(gpus)],
        },
    }


def template(name: str, count: int = 1, annotations: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": NS},
        "spec": {
            "metadata": {"annotations": annotations or {}},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": count}}]}},
        },
    }


def claim(name: str, count: int = 1) -> dict[str, Any]:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NS},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": DRIVER, "count": count}}]}},
    }


def pod(name: str, *, templates: dict[str, str] | None = None, claims: dict[str, str] | None = None, gated: bool = True, gpus: int = 0) -> dict[str, Any]:
    entries = [{"name": entry, "resourceClaimTemplateName": t} for entry, t in (templates or {}).items()]
    entries += [{"name": entry, "resourceClaimName": c} for entry, c in (claims or {}).items()]
    container: dict[str, Any] = {"name": "main", "image": "busybox"}
    if gpus:
        container["resources"] = {"requests": {"nvidia.com/gpu": str(gpus)}, "limits": {"nvidia.com/gpu": str(gpus)}}
    spec: dict[str, Any] = {"containers": [container], "resourceClaims": entries}
    if gated:
        spec["schedulingGates"] = [{"name": GATE}]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": NS}, "spec": spec}


class Cluster:
    def __init__(self, apiserver: ApiServer, bus: Bus, scheduler: SchedulerStandIn) -> None:
        self.apiserver, self.bus, self.scheduler = apiserver, bus, scheduler

    async def bound(self, name: str, timeout: float = 30) -> str:
        """The node the Pod is bound to, once it is."""
        async with asyncio.timeout(timeout):
            while not (node := ((self.apiserver.read("pods", NS, name) or {}).get("spec") or {}).get("nodeName")):
                await asyncio.sleep(0.05)
        return node

    def claims_of(self, pod_name: str) -> list[dict[str, Any]]:
        obj = self.apiserver.read("pods", NS, pod_name)
        status = obj.get("status") or {}
        names = [s["resourceClaimName"] for s in status.get("resourceClaimStatuses", [])]
        names += [e["resourceClaimName"] for e in obj["spec"].get("resourceClaims", []) if e.get("resourceClaimName")]
        if status.get("extendedResourceClaimStatus"):
            names.append(status["extendedResourceClaimStatus"]["resourceClaimName"])
        return [self.apiserver.read("resourceclaims", NS, n) for n in names]

    async def decision(self, claim_name: str, kind: type, timeout: float = 30) -> Any:
        """The last decision on the bus for the claim, once it is of `kind`."""
        subject = ev.AllocationReleased(namespace=NS, name=claim_name, uid="").subject
        async with asyncio.timeout(timeout):
            while True:
                try:
                    event = ev.decode((await jetstream(self.bus).get_last_msg("ALLOCATIONS", subject)).data)
                    if isinstance(event, kind):
                        return event
                except Exception:  # noqa: BLE001 - not there yet
                    pass
                await asyncio.sleep(0.05)

    async def gone(self, plural: str, name: str, timeout: float = 30) -> None:
        async with asyncio.timeout(timeout):
            while self.apiserver.read(plural, NS, name) is not None:
                await asyncio.sleep(0.05)


async def start_cluster(apiserver: ApiServer, bus: Bus, api: ApiClient, *, gpus: int = 2, nodes: int = 2, moves: str = "off") -> AsyncIterator[Cluster]:
    """The four parts over `apiserver` (`nodes` nodes of `gpus` GPUs each, allocator moves `moves`) with the
    stand-in for kube-scheduler; the status writer tells refusals on `bus` as statuswriter.make_sink's does."""
    settings = KubeSettings(server=str(apiserver.url).rstrip("/"))
    stop = asyncio.Event()
    source = KubernetesSource(None, print, options=KubeSourceOptions(settings=settings, slices=True, claim_templates=True))
    sink = KubernetesSink(settings=settings, tell=bus.publish)
    scheduler = SchedulerStandIn(apiserver, api)
    apiserver.apply(CLASS)
    for i in range(nodes):
        apiserver.apply(node_slice(f"node-{i}", gpus=gpus))
    tasks = [
        asyncio.create_task(ingestor.serve(bus, ingestor.Config(source="kubernetes"), stop, source=source)),
        asyncio.create_task(allocator.serve(bus, allocator.Config(ack_wait=5, retry_after=0.05, moves=moves), stop)),
        asyncio.create_task(statuswriter.serve(bus, statuswriter.Config(sink="kubernetes", ack_wait=5), stop, sink=sink)),
        asyncio.create_task(scheduler.run(stop)),
    ]
    yield Cluster(apiserver, bus, scheduler)
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await sink.close()


@pytest.fixture
async def cluster(apiserver: ApiServer, bus: Bus, api: ApiClient) -> AsyncIterator[Cluster]:
    async for running in start_cluster(apiserver, bus, api):
        yield running


def node_of(claim_obj: dict[str, Any]) -> str:
    (node,) = allowed_nodes(claim_obj["status"]["allocation"]) or {None}
    return node


async def test_a_pod_with_two_template_claims_gets_both_on_one_node(cluster: Cluster) -> None:
    api = cluster.apiserver
    # node-0 has one GPU left, node-1 two: each claim alone would fit node-0 (best fit), the Pod only on node-1.
    taken = {"request": "gpu", "driver": DRIVER, "pool": "node-0", "device": "gpu-0"}
    api.apply(
        {
            **claim("elsewhere"),
            "status": {
                "allocation": {
                    "devices": {"results": [taken]},
                    "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-0"]}]}]},
                }
            },
        }
    )
    api.apply(template("one-gpu"))
    api.apply(pod("trainer", templates={"a": "one-gpu", "b": "one-gpu"}))
    node = await cluster.bound("trainer")
    claims = cluster.claims_of("trainer")
    assert len(claims) == 2 and {node_of(c) for c in claims} == {node} == {"node-1"}
    uid = api.read("pods", NS, "trainer")["metadata"]["uid"]
    for c in claims:
        assert c["status"]["reservedFor"] == [{"resource": "pods", "name": "trainer", "uid": uid}]
        assert "resource.kubernetes.io/delete-protection" in c["metadata"]["finalizers"]
    assert not api.read("pods", NS, "trainer")["spec"].get("schedulingGates")
    assert cluster.scheduler.allocated == []  # dralloc allocated; kube-scheduler only bound


async def test_a_gang_of_pods_is_placed_all_or_nothing(cluster: Cluster) -> None:
    api = cluster.apiserver
    gang = {"dralloc.dev/gang": "job", "dralloc.dev/gang-size": "2", "dralloc.dev/gang-domain": ""}
    api.apply(template("two-gpus", count=2, annotations=gang))
    api.apply(pod("worker-0", templates={"gpus": "two-gpus"}))
    # Alone, the first member is not placed: its gang is not complete.
    async with asyncio.timeout(30):
        while not cluster.claims_of("worker-0") or cluster.claims_of("worker-0")[0] is None:
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)
    assert not (cluster.claims_of("worker-0")[0].get("status") or {}).get("allocation")
    api.apply(pod("worker-1", templates={"gpus": "two-gpus"}))
    nodes = {await cluster.bound("worker-0"), await cluster.bound("worker-1")}
    assert nodes == {"node-0", "node-1"}
    for name in ("worker-0", "worker-1"):
        (c,) = cluster.claims_of(name)
        assert len(c["status"]["allocation"]["devices"]["results"]) == 2
        assert c["status"]["reservedFor"][0]["name"] == name


async def test_a_gang_of_pods_that_cannot_all_fit_holds_nothing_and_each_pod_says_why(cluster: Cluster) -> None:
    api = cluster.apiserver
    gang = {"dralloc.dev/gang": "big", "dralloc.dev/gang-size": "3", "dralloc.dev/gang-domain": ""}
    api.apply(template("two-gpus", count=2, annotations=gang))
    for i in range(3):  # three whole nodes wanted, two there
        api.apply(pod(f"member-{i}", templates={"gpus": "two-gpus"}))
    async with asyncio.timeout(30):
        while {e["involvedObject"]["name"] for e in api.objects_of("events") if e["involvedObject"]["kind"] == "Pod"} != {"member-0", "member-1", "member-2"}:
            await asyncio.sleep(0.05)
    for i in range(3):
        (c,) = cluster.claims_of(f"member-{i}")
        assert not (c.get("status") or {}).get("allocation")  # all or nothing: none holds a device
        assert api.read("pods", NS, f"member-{i}")["spec"]["schedulingGates"] == [{"name": GATE}]


async def test_a_claim_kube_scheduler_allocated_first_is_adopted_and_fixes_the_node(cluster: Cluster) -> None:
    api = cluster.apiserver
    api.apply(claim("shared"))
    api.apply(pod("first", claims={"data": "shared"}, gated=False))  # left to kube-scheduler
    node = await cluster.bound("first")
    assert cluster.scheduler.allocated == ["shared"]
    cluster_allocation = api.read("resourceclaims", NS, "shared")["status"]["allocation"]
    adopted = await cluster.decision("shared", ev.AllocationCommitted)
    assert adopted.claim.status.allocation is not None
    assert {(r.pool, r.device) for r in adopted.claim.status.allocation.devices.results} == {
        (r["pool"], r["device"]) for r in cluster_allocation["devices"]["results"]
    }  # the bus says what the cluster holds
    # A gated Pod sharing that claim: its own claim goes where the shared one is.
    api.apply(template("one-gpu"))
    api.apply(pod("second", templates={"own": "one-gpu"}, claims={"data": "shared"}))
    assert await cluster.bound("second") == node
    own = [c for c in cluster.claims_of("second") if c["metadata"]["name"] != "shared"]
    assert [node_of(c) for c in own] == [node]
    reserved = {r["name"] for r in api.read("resourceclaims", NS, "shared")["status"]["reservedFor"]}
    assert reserved == {"first", "second"}
    assert cluster.scheduler.allocated == ["shared"]  # the second Pod's claim was dralloc's


async def test_a_status_write_lost_to_kube_scheduler_releases_dralloc_decision_and_adopts_theirs(cluster: Cluster) -> None:
    api = cluster.apiserver
    raced: list[dict[str, Any]] = []

    def kube_scheduler_writes_first(subresource: str, key: Any, body: Any) -> None:
        # Between dralloc's read of the claim and its status patch, kube-scheduler allocates it elsewhere.
        if raced or key[2] != "contested" or subresource != "status" or "allocation" not in (body or {}).get("status", {}):
            return
        ours = body["status"]["allocation"]["devices"]["results"][0]
        pool = "node-1" if ours["pool"] == "node-0" else "node-0"
        theirs = {"request": "gpu", "driver": DRIVER, "pool": pool, "device": "gpu-1"}
        raced.append(theirs)
        current = api.read("resourceclaims", NS, "contested")
        api.apply(
            {
                **current,
                "status": {
                    "allocation": {
                        "devices": {"results": [theirs]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}]},
                    }
                },
            }
        )

    api.before_write.append(kube_scheduler_writes_first)
    api.apply(claim("contested"))
    api.apply(pod("racer", claims={"gpu": "contested"}))
    node = await cluster.bound("racer")
    (theirs,) = raced
    assert node == theirs["pool"]  # the Pod runs where the cluster's allocation is
    adopted = await cluster.decision("contested", ev.AllocationCommitted)
    assert [(r.pool, r.device) for r in adopted.claim.status.allocation.devices.results] == [(theirs["pool"], "gpu-1")]
    assert api.read("resourceclaims", NS, "contested")["status"]["allocation"]["devices"]["results"] == [theirs]
    # dralloc's own pick was given back: the three other GPUs all serve three more Pods.
    api.apply(template("one-gpu"))
    for i in range(3):
        api.apply(pod(f"more-{i}", templates={"gpu": "one-gpu"}))
    for i in range(3):
        await cluster.bound(f"more-{i}")


async def test_a_unit_split_by_a_lost_write_is_placed_again_beside_the_cluster_allocation(cluster: Cluster) -> None:
    api = cluster.apiserver
    raced: list[tuple[str, str]] = []

    def kube_scheduler_takes_one_claim_elsewhere(subresource: str, key: Any, body: Any) -> None:
        if raced or not key[2].startswith("pair-") or subresource != "status" or "allocation" not in (body or {}).get("status", {}):
            return
        ours = body["status"]["allocation"]["devices"]["results"][0]
        pool = "node-1" if ours["pool"] == "node-0" else "node-0"
        raced.append((key[2], pool))
        current = api.read("resourceclaims", NS, key[2])
        api.apply(
            {
                **current,
                "status": {
                    "allocation": {
                        "devices": {"results": [{"request": "gpu", "driver": DRIVER, "pool": pool, "device": "gpu-0"}]},
                        "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [pool]}]}]},
                    }
                },
            }
        )

    api.before_write.append(kube_scheduler_takes_one_claim_elsewhere)
    api.apply(template("one-gpu"))
    api.apply(pod("pair", templates={"a": "one-gpu", "b": "one-gpu"}))
    node = await cluster.bound("pair")
    ((taken, pool),) = raced
    assert node == pool  # the claim dralloc had placed beside the lost one followed it
    assert {node_of(c) for c in cluster.claims_of("pair")} == {pool}
    (other,) = [c["metadata"]["name"] for c in cluster.claims_of("pair") if c["metadata"]["name"] != taken]
    decided = await cluster.decision(other, ev.AllocationCommitted)
    assert {r.pool for r in decided.claim.status.allocation.devices.results} == {pool}  # the bus agrees


async def test_a_claim_allocated_by_the_cluster_later_is_adopted_and_its_deallocation_mirrored(cluster: Cluster) -> None:
    api = cluster.apiserver
    api.apply(claim("contested"))
    # kube-scheduler wins: the allocation is in the cluster before dralloc's write (the claim was pending, unused).
    theirs = {"request": "gpu", "driver": DRIVER, "pool": "node-1", "device": "gpu-1"}
    await asyncio.sleep(0.3)
    current = api.read("resourceclaims", NS, "contested")
    api.apply({**current, "status": {"allocation": {"devices": {"results": [theirs]}}}})
    adopted = await cluster.decision("contested", ev.AllocationCommitted)
    assert [(r.pool, r.device) for r in adopted.claim.status.allocation.devices.results] == [("node-1", "gpu-1")]
    # The cluster then deallocates it (the resourceclaim controller, its last consumer gone): dralloc mirrors it.
    current = api.read("resourceclaims", NS, "contested")
    api.apply({**current, "status": {}})
    await cluster.decision("contested", ev.AllocationReleased)
    # The device is free for dralloc again: a Pod needing every GPU of one node gets node-1 or node-0 whole.
    api.apply(template("two-gpus", count=2))
    api.apply(pod("big-0", templates={"gpus": "two-gpus"}))
    api.apply(pod("big-1", templates={"gpus": "two-gpus"}))
    assert {await cluster.bound("big-0"), await cluster.bound("big-1")} == {"node-0", "node-1"}


async def test_deleted_pods_and_claims_release_their_devices(cluster: Cluster) -> None:
    api = cluster.apiserver
    api.apply(template("two-gpus", count=2))
    api.apply(claim("solo", count=2))
    api.apply(pod("a", templates={"gpus": "two-gpus"}))
    api.apply(pod("b", claims={"gpus": "solo"}))
    assert {await cluster.bound("a"), await cluster.bound("b")} == {"node-0", "node-1"}
    (generated,) = cluster.claims_of("a")
    # The Pod goes: the garbage collector deletes its claim; dralloc releases it and lets the finalizer go.
    api.remove("pods", NS, "a")
    await cluster.gone("resourceclaims", generated["metadata"]["name"])
    await cluster.decision(generated["metadata"]["name"], ev.AllocationReleased)
    # A claim deleted directly (its Pod gone too) likewise.
    api.remove("pods", NS, "b")
    api.remove("resourceclaims", NS, "solo")
    await cluster.gone("resourceclaims", "solo")
    await cluster.decision("solo", ev.AllocationReleased)
    # Every GPU is free again: two new Pods take both nodes whole.
    api.apply(pod("c", templates={"gpus": "two-gpus"}))
    api.apply(pod("d", templates={"gpus": "two-gpus"}))
    assert {await cluster.bound("c"), await cluster.bound("d")} == {"node-0", "node-1"}


async def test_a_pod_asking_for_nvidia_gpus_runs_on_the_extended_resource_claim(cluster: Cluster) -> None:
    """dralloc makes the claim kube-scheduler would, allocates it, pins the Pod to that node and lifts
    the gate; kube-scheduler (the stand-in follows its filterExtendedResources/PostFilter) takes a
    claim made before it bound the Pod as stale, deletes it and makes its own, on the pinned node:
    dralloc releases its claim and adopts that one (README, "Known gap")."""
    api = cluster.apiserver
    # node-0 gets four GPUs: kube-scheduler's first fit takes node-0, dralloc's best fit node-1 (two, exactly).
    api.apply(node_slice("node-0", gpus=4))
    subject = ev.ResourceSlicePublished(slice=msgspec.convert(node_slice("node-0", gpus=4), ResourceSlice)).subject
    async with asyncio.timeout(30):  # (on the bus before the Pod)
        while True:
            try:
                published = ev.decode((await jetstream(cluster.bus).get_last_msg("INVENTORY", subject)).data)
                if len(published.slice.spec.devices) == 4:
                    break
            except Exception:  # noqa: BLE001 - not there yet
                pass
            await asyncio.sleep(0.05)
    await asyncio.sleep(0.5)  # (and applied by the allocator, which follows INVENTORY on its own consumer)
    api.apply(pod("legacy", gpus=2))
    node = await cluster.bound("legacy")
    (dralloc_claim,) = cluster.scheduler.deleted
    released = await cluster.decision(dralloc_claim, ev.AllocationReleased)
    assert {r.pool for r in released.allocation.devices.results} == {"node-1"} == {node}  # dralloc's node kept
    assert api.read("pods", NS, "legacy")["spec"]["affinity"] == {
        "nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {
                "nodeSelectorTerms": [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": ["node-1"]}]}]
            }
        }
    }
    obj = api.read("pods", NS, "legacy")
    status = obj["status"]["extendedResourceClaimStatus"]
    assert status["requestMappings"] == [{"containerName": "main", "resourceName": "nvidia.com/gpu", "requestName": "container-0-request-0"}]
    made = api.read("resourceclaims", NS, status["resourceClaimName"])
    assert made["metadata"]["name"].startswith("legacy-extended-resources-") and made["metadata"]["name"] != dralloc_claim
    assert made["metadata"]["annotations"] == {"resource.kubernetes.io/extended-resource-claim": "true"}
    assert made["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": "legacy", "uid": obj["metadata"]["uid"], "controller": True}]
    (request,) = made["spec"]["devices"]["requests"]
    assert request["name"] == "container-0-request-0" and request["exactly"]["count"] == 2
    assert request["exactly"]["deviceClassName"] == DRIVER
    assert node_of(made) == node and len(made["status"]["allocation"]["devices"]["results"]) == 2
    adopted = await cluster.decision(made["metadata"]["name"], ev.AllocationCommitted)  # the bus says what the cluster holds
    assert {(r.pool, r.device) for r in adopted.claim.status.allocation.devices.results} == {
        (r["pool"], r["device"]) for r in made["status"]["allocation"]["devices"]["results"]
    }


async def test_an_unsatisfiable_pod_gets_one_event_with_the_reason(cluster: Cluster) -> None:
    api = cluster.apiserver
    api.apply(template("three-gpus", count=3))
    api.apply(pod("greedy", templates={"gpus": "three-gpus"}))

    def events_on(kind: str) -> list[dict[str, Any]]:
        return [e for e in api.objects_of("events") if e["involvedObject"]["kind"] == kind and "no node has enough free devices" in e["message"]]

    # The reason with both nodes known (a claim decided before the allocator had the slices fails
    # for another reason, which is another Event: one per object and explanation).
    async with asyncio.timeout(30):
        while not events_on("Pod") or not events_on("ResourceClaim"):
            await asyncio.sleep(0.05)
    before = len(api.objects_of("events"))
    api.apply(node_slice("node-2", gpus=1))  # room changes, still no node with three: tried again, same reason
    await cluster.decision(cluster.claims_of("greedy")[0]["metadata"]["name"], ev.AllocationFailed)
    await asyncio.sleep(0.5)
    assert len(api.objects_of("events")) == before  # the same reason again: no new Event
    (event,) = events_on("Pod")
    assert event["involvedObject"]["name"] == "greedy" and event["involvedObject"]["uid"] == api.read("pods", NS, "greedy")["metadata"]["uid"]
    assert event["type"] == "Warning" and event["reason"] == "AllocationFailed"
    assert event["message"].startswith("Pod ml/greedy: ")
    assert event["count"] == 1
    assert len(events_on("ResourceClaim")) == 1
    assert api.read("pods", NS, "greedy")["spec"]["schedulingGates"] == [{"name": GATE}]  # still dralloc's


async def test_a_pod_ungated_by_someone_else_is_left_to_kube_scheduler(cluster: Cluster) -> None:
    api = cluster.apiserver
    api.apply(template("four-gpus", count=4))
    api.apply(pod("impatient", templates={"gpus": "four-gpus"}))
    async with asyncio.timeout(30):  # dralloc has the unit (and cannot place it: no node has four)
        while not [e for e in api.objects_of("events") if e["involvedObject"]["name"] == "impatient"]:
            await asyncio.sleep(0.05)
    current = api.read("pods", NS, "impatient")
    api.apply({**current, "spec": {**current["spec"], "schedulingGates": []}})  # an operator lifts the gate
    subject = ev.PodDeleted(namespace=NS, name="impatient").subject
    async with asyncio.timeout(30):
        while True:
            try:
                if isinstance(ev.decode((await jetstream(cluster.bus).get_last_msg("CLAIMS", subject)).data), ev.PodDeleted):
                    break
            except Exception:  # noqa: BLE001 - not there yet
                pass
            await asyncio.sleep(0.05)
    api.apply(node_slice("node-big", gpus=4))  # room: kube-scheduler allocates, not dralloc
    assert await cluster.bound("impatient") == "node-big"
    (made,) = cluster.claims_of("impatient")
    assert cluster.scheduler.allocated == [made["metadata"]["name"]]
    adopted = await cluster.decision(made["metadata"]["name"], ev.AllocationCommitted)  # and dralloc adopts it
    assert {r.pool for r in adopted.claim.status.allocation.devices.results} == {"node-big"}


def _verb(request: Any) -> str:
    method = request.method.value.upper()
    if method == "GET":
        return "watch" if request.params.get("watch") in ("true", "True", "1") else ("get" if request.name else "list")
    return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]


async def test_rbac_grants_exactly_what_the_services_call(cluster: Cluster) -> None:
    """Every path: a gated Pod with a direct claim and an extended resource, a failure (Events), a deletion."""
    api = cluster.apiserver
    api.apply(claim("direct"))
    api.apply(pod("everything", claims={"gpu": "direct"}, gpus=1))
    await cluster.bound("everything")
    api.apply(claim("too-big", count=3))
    api.apply(pod("never", claims={"gpu": "too-big"}))
    async with asyncio.timeout(30):
        while len(api.objects_of("events")) < 2:
            await asyncio.sleep(0.05)
    api.remove("pods", NS, "everything")
    api.remove("resourceclaims", NS, "direct")
    await cluster.gone("resourceclaims", "direct")

    def calls_by(service: str) -> set[tuple[str, str, str]]:
        agent = user_agent(service)
        return {
            (r.resource.group, r.resource.plural + (f"/{r.subresource}" if r.subresource else ""), _verb(r))
            for r in api._requests
            if r.headers.get("User-Agent") == agent and r.resource is not None
        }

    objects = render(INFRA)
    base_ingestor = granted(objects, "dralloc-ingestor")
    # (This run also plays the resourceclaim controller: its overlay's template reads are extra.)
    assert calls_by("ingestor") - {("resource.k8s.io", "resourceclaimtemplates", "get")} == base_ingestor
    # An Event repeated (patch), or found made by an earlier run (get), is test_kube_events.py's.
    # An eviction (moves on) is test_kube_evictions.py's.
    expected = granted(objects, "dralloc-statuswriter")
    assert calls_by("statuswriter") | {("", "events", "get"), ("", "events", "patch"), ("", "pods/eviction", "create")} == expected
