"""A stand-in for kube-scheduler: what dralloc relies on it to do, over the real client and HTTP.

For every Pod that is neither bound nor gated (kube-scheduler does not see gated Pods):
- an extended-resource claim (KEP-5004) that already exists for it is taken as stale, as
  kube-scheduler's filterExtendedResources/PostFilter do: its finalizer removed, deleted; the
  next round makes its own (in-memory claim allocated with the others, created at "PreBind",
  recorded in the Pod's ``status.extendedResourceClaimStatus``);
- claims not allocated yet are allocated by "its DRA plugin": the Kubernetes allocator's
  first fit (dralloc's engine with scoring off, which agrees with it on the conformance
  corpus), all of the Pod's claims together, written as bindClaim writes them: the finalizer
  ``resource.kubernetes.io/delete-protection`` (an update of the claim), then
  ``status.allocation`` and ``reservedFor`` with the claim's resourceVersion;
- allocated claims not reserved for the Pod get it added to ``reservedFor`` (PreBind);
- the Pod is bound (``pods/binding``) to the node its claims' allocations allow.
A Pod whose claims allow no common node, or cannot be allocated, is left unbound.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import msgspec
from kube_emulator import ApiServer
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, ResourceV1Api

from dralloc.allocator.engine import Engine
from dralloc.ingestor.podgate import GatedPod, cluster_extended_claim
from dralloc.kube import body_of
from dralloc.pods import EXTENDED_RESOURCE_CLAIM_ANNOTATION as EXTENDED
from dralloc.pods import request_mappings
from dralloc.schemas.resource import DeviceClass, Pod, ResourceClaim, ResourceSlice, to_builtins

FINALIZER = "resource.kubernetes.io/delete-protection"
MERGE = "application/merge-patch+json"


def allowed_nodes(allocation: dict[str, Any]) -> set[str] | None:
    """The nodes an allocation's node selector allows (None: any node)."""
    selector = allocation.get("nodeSelector")
    if not selector:
        return None
    nodes: set[str] = set()
    for term in selector.get("nodeSelectorTerms", []):
        for requirement in term.get("matchFields", []) + term.get("matchExpressions", []):
            if requirement.get("operator") == "In":
                nodes |= set(requirement.get("values", []))
    return nodes


def affinity_nodes(pod: dict[str, Any]) -> set[str] | None:
    """The nodes a Pod's required node affinity names (``metadata.name In``), None if it names none."""
    required = ((pod["spec"].get("affinity") or {}).get("nodeAffinity") or {}).get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    nodes: set[str] | None = None
    for term in required.get("nodeSelectorTerms", []):
        for requirement in term.get("matchFields", []):
            if requirement.get("key") == "metadata.name" and requirement.get("operator") == "In":
                nodes = set(requirement["values"]) if nodes is None else nodes | set(requirement["values"])
    return nodes


def pod_claim_names(pod: dict[str, Any], *, extended: bool = True) -> list[str] | None:
    statuses = {s["name"]: s.get("resourceClaimName") for s in (pod.get("status") or {}).get("resourceClaimStatuses", [])}
    names = []
    for entry in pod["spec"].get("resourceClaims", []):
        name = entry.get("resourceClaimName") or statuses.get(entry["name"])
        if not name:
            return None
        names.append(name)
    made = ((pod.get("status") or {}).get("extendedResourceClaimStatus") or {}).get("resourceClaimName") if extended else None
    return names + ([made] if made else [])


class SchedulerStandIn:
    def __init__(self, apiserver: ApiServer, api: ApiClient) -> None:
        self.apiserver = apiserver
        self.core = CoreV1Api(api)
        self.resource = ResourceV1Api(api)
        self.allocated: list[str] = []
        """Claims this stand-in allocated itself (as kube-scheduler's DRA plugin)."""
        self.deleted: list[str] = []
        """Extended-resource claims it found made before it bound their Pod, and deleted (as stale)."""

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            for pod in self.apiserver.objects_of("pods"):
                if not pod["spec"].get("nodeName") and not pod["spec"].get("schedulingGates") and not pod["metadata"].get("deletionTimestamp"):
                    try:
                        await self.schedule(pod)
                    except ApiException:
                        pass  # a conflict: the next round tries again, as the scheduler's queue does
            await asyncio.sleep(0.05)

    async def schedule(self, pod: dict[str, Any]) -> None:
        names = pod_claim_names(pod, extended=False)
        if names is None:
            return
        namespace = pod["metadata"]["namespace"]
        extended = self._extended_claim(pod)
        if extended is not None:
            stale = self._existing_extended(pod)
            if stale is not None:
                # filterExtendedResources + PostFilter: an extended-resource claim that exists before
                # the Pod is bound is taken as left over from an earlier cycle: deleted, then made anew.
                await self._delete(stale)
                return
        claims = [self.apiserver.read("resourceclaims", namespace, name) for name in names]
        if any(c is None for c in claims):
            return
        pending = [c for c in claims if not (c.get("status") or {}).get("allocation")]
        fixed: set[str] | None = affinity_nodes(pod)  # Filter: the Pod's node affinity, and the nodes its allocated claims allow
        for claim in claims:
            if (claim.get("status") or {}).get("allocation"):
                allowed = allowed_nodes(claim["status"]["allocation"])
                if allowed is not None:
                    fixed = allowed if fixed is None else fixed & allowed
        if fixed is not None and len(fixed) != 1:
            return
        node = next(iter(fixed)) if fixed else None
        if (pending or extended is not None) and not await self._allocate(pod, pending, extended, node):
            return
        names = pod_claim_names(self.apiserver.read("pods", namespace, pod["metadata"]["name"])) or names
        claims = [self.apiserver.read("resourceclaims", namespace, name) for name in names]
        nodes = affinity_nodes(self.apiserver.read("pods", namespace, pod["metadata"]["name"]) or pod)
        for claim in claims:
            allowed = allowed_nodes(claim["status"]["allocation"])
            if allowed is not None:
                nodes = allowed if nodes is None else nodes & allowed
        if nodes is not None and not nodes:
            return
        for claim in claims:  # PreBind: the Pod is a consumer of each claim
            reserved = claim["status"].get("reservedFor", [])
            if not any(r.get("uid") == pod["metadata"]["uid"] for r in reserved):
                entry = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
                body = {"metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]}, "status": {"reservedFor": reserved + [entry]}}
                await self.resource.patch_namespaced_resource_claim_status(claim["metadata"]["name"], namespace, body, _content_type=MERGE)
        node = sorted(nodes)[0] if nodes else "node-0"
        await body_of(
            self.core.create_namespaced_pod_binding(
                pod["metadata"]["name"],
                namespace,
                {
                    "apiVersion": "v1",
                    "kind": "Binding",
                    "metadata": {"name": pod["metadata"]["name"]},
                    "target": {"apiVersion": "v1", "kind": "Node", "name": node},
                },
                _preload_content=False,
            )
        )

    def _extended_claim(self, pod: dict[str, Any]) -> ResourceClaim | None:
        """The in-memory extended-resource claim (PreFilter), None if the Pod asks for no mapped resource."""
        classes = [msgspec.convert(obj, DeviceClass) for obj in self.apiserver.objects_of("deviceclasses")]
        return cluster_extended_claim(msgspec.convert(pod, GatedPod), classes)

    def _existing_extended(self, pod: dict[str, Any]) -> dict[str, Any] | None:
        for obj in self.apiserver.objects_of("resourceclaims"):
            meta = obj["metadata"]
            if (
                meta["namespace"] == pod["metadata"]["namespace"]
                and (meta.get("annotations") or {}).get(EXTENDED) == "true"
                and any(r.get("uid") == pod["metadata"]["uid"] and r.get("controller") for r in meta.get("ownerReferences", []))
            ):
                return obj
        return None

    async def _delete(self, claim: dict[str, Any]) -> None:
        """deleteClaim: the finalizer removed first (an update), then the delete."""
        name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
        finalizers = [f for f in claim["metadata"].get("finalizers", []) if f != FINALIZER]
        await body_of(
            self.resource.patch_namespaced_resource_claim(
                name,
                namespace,
                {"metadata": {"resourceVersion": claim["metadata"]["resourceVersion"], "finalizers": finalizers or None}},
                _content_type=MERGE,
                _preload_content=False,
            )
        )
        if self.apiserver.read("resourceclaims", namespace, name) is not None:
            await body_of(self.resource.delete_namespaced_resource_claim(name, namespace, _preload_content=False))
        self.deleted.append(name)

    async def _allocate(self, pod: dict[str, Any], pending: list[dict[str, Any]], extended: ResourceClaim | None, node: str | None) -> bool:
        engine = Engine(scoring=False)
        for obj in self.apiserver.objects_of("deviceclasses"):
            engine.apply(msgspec.convert(obj, DeviceClass))
        for obj in self.apiserver.objects_of("resourceslices"):
            engine.apply(msgspec.convert(obj, ResourceSlice))
        for obj in self.apiserver.objects_of("resourceclaims"):
            if (obj.get("status") or {}).get("allocation"):
                engine.restore(msgspec.convert(obj, ResourceClaim))
        unit = [msgspec.convert(c, ResourceClaim) for c in pending]
        if extended is not None:
            unit.append(
                msgspec.structs.replace(extended, metadata=msgspec.structs.replace(extended.metadata, name=f"{pod['metadata']['name']}-extended-resources"))
            )
        outcomes = engine.allocate(unit, node=node, together=True)
        if any(o.status != "allocated" for o in outcomes):
            return False
        if extended is not None:  # PreBind: the claim is created now, then written like the others
            body = to_builtins(extended)
            body["metadata"].pop("name", None)
            pending = [
                *pending,
                json.loads(await body_of(self.resource.create_namespaced_resource_claim(pod["metadata"]["namespace"], body, _preload_content=False))),
            ]
        for claim, outcome in zip(pending, outcomes):
            name, namespace = claim["metadata"]["name"], claim["metadata"]["namespace"]
            finalizers = claim["metadata"].get("finalizers", [])
            if FINALIZER not in finalizers:
                claim = msgspec.json.decode(
                    await body_of(
                        self.resource.patch_namespaced_resource_claim(
                            name,
                            namespace,
                            {"metadata": {"resourceVersion": claim["metadata"]["resourceVersion"], "finalizers": [*finalizers, FINALIZER]}},
                            _content_type=MERGE,
                            _preload_content=False,
                        )
                    )
                )
            entry = {"resource": "pods", "name": pod["metadata"]["name"], "uid": pod["metadata"]["uid"]}
            body = {
                "metadata": {"resourceVersion": claim["metadata"]["resourceVersion"]},
                "status": {"allocation": msgspec.to_builtins(outcome.allocation), "reservedFor": [entry]},
            }
            await self.resource.patch_namespaced_resource_claim_status(name, namespace, body, _content_type=MERGE)
            self.allocated.append(name)
        if extended is not None:
            made = pending[-1]["metadata"]["name"]
            mappings = [
                {"containerName": m.container, "resourceName": m.resource, "requestName": m.request}
                for m in request_mappings(msgspec.convert(pod, Pod), extended)
            ]
            await body_of(
                self.core.patch_namespaced_pod_status(
                    pod["metadata"]["name"],
                    pod["metadata"]["namespace"],
                    {"status": {"extendedResourceClaimStatus": {"resourceClaimName": made, "requestMappings": mappings}}},
                    _content_type=MERGE,
                    _preload_content=False,
                )
            )
        return True
