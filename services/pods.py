"""Pods and the claims they stand for: pure functions shared by the CLI and the services.

Four jobs, each a small pure function over typed objects or plain mappings:

- **Workloads to Pods** (`workload_pods`): a Pod, or a kind that embeds a pod
  template (Deployment, StatefulSet, DaemonSet, ReplicaSet, Job, CronJob),
  yields the Pods it stands for, named deterministically `<workload>-<i>`
  (replicas, default 1; a Job's parallelism, capped by its completions).
- **Claim entries** (`pod_claims`): a Pod's `resourceClaims` resolved as
  Kubernetes' resourceclaim controller (pkg/controller/resourceclaim) does:
  `resourceClaimName` names an existing claim in the Pod's namespace,
  `resourceClaimTemplateName` makes a claim from the template. Offline the
  claim is named `<pod>-<entry>`; the services, which stand for the API
  server, name it `generateName` plus a 5-character suffix (`claim_from_template`).
- **Extended resources backed by DRA** (`extended_resource_claim`, KEP-5004):
  container resources such as `nvidia.com/gpu: 2` that a DeviceClass maps
  (its `spec.extendedResourceName`, or implicitly
  `deviceclass.resource.kubernetes.io/<class>`) become one claim per Pod,
  `<pod>-extended-resources`, with one ExactCount request per container and
  resource named `container-<i>-request-<j>` exactly as the scheduler's
  dynamicresources plugin builds it (extendeddynamicresources.go).
- **Pod specs anywhere** (`find_pod_specs`): every PodSpec inside an arbitrary
  mapping (custom resources too): a mapping with a `containers` list of
  mappings that each have a string `name`.

No I/O here; inputs are hostile, so every failure is a `PodError` whose
message names the field.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container as Collection
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dralloc.schemas.quantity import NANO, parse_quantity
from dralloc.schemas.resource import (
    Container,
    DeviceClaim,
    DeviceClass,
    DeviceRequest,
    ExactDeviceRequest,
    ObjectMeta,
    OwnerReference,
    Pod,
    PodResourceClaim,
    ResourceClaim,
    ResourceClaimSpec,
    ResourceClaimTemplate,
)

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"
"""Set by the resourceclaim controller on a claim made from a template: the Pod entry's name."""

EXTENDED_RESOURCE_CLAIM_ANNOTATION = "resource.kubernetes.io/extended-resource-claim"
"""Set (to "true") by the scheduler on the claim it makes for a Pod's extended resources."""

IMPLICIT_EXTENDED_RESOURCE_PREFIX = "deviceclass.resource.kubernetes.io/"
"""Every DeviceClass is also reachable as `deviceclass.resource.kubernetes.io/<class name>`."""

EXTENDED_RESOURCES_ENTRY = "extended-resources"
"""Offline, a Pod's extended-resource claim is `<pod>-extended-resources`."""

MAX_PODS_PER_WORKLOAD = 10_000
"""A workload asking for more replicas than this is refused rather than expanded (hostile input)."""

_MAX_BASE_LEN = 57  # 63 minus a hyphen and the 5-character suffix, as in the controller
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand
_MAX_DEPTH = 64  # find_pod_specs does not follow nesting deeper than this (hostile input)


class PodError(ValueError):
    """A Pod, workload or claim entry that cannot be expanded; the message names the field."""


# --- workloads to Pods ------------------------------------------------------------

WORKLOAD_KINDS: dict[tuple[str, str], tuple[str, ...]] = {
    ("v1", "Pod"): (),
    ("apps/v1", "Deployment"): ("spec", "template"),
    ("apps/v1", "StatefulSet"): ("spec", "template"),
    ("apps/v1", "DaemonSet"): ("spec", "template"),
    ("apps/v1", "ReplicaSet"): ("spec", "template"),
    ("batch/v1", "Job"): ("spec", "template"),
    ("batch/v1", "CronJob"): ("spec", "jobTemplate", "spec", "template"),
}
"""(apiVersion, kind) -> the path to its pod template (empty: the object is the Pod)."""


def is_workload(doc: Any) -> bool:
    """Whether `doc` is a Pod or a kind that embeds a pod template (by apiVersion and kind)."""
    return isinstance(doc, Mapping) and (doc.get("apiVersion"), doc.get("kind")) in WORKLOAD_KINDS


def _replicas(doc: Mapping[str, Any], kind: str) -> tuple[int, str]:
    """How many Pods a workload stands for, and the field that said so."""
    spec = _mapping(doc.get("spec"))
    if kind == "CronJob":
        spec = _mapping(_mapping(spec.get("jobTemplate")).get("spec"))
        prefix = "spec.jobTemplate.spec."
    else:
        prefix = "spec."
    if kind in ("Job", "CronJob"):
        count, where = _count_field(spec, "parallelism", prefix)
        completions, completions_where = _count_field(spec, "completions", prefix, default=None)
        # A Job never runs more Pods at once than it still needs completions (job controller).
        if completions is not None and completions < count:
            return completions, completions_where
        return count, where
    if kind == "DaemonSet":
        return 1, "spec"  # one Pod per node; offline it stands for one Pod
    return _count_field(spec, "replicas", prefix)


def _mapping(value: object) -> Mapping[str, Any]:
    """`value` if it is a mapping, else an empty one (an optional section missing or malformed)."""
    return value if isinstance(value, Mapping) else {}


def _count_field(spec: Mapping[str, Any], name: str, prefix: str, default: int | None = 1) -> tuple[Any, str]:
    where = prefix + name
    value = spec.get(name, default)
    if value is None:
        return default, where
    if isinstance(value, bool) or not isinstance(value, int):
        raise PodError(f"field {where}: expected an integer, got {type(value).__name__}")
    if value < 0:
        raise PodError(f"field {where}: must be 0 or more, got {value}")
    if value > MAX_PODS_PER_WORKLOAD:
        raise PodError(f"field {where}: {value} Pods is more than dralloc expands ({MAX_PODS_PER_WORKLOAD})")
    return value, where


def _path(doc: Mapping[str, Any], path: Sequence[str]) -> Mapping[str, Any]:
    node: Any = doc
    for depth, key in enumerate(path):
        node = node.get(key) if isinstance(node, Mapping) else None
        if not isinstance(node, Mapping):
            raise PodError(f"field {'.'.join(path[: depth + 1])}: a pod template (a mapping) is required")
    return node


def workload_pods(doc: Mapping[str, Any]) -> list[Pod]:
    """The Pods a Pod or workload document stands for, in replica order.

    A Pod is itself (its name kept). A workload's Pods are named
    `<workload>-<i>` from 0, in the workload's namespace (default `default`),
    with the template's labels and annotations, an ownerReference to the
    workload and the template's spec. Raises `PodError` naming the field when
    the document is not one of `WORKLOAD_KINDS` or cannot be read.
    """
    api_version, kind = doc.get("apiVersion"), doc.get("kind")
    key = (api_version, kind)
    if not isinstance(kind, str) or key not in WORKLOAD_KINDS:
        raise PodError(f"{api_version} {kind} is not a Pod or a workload kind with a pod template")
    meta = doc.get("metadata")
    if not isinstance(meta, Mapping) or not isinstance(meta.get("name"), str) or not meta["name"]:
        raise PodError("field metadata.name: required")
    name, namespace = meta["name"], meta.get("namespace") or "default"
    if not isinstance(namespace, str):
        raise PodError("field metadata.namespace: expected a string")
    template_path = WORKLOAD_KINDS[key]
    if not template_path:
        return [_convert_pod(dict(doc), "")]
    template = _path(doc, template_path)
    count, _ = _replicas(doc, kind)
    where = ".".join(template_path)
    template_meta = _mapping(template.get("metadata"))
    owner = {"apiVersion": api_version, "kind": kind, "name": name, "uid": str(meta.get("uid") or ""), "controller": True}
    pods = []
    for index in range(count):
        pod_doc = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": f"{name}-{index}",
                "namespace": namespace,
                "labels": template_meta.get("labels") or {},
                "annotations": template_meta.get("annotations") or {},
                "ownerReferences": [owner],
            },
            "spec": template.get("spec") if template.get("spec") is not None else {},
        }
        pods.append(_convert_pod(pod_doc, where + "."))
    return pods


def _convert_pod(pod_doc: dict[str, Any], prefix: str) -> Pod:
    try:
        pod = msgspec.convert(pod_doc, Pod)
    except msgspec.ValidationError as exc:
        text = str(exc)
        if " - at `$." in text:
            message, _, at = text.partition(" - at `$.")
            # a template's fields are named as they stand in the workload
            at = prefix + at.rstrip("`")
            raise PodError(f"field {at}: {message}") from None
        raise PodError(text) from None
    return pod


# --- claim entries: the resourceclaim controller ------------------------------------


def generate_name(pod_name: str, pod_claim_name: str) -> str:
    """The claim's ``generateName``, cut as the resourceclaim controller cuts it."""
    name = f"{pod_name}-{pod_claim_name}-"
    if len(name) > _MAX_BASE_LEN:
        # Cut both parts in proportion, so a long pod name does not swallow the claim name.
        name = pod_name[: len(pod_name) * _MAX_BASE_LEN // len(name)] + "-" + pod_claim_name[: len(pod_claim_name) * _MAX_BASE_LEN // len(name)]
    return name


def stable_suffix(pod: Pod, pod_claim_name: str) -> str:
    """Five characters from the API server's alphabet, derived from the Pod and the claim entry."""
    meta = pod.metadata
    identity = f"{meta.uid or ''}/{meta.namespace or 'default'}/{meta.name}/{pod_claim_name}"
    number = int.from_bytes(hashlib.sha256(identity.encode()).digest()[:8], "big")
    chars = []
    for _ in range(5):
        number, index = divmod(number, len(_SUFFIX_ALPHABET))
        chars.append(_SUFFIX_ALPHABET[index])
    return "".join(chars)


def offline_claim_name(pod: Pod, entry: str) -> str:
    """The deterministic name `dralloc allocate` gives a Pod's generated claim: `<pod>-<entry>`."""
    return f"{pod.metadata.name}-{entry}"


def _pod_owner(pod: Pod) -> OwnerReference:
    return OwnerReference(api_version="v1", kind="Pod", name=pod.metadata.name, uid=pod.metadata.uid or "", controller=True, block_owner_deletion=True)


def claim_from_template(
    pod: Pod, pod_claim: PodResourceClaim, template: ResourceClaimTemplate, *, suffix: str | None = None, name: str | None = None
) -> ResourceClaim:
    """The ResourceClaim the controller creates for one Pod entry.

    Named `name` when given (offline: `offline_claim_name`), else
    ``generateName`` plus `suffix` (default: `stable_suffix`), as the API
    server would name it. Carries the template's labels and annotations, the
    `pod-claim-name` annotation, an ownerReference to the Pod and the
    template's ``spec.spec``.
    """
    template_meta = template.spec.metadata or ObjectMeta()
    base = generate_name(pod.metadata.name, pod_claim.name)
    return ResourceClaim(
        metadata=ObjectMeta(
            name=name if name is not None else base + (suffix if suffix is not None else stable_suffix(pod, pod_claim.name)),
            generate_name=base,
            namespace=pod.metadata.namespace or "default",
            labels=dict(template_meta.labels),
            annotations={**template_meta.annotations, POD_CLAIM_NAME_ANNOTATION: pod_claim.name},
            owner_references=[_pod_owner(pod)],
        ),
        spec=template.spec.spec,
    )


@dataclass(slots=True)
class PodClaims:
    """What a Pod's claim entries resolve to.

    `made`: claims made from templates (and the extended-resource claim),
    `existing`: `namespace/name` of claims the Pod names
    (`resourceClaimName`), in entry order; `errors`: one per bad entry.
    """

    made: list[ResourceClaim] = field(default_factory=list)
    existing: list[str] = field(default_factory=list)
    errors: list[PodError] = field(default_factory=list)


def pod_claims(
    pod: Pod,
    templates: Mapping[tuple[str, str], ResourceClaimTemplate],
    *,
    invalid: Collection[tuple[str, str]] = (),
    classes: Sequence[DeviceClass] = (),
    offline: bool = True,
) -> PodClaims:
    """Resolve every `resourceClaims` entry of the Pod; `templates` is keyed by (namespace, name).

    `offline`: made claims are named `<pod>-<entry>` (else as the API server
    would, `claim_from_template`). A missing template, or one in `invalid`
    (refused on its own, with its own error), is an error for that entry
    only. With `classes`, container extended resources a class maps add the
    `<pod>-extended-resources` claim (`extended_resource_claim`).
    """
    namespace = pod.metadata.namespace or "default"
    result = PodClaims()
    seen: set[str] = set()
    for index, entry in enumerate(pod.spec.resource_claims):
        where = f"spec.resourceClaims[{index}]"
        if entry.name in seen:
            result.errors.append(PodError(f"field {where}.name: duplicate entry {entry.name!r}"))
            continue
        seen.add(entry.name)
        by_name, by_template = entry.resource_claim_name, entry.resource_claim_template_name
        if (by_name is None) == (by_template is None):
            result.errors.append(PodError(f"field {where}: exactly one of resourceClaimName and resourceClaimTemplateName is required"))
            continue
        if by_name is not None:
            result.existing.append(f"{namespace}/{by_name}")
            continue
        key = (namespace, by_template or "")
        template = templates.get(key)
        if template is None:
            why = "is invalid (see its own error); no claim made" if key in invalid else "not found"
            result.errors.append(PodError(f"field {where}.resourceClaimTemplateName: ResourceClaimTemplate {namespace}/{key[1]} {why}"))
            continue
        name = offline_claim_name(pod, entry.name) if offline else None
        result.made.append(claim_from_template(pod, entry, template, name=name))
    if classes:
        try:
            extended = extended_resource_claim(pod, classes, name=offline_claim_name(pod, EXTENDED_RESOURCES_ENTRY) if offline else None)
        except PodError as exc:
            result.errors.append(exc)
        else:
            if extended is not None:
                result.made.append(extended)
    return result


# --- extended resources backed by DRA (KEP-5004) -------------------------------------


def is_dra_extended_resource_name(name: str) -> bool:
    """Whether a container resource may be backed by DRA (the scheduler's IsDRAExtendedResourceName).

    Extended resource names are qualified names outside the `kubernetes.io`
    domain (and not `requests.*`); the implicit class names
    `deviceclass.resource.kubernetes.io/<class>` count too.
    """
    if name.startswith(IMPLICIT_EXTENDED_RESOURCE_PREFIX):
        return True
    if "/" not in name or name.startswith("requests."):
        return False
    domain = name.split("/", 1)[0]
    return not (domain == "kubernetes.io" or domain.endswith(".kubernetes.io"))


def class_for_extended_resources(classes: Sequence[DeviceClass]) -> dict[str, str]:
    """Extended resource name -> DeviceClass name, for every class.

    Each class is reachable as `deviceclass.resource.kubernetes.io/<name>`
    and, when set, as its `spec.extendedResourceName`. Where several classes
    claim one name the newest (creationTimestamp) wins, then the first by
    name, so the answer does not depend on input order.
    """
    best: dict[str, DeviceClass] = {}
    for cls in classes:
        names = [IMPLICIT_EXTENDED_RESOURCE_PREFIX + cls.metadata.name]
        if cls.spec.extended_resource_name:
            names.append(cls.spec.extended_resource_name)
        for resource in names:
            current = best.get(resource)
            if current is None or _preferred(cls, current):
                best[resource] = cls
    return {resource: cls.metadata.name for resource, cls in best.items()}


def _preferred(a: DeviceClass, b: DeviceClass) -> bool:
    """Whether class `a` wins an extended resource name over `b`: newer, then first by name."""
    ta, tb = a.metadata.creation_timestamp or "", b.metadata.creation_timestamp or ""
    return ta > tb or (ta == tb and a.metadata.name < b.metadata.name)


@dataclass(frozen=True, slots=True)
class RequestMapping:
    """Which request of the extended-resource claim serves a container's resource
    (core/v1 ContainerExtendedResourceRequest)."""

    container: str
    resource: str
    request: str


def _container_counts(container: Container, where: str) -> dict[str, int]:
    """A container's effective requests (a limit stands for a missing request, as API defaulting does), as whole numbers."""
    resources = container.resources
    merged: dict[str, Any] = {**resources.limits, **resources.requests}
    counts: dict[str, int] = {}
    for name, raw in merged.items():
        if not is_dra_extended_resource_name(name):
            counts[name] = 0  # still takes a place in the sorted request index
            continue
        field_name = "requests" if name in resources.requests else "limits"
        try:
            nano = parse_quantity(raw)
        except ValueError as exc:
            raise PodError(f"field {where}.resources.{field_name}[{name}]: {exc}") from None
        if nano < 0 or nano % NANO:
            raise PodError(f"field {where}.resources.{field_name}[{name}]: an extended resource must be a whole number of 0 or more, got {raw!r}")
        counts[name] = nano // NANO
    return counts


def extended_resource_claim(pod: Pod, classes: Sequence[DeviceClass], *, name: str | None = None) -> ResourceClaim | None:
    """The claim the scheduler makes for the Pod's extended resources that a DeviceClass maps, or None.

    As the dynamicresources plugin builds it (no node provides the resource
    through a device plugin, which is the case for DRA-only fleets): for each
    mapped resource (sorted by name) one ExactCount request per container
    that asks for it, named `container-<i>-request-<j>` (`i`: the index among
    initContainers then containers, `j`: the resource's index among the
    container's sorted resource names), count = the container's request. A
    non-sidecar init container first reuses the requests of the long-lived
    containers after it and asks only for the rest; of those init requests
    only the largest is kept. Requests are sorted by name. Named `name`
    (offline: `<pod>-extended-resources`) or, when None, the generateName
    base plus a stable suffix.
    """
    mapping = class_for_extended_resources(classes)
    init = list(pod.spec.init_containers)
    containers = init + list(pod.spec.containers)
    counts = []
    for index, container in enumerate(containers):
        where = f"spec.initContainers[{index}]" if index < len(init) else f"spec.containers[{index - len(init)}]"
        counts.append(_container_counts(container, where))
    wanted = sorted({r for c in counts for r, n in c.items() if n > 0 and r in mapping})
    if not wanted:
        return None
    long_lived = [i for i, c in enumerate(containers) if i >= len(init) or c.restart_policy == "Always"]
    short_lived = [i for i in range(len(init)) if containers[i].restart_policy != "Always"]
    requests: list[DeviceRequest] = []
    for resource in wanted:
        class_name = mapping[resource]
        long_requests: list[DeviceRequest | None] = [None] * len(containers)
        for i in long_lived:
            long_requests[i] = _request(i, counts[i], resource, class_name, ())
        biggest: DeviceRequest | None = None
        for i in short_lived:
            request = _request(i, counts[i], resource, class_name, long_requests[i:])
            if request is not None and (biggest is None or _count(biggest) < _count(request)):
                biggest = request
        if biggest is not None:
            requests.append(biggest)
        requests += [r for r in long_requests if r is not None]
    requests.sort(key=lambda r: r.name)
    base = f"{pod.metadata.name}-{EXTENDED_RESOURCES_ENTRY}-"
    return ResourceClaim(
        metadata=ObjectMeta(
            name=name if name is not None else base + stable_suffix(pod, EXTENDED_RESOURCES_ENTRY),
            generate_name=base,
            namespace=pod.metadata.namespace or "default",
            annotations={EXTENDED_RESOURCE_CLAIM_ANNOTATION: "true"},
            owner_references=[_pod_owner(pod)],
        ),
        spec=ResourceClaimSpec(devices=DeviceClaim(requests=requests)),
    )


def _count(request: DeviceRequest) -> int:
    return request.exactly.count or 0 if request.exactly else 0


def _request(index: int, counts: Mapping[str, int], resource: str, class_name: str, reusable: Sequence[DeviceRequest | None]) -> DeviceRequest | None:
    """createResourceRequestAndMappings: the request container `index` adds for `resource`, if any."""
    wanted = counts.get(resource, 0)
    if wanted == 0:
        return None
    have = 0
    for other in reusable:
        if other is not None:
            have += _count(other)
            if have >= wanted:
                return None
    position = sorted(counts).index(resource)
    return DeviceRequest(
        name=f"container-{index}-request-{position}",
        exactly=ExactDeviceRequest(device_class_name=class_name, allocation_mode="ExactCount", count=wanted - have),
    )


def request_mappings(pod: Pod, claim: ResourceClaim) -> list[RequestMapping]:
    """Which request of an extended-resource claim serves each container's resource (for status and messages)."""
    init = list(pod.spec.init_containers)
    containers = init + list(pod.spec.containers)
    names = {r.name for r in claim.spec.devices.requests}
    out = []
    for index, container in enumerate(containers):
        resources = sorted({**container.resources.limits, **container.resources.requests})
        for position, resource in enumerate(resources):
            request = f"container-{index}-request-{position}"
            if request in names:
                out.append(RequestMapping(container=container.name, resource=resource, request=request))
    return out


# --- pod specs anywhere -------------------------------------------------------------


def is_pod_spec(value: Any) -> bool:
    """A PodSpec: a mapping with a non-empty `containers` list whose items are mappings with a string `name`."""
    if not isinstance(value, Mapping):
        return False
    containers = value.get("containers")
    return isinstance(containers, list) and bool(containers) and all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in containers)


def find_pod_specs(obj: Any, path: str = "") -> Iterator[tuple[str, Mapping[str, Any]]]:
    """Every PodSpec inside `obj` (any kind, custom resources too), with its field path.

    Depth-first in document order; a PodSpec's own fields are not searched
    further. Paths read like `spec.template.spec` and `spec.workers[1].template.spec`.
    Nesting deeper than 64 levels is not followed (hostile input).
    """
    stack: list[tuple[str, Any, int]] = [(path, obj, 0)]
    while stack:
        where, value, depth = stack.pop()
        if is_pod_spec(value):
            yield where, value
            continue
        if depth >= _MAX_DEPTH:
            continue
        children: list[tuple[str, Any, int]] = []
        if isinstance(value, Mapping):
            for key, child in value.items():
                if isinstance(child, (Mapping, list)):
                    children.append((f"{where}.{key}" if where else str(key), child, depth + 1))
        elif isinstance(value, list):
            for index, child in enumerate(value):
                if isinstance(child, (Mapping, list)):
                    children.append((f"{where}[{index}]", child, depth + 1))
        stack.extend(reversed(children))
