"""Pods behind dralloc's scheduling gate: their claims go on the bus as one unit; the gate is lifted once allocated.

In a cluster the Pod is the unit of allocation, as for kube-scheduler. A Pod that
carries the scheduling gate ``dralloc.dev/allocate`` (added at admission, see
infra/) is not seen by kube-scheduler until the gate is gone, so dralloc can
allocate its claims without racing kube-scheduler's own DRA plugin:

1. its claims are resolved: each ``resourceClaimName``, and each template entry
   through ``status.resourceClaimStatuses`` (the resourceclaim controller
   records the claim it made there; until then the Pod waits); a Pod whose
   containers ask for an extended resource a DeviceClass maps (KEP-5004) also
   gets the claim kube-scheduler would make for it (below);
2. `PodSubmitted` names them; the allocator places them together on one node
   and the status writer writes each claim's allocation and ``reservedFor``;
3. once every claim of the Pod is allocated in the cluster, the gate is removed
   with a patch that carries the Pod's resourceVersion (a Pod changed meanwhile
   is looked at again on its next event); kube-scheduler then binds the Pod to
   the node its claims allow (its DRA plugin reserves shared claims at PreBind).

A Pod deleted, or whose gate someone else lifted, while dralloc waited for it
is `PodDeleted` (its claims are released by their own deletion).

The extended-resource claim is the one kube-scheduler's dynamicresources plugin
creates (extendeddynamicresources.go): ``generateName`` ``<pod>-extended-resources-``,
annotation ``resource.kubernetes.io/extended-resource-claim: "true"``, the Pod as
controller owner (without blockOwnerDeletion), requests built by
`dralloc.pods.extended_resource_claim`; an existing one (that annotation, owned
by this Pod's uid) is used again. Where kube-scheduler records it in the Pod's
``status.extendedResourceClaimStatus`` at PreBind, dralloc records it as soon as
it creates the claim (before the gate is lifted, so a binding sees the same
status), which also lets a restarted ingestor find it. kube-scheduler takes such a claim, made
before it binds the Pod, as stale from an earlier cycle (filterExtendedResources, PostFilter):
it deletes it and makes its own. So the gate of a Pod with an extended-resource claim is lifted
together with a pin to the node dralloc chose (``spec.affinity``: ``metadata.name In [node]``,
which a gated Pod's affinity may be narrowed to), and kube-scheduler's claim is made there.
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, ResourceV1Api

from dralloc.ingestor.sources import Report, SourceEvent
from dralloc.kube import body_of, describe, merge_patch
from dralloc.pods import EXTENDED_RESOURCE_CLAIM_ANNOTATION, PodError, extended_resource_claim, request_mappings
from dralloc.schemas import events as ev
from dralloc.schemas.resource import AllocationResult, DeviceClass, OwnerReference, Pod, PodSpec, ResourceClaim, to_builtins

log = logging.getLogger("dralloc.ingestor.podgate")

GATE = "dralloc.dev/allocate"
"""The scheduling gate that hands a Pod to dralloc."""


class SchedulingGate(msgspec.Struct):
    name: str


class GatedPodSpec(PodSpec, kw_only=True):
    scheduling_gates: list[SchedulingGate] = []
    affinity: dict[str, Any] | None = None


class PodClaimStatus(msgspec.Struct, rename="camel", kw_only=True):
    name: str
    resource_claim_name: str | None = None


class ExtendedResourceClaimStatus(msgspec.Struct, rename="camel", kw_only=True):
    resource_claim_name: str = ""


class GatedPodStatus(msgspec.Struct, rename="camel", kw_only=True):
    resource_claim_statuses: list[PodClaimStatus] = []
    extended_resource_claim_status: ExtendedResourceClaimStatus | None = None


class GatedPod(Pod, kw_only=True):
    """A Pod with the fields the gate reads: its scheduling gates and the claims its status records."""

    spec: GatedPodSpec = msgspec.field(default_factory=GatedPodSpec)
    status: GatedPodStatus | None = None


def gated(pod: GatedPod) -> bool:
    return any(gate.name == GATE for gate in pod.spec.scheduling_gates)


def template_claim_names(pod: GatedPod) -> list[str] | None:
    """The claim names the Pod's entries stand for, or None while a template entry has no claim recorded yet."""
    recorded = {s.name: s.resource_claim_name for s in (pod.status.resource_claim_statuses if pod.status else [])}
    names = []
    for entry in pod.spec.resource_claims:
        if entry.resource_claim_name:
            names.append(entry.resource_claim_name)
        elif entry.resource_claim_template_name:
            made = recorded.get(entry.name)
            if not made:
                return None
            names.append(made)
    return names


def allowed_nodes(allocation: AllocationResult) -> set[str] | None:
    """The node names an allocation's node selector allows, when it names nodes (``metadata.name``
    or ``kubernetes.io/hostname`` In ...); None when it does not say (network-attached, or labels)."""
    selector = allocation.node_selector
    if selector is None:
        return None
    nodes: set[str] = set()
    for term in selector.node_selector_terms:
        names = [r for r in [*term.match_fields, *term.match_expressions] if r.key in ("metadata.name", "kubernetes.io/hostname") and r.operator == "In"]
        if not names:
            return None  # a term that selects by other labels: any node may match it
        nodes |= set(names[0].values)
    return nodes


def pinned_affinity(affinity: dict[str, Any] | None, node: str) -> dict[str, Any]:
    """`spec.affinity` narrowed to `node` (``metadata.name In [node]``), as a gated Pod's may be: the
    requirement added to each required term, or the one term when there is none."""
    narrowed = copy.deepcopy(affinity or {})
    node_affinity = narrowed.setdefault("nodeAffinity", {})
    required = node_affinity.get("requiredDuringSchedulingIgnoredDuringExecution") or {}
    pin = {"key": "metadata.name", "operator": "In", "values": [node]}
    if not required.get("nodeSelectorTerms"):
        node_affinity["requiredDuringSchedulingIgnoredDuringExecution"] = {"nodeSelectorTerms": [{"matchFields": [pin]}]}
    else:
        for term in required["nodeSelectorTerms"]:
            term.setdefault("matchFields", []).append(pin)
    return narrowed


def cluster_extended_claim(pod: GatedPod, classes: Iterable[DeviceClass]) -> ResourceClaim | None:
    """The extended-resource claim kube-scheduler would create for the Pod (name left to the API server)."""
    claim = extended_resource_claim(pod, list(classes), name="")
    if claim is None:
        return None
    owner = OwnerReference(api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid or "", controller=True)
    return msgspec.structs.replace(claim, metadata=msgspec.structs.replace(claim.metadata, owner_references=[owner]))


class PodGate:
    """Follows the Pods of the cluster and hands the gated ones to the allocator (see the module doc)."""

    def __init__(
        self,
        api: ApiClient,
        report: Report,
        claims: Callable[[], Iterable[ResourceClaim]],
        classes: Callable[[], Iterable[DeviceClass]],
        publish: Callable[[SourceEvent], Awaitable[None]],
        submitted: Callable[[str], bool] = lambda subject: False,
    ) -> None:
        self.core = CoreV1Api(api)
        self.resource = ResourceV1Api(api)
        self.report = report
        self.claims = claims
        self.classes = classes
        self.publish = publish
        self.submitted = submitted
        """Whether the bus holds a `PodSubmitted` on a subject (so a deleted Pod's is superseded)."""
        self.units: dict[str, tuple[GatedPod, list[str]]] = {}
        """Pod key -> the Pod and its claim names, for Pods dralloc handles now."""
        self.extended: dict[str, str] = {}
        """Pod uid -> the extended-resource claim made for it here (its watch event may not have come yet)."""

    # --- events -----------------------------------------------------------------------------

    async def on_pod(self, kind: str, pod: GatedPod) -> None:
        key = f"{pod.metadata.namespace}/{pod.metadata.name}"
        if kind == "DELETED" or pod.metadata.deletion_timestamp or not gated(pod) or pod.spec.node_name:
            waiting = self.units.pop(key, None) is not None
            deleted = ev.PodDeleted(namespace=pod.metadata.namespace or "default", name=pod.metadata.name, uid=pod.metadata.uid or "")
            gone = kind == "DELETED" or bool(pod.metadata.deletion_timestamp)
            # Gone: the unit, decided or not, is over (CLAIMS lets it go). Still waiting but ungated by
            # someone else: kube-scheduler has it now, dralloc must not allocate for it any more.
            if (gone and self.submitted(deleted.subject)) or waiting:
                await self.publish(deleted)
            return
        names = template_claim_names(pod)
        if names is None:
            return  # the resourceclaim controller has not made every claim yet: its status patch brings the Pod back
        try:
            extended = await self._extended_claim(pod)
        except (ApiException, PodError) as exc:
            self.report(f"Pod {key}: its extended-resource claim: {describe(exc) if isinstance(exc, ApiException) else exc}")
            return
        if extended:
            names.append(extended)
        names = sorted(set(names))
        self.units[key] = (pod, names)
        await self.publish(ev.PodSubmitted(namespace=pod.metadata.namespace or "default", name=pod.metadata.name, uid=pod.metadata.uid or "", claims=names))
        await self._lift_when_allocated(key)

    async def claim_changed(self, claim: ResourceClaim) -> None:
        """A claim changed: a Pod waiting for it may now have all its claims allocated."""
        for key, (pod, names) in list(self.units.items()):
            if pod.metadata.namespace == claim.metadata.namespace and claim.metadata.name in names:
                await self._lift_when_allocated(key)

    # --- the gate ----------------------------------------------------------------------------

    async def _lift_when_allocated(self, key: str) -> None:
        unit = self.units.get(key)
        if unit is None:
            return
        pod, names = unit
        known = {c.metadata.name: c for c in self.claims() if c.metadata.namespace == pod.metadata.namespace}
        nodes: set[str] | None = None
        for name in names:
            claim = known.get(name)
            if claim is None or claim.status is None or claim.status.allocation is None:
                return
            allowed = allowed_nodes(claim.status.allocation)
            if allowed is not None:
                nodes = allowed if nodes is None else nodes & allowed
        if nodes is not None and not nodes:
            return  # allocated on different nodes (a write lost to kube-scheduler): dralloc places the rest again
        rest = [{"name": g.name} for g in pod.spec.scheduling_gates if g.name != GATE]
        spec: dict[str, Any] = {"schedulingGates": rest or None}
        if self.extended.get(pod.metadata.uid or "") in names and nodes is not None and len(nodes) == 1:
            # kube-scheduler replaces an extended-resource claim made before it binds the Pod (README,
            # "Known gap"): the Pod is pinned to the node dralloc chose, so its claim is made there.
            spec["affinity"] = pinned_affinity(pod.spec.affinity, next(iter(nodes)))
        patch = {"metadata": {"resourceVersion": pod.metadata.resource_version}, "spec": spec}
        try:
            await merge_patch(self.core.patch_namespaced_pod, pod.metadata.name, pod.metadata.namespace or "default", patch)
        except ApiException as exc:
            if exc.status in (404, 409):
                return  # gone, or changed since it was read: its next event decides again
            self.report(f"Pod {key}: lifting the scheduling gate {GATE}: {describe(exc)}")
            return
        self.units.pop(key, None)
        log.debug("Pod %s: claims %s allocated; scheduling gate %s lifted", key, ", ".join(names), GATE)  # (per Pod: debug)

    # --- the extended-resource claim (KEP-5004) ----------------------------------------------

    async def _extended_claim(self, pod: GatedPod) -> str | None:
        """The name of the Pod's extended-resource claim (made now if it has none yet), or None if it needs none."""
        wanted = cluster_extended_claim(pod, self.classes())
        if wanted is None:
            return None
        uid = pod.metadata.uid or ""
        recorded = pod.status.extended_resource_claim_status if pod.status else None
        name = self.extended.get(uid) or self._existing_extended(pod) or (recorded.resource_claim_name if recorded else "")
        if not name:
            body = to_builtins(wanted)
            body["metadata"].pop("name", None)
            # the client sends a dict body as is; the stub names the model only
            sent = self.resource.create_namespaced_resource_claim(pod.metadata.namespace or "default", body, _preload_content=False)  # type: ignore[arg-type]  # a dict body (see above)
            created = msgspec.json.decode(await body_of(sent), type=ResourceClaim)
            name = created.metadata.name
            log.info("Pod %s/%s: created extended-resource claim %s", pod.metadata.namespace, pod.metadata.name, name)
        self.extended[uid] = name
        if recorded is None or recorded.resource_claim_name != name:
            mappings = [{"containerName": m.container, "resourceName": m.resource, "requestName": m.request} for m in request_mappings(pod, wanted)]
            patch = {"status": {"extendedResourceClaimStatus": {"resourceClaimName": name, "requestMappings": mappings}}}
            await merge_patch(self.core.patch_namespaced_pod_status, pod.metadata.name, pod.metadata.namespace or "default", patch)
        return name

    def _existing_extended(self, pod: GatedPod) -> str | None:
        for claim in self.claims():
            meta = claim.metadata
            if (
                meta.namespace == pod.metadata.namespace
                and meta.annotations.get(EXTENDED_RESOURCE_CLAIM_ANNOTATION) == "true"
                and any(ref.uid == pod.metadata.uid and ref.controller for ref in meta.owner_references)
            ):
                return meta.name
        return None
