"""ResourceClaimTemplate expansion: the claims a Pod's `resourceClaims` ask for.

Pure functions, shared by the file source and the Kubernetes source. They do
what Kubernetes' resourceclaim controller does (pkg/controller/resourceclaim):
for each Pod entry with ``resourceClaimTemplateName`` a ResourceClaim is made
in the Pod's namespace with

- ``generateName`` ``<pod>-<claim>-`` (both parts cut proportionally when
  longer than 57 characters) and a 5-character suffix from the API server's
  alphabet;
- the template's labels and annotations plus the annotation
  ``resource.kubernetes.io/pod-claim-name: <claim>``;
- an ownerReference to the Pod (controller, blockOwnerDeletion);
- the template's ``spec.spec``.

The API server picks the suffix at random; without an API server (files, the
CLI) `stable_suffix` derives it from the Pod's identity, so reading the same
Pod twice yields the same claim.
"""

from __future__ import annotations

import hashlib
from collections.abc import Container, Mapping

from dralloc.schemas.resource import (
    ObjectMeta,
    OwnerReference,
    Pod,
    PodResourceClaim,
    ResourceClaim,
    ResourceClaimTemplate,
)

POD_CLAIM_NAME_ANNOTATION = "resource.kubernetes.io/pod-claim-name"

_MAX_BASE_LEN = 57  # 63 minus a hyphen and the 5-character suffix, as in the controller
_SUFFIX_ALPHABET = "bcdfghjklmnpqrstvwxz2456789"  # k8s.io/apimachinery/pkg/util/rand


class TemplateError(ValueError):
    """A Pod claim entry that cannot be expanded; the message names the field."""


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


def claim_from_template(pod: Pod, pod_claim: PodResourceClaim, template: ResourceClaimTemplate, *, suffix: str | None = None) -> ResourceClaim:
    """The ResourceClaim the controller would create for one Pod entry (with the name the API server would give)."""
    template_meta = template.spec.metadata or ObjectMeta()
    base = generate_name(pod.metadata.name, pod_claim.name)
    return ResourceClaim(
        metadata=ObjectMeta(
            name=base + (suffix if suffix is not None else stable_suffix(pod, pod_claim.name)),
            generate_name=base,
            namespace=pod.metadata.namespace or "default",
            labels=dict(template_meta.labels),
            annotations={**template_meta.annotations, POD_CLAIM_NAME_ANNOTATION: pod_claim.name},
            owner_references=[
                OwnerReference(
                    api_version="v1",
                    kind="Pod",
                    name=pod.metadata.name,
                    uid=pod.metadata.uid or "",
                    controller=True,
                    block_owner_deletion=True,
                )
            ],
        ),
        spec=template.spec.spec,
    )


def expand_pod(
    pod: Pod,
    templates: Mapping[tuple[str, str], ResourceClaimTemplate],
    *,
    invalid: Container[tuple[str, str]] = (),
) -> tuple[list[ResourceClaim], list[TemplateError]]:
    """Claims for every template entry of the Pod; `templates` is keyed by (namespace, name).

    Entries naming an existing claim (``resourceClaimName``) need no expansion
    and yield nothing. A missing template, or one in `invalid` (refused on
    its own, with its own error), is an error for that entry only.
    """
    namespace = pod.metadata.namespace or "default"
    claims: list[ResourceClaim] = []
    errors: list[TemplateError] = []
    for index, entry in enumerate(pod.spec.resource_claims):
        field = f"spec.resourceClaims[{index}]"
        if entry.resource_claim_template_name is None:
            if entry.resource_claim_name is None:
                errors.append(TemplateError(f"field {field}: one of resourceClaimName and resourceClaimTemplateName is required"))
            continue
        key = (namespace, entry.resource_claim_template_name)
        template = templates.get(key)
        if template is None and key in invalid:
            errors.append(
                TemplateError(
                    f"field {field}.resourceClaimTemplateName: ResourceClaimTemplate {namespace}/{key[1]} "
                    "is invalid (see its own error); no claim made"
                )
            )
            continue
        if template is None:
            errors.append(
                TemplateError(
                    f"field {field}.resourceClaimTemplateName: ResourceClaimTemplate "
                    f"{namespace}/{entry.resource_claim_template_name} not found"
                )
            )
            continue
        claims.append(claim_from_template(pod, entry, template))
    return claims, errors
