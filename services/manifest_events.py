"""Manifests into the events that publish them: what `dralloc submit`, the demo and the ingestor's
file source all send for a set of YAML/JSON objects (one translation, so a claim submitted by
hand and one read by the ingestor are the same event, deduplicated by the same id).

Bad input is reported through the `report` callback (one line naming file, object and field) and
never stops the translation; an object the Kubernetes API server would refuse
(`dralloc.schemas.validation`) is reported and not published.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Callable, Iterable

import msgspec

from dralloc.lint import selector_problems
from dralloc.manifests import Manifests
from dralloc.pods import pod_claims
from dralloc.schemas import events as ev
from dralloc.schemas.resource import (
    DeviceClass,
    DeviceTaintRule,
    Node,
    Pod,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
)
from dralloc.schemas.validation import validate

SourceEvent = (
    ev.ClaimSubmitted
    | ev.ClaimDeleted
    | ev.DeviceClassPublished
    | ev.DeviceClassRemoved
    | ev.ResourceSlicePublished
    | ev.ResourceSliceRemoved
    | ev.NodePublished
    | ev.NodeRemoved
    | ev.DeviceTaintRulePublished
    | ev.DeviceTaintRuleRemoved
    | ev.PodSubmitted  # the Kubernetes source's pod gate (scheduling-gated Pods)
    | ev.PodDeleted
)

Report = Callable[[str], None]
"""Receives one human-readable line per problem in the input."""


_FILE_UID_NAMESPACE = uuid.UUID("5b0c6a3e-4a53-4b52-9a3c-0d1e2f3a4b5c")


def with_identity(claim: ResourceClaim) -> ResourceClaim:
    """A claim from a file has no uid: give it one derived from its key and spec.

    Equal content gives an equal uid (re-reading a file is deduplicated); a
    changed spec gives a new uid, as deleting and re-creating the claim would
    in Kubernetes (claim specs are immutable there).
    """
    meta = claim.metadata
    if meta.uid and meta.namespace:
        return claim
    digest = hashlib.sha256(msgspec.json.encode(claim.spec)).hexdigest()
    uid = meta.uid or str(uuid.uuid5(_FILE_UID_NAMESPACE, f"{claim.key}:{digest}"))
    return msgspec.structs.replace(claim, metadata=msgspec.structs.replace(meta, uid=uid, namespace=meta.namespace or "default"))


def events_from_manifests(manifests: Manifests, report: Report) -> list[SourceEvent]:
    """What a set of manifests publishes: classes, nodes and slices first, then claims (Pods expanded)."""
    for error in manifests.errors:
        report(str(error))
    templates: dict[tuple[str, str], ResourceClaimTemplate] = {}
    invalid_templates: set[tuple[str, str]] = set()
    for t in manifests.of_type(ResourceClaimTemplate):
        key = (t.metadata.namespace or "default", t.metadata.name)
        if validate(t):
            invalid_templates.add(key)
        else:
            templates[key] = t
    inventory: list[SourceEvent] = []
    claims: list[SourceEvent] = []
    for item in manifests.objects:
        obj = item.obj
        if problems := validate(obj):
            # The API server would refuse it, so it is not published.
            for problem in problems:
                report(f"{item.source}: {obj.kind}/{obj.metadata.name}: field {problem.field}: {problem.message}")
            continue
        for selector_problem in selector_problems(obj, f"{item.source}: {obj.kind}/{obj.metadata.name}"):
            # Published all the same: the allocator records the failure for each claim it affects.
            report(f"{selector_problem}\n    published anyway: claims that use this selector fail with this error")
        if isinstance(obj, DeviceClass):
            inventory.append(ev.DeviceClassPublished(device_class=obj))
        elif isinstance(obj, ResourceSlice):
            inventory.append(ev.ResourceSlicePublished(slice=obj))
        elif isinstance(obj, Node):
            inventory.append(ev.NodePublished(node=obj))
        elif isinstance(obj, DeviceTaintRule):
            inventory.append(ev.DeviceTaintRulePublished(rule=obj))
        elif isinstance(obj, ResourceClaim):
            claims.append(ev.ClaimSubmitted(claim=with_identity(obj)))
        elif isinstance(obj, Pod):
            resolved = pod_claims(obj, templates, invalid=invalid_templates, offline=False)
            for pod_error in resolved.errors:
                report(f"{item.source}: Pod/{obj.metadata.name}: {pod_error}")
            for claim in resolved.made:  # a claim made from a template is named after its Pod: checked too
                made = ev.ClaimSubmitted(claim=with_identity(claim))
                if (identity_problem := ev.identity_problem(made)) is not None:
                    report(f"{item.source}: Pod/{obj.metadata.name}: its claim is not published: {identity_problem}")
                else:
                    claims.append(made)
    return inventory + claims


def removal_of(event: SourceEvent) -> SourceEvent | None:
    """The event that undoes `event` (a file or object that disappeared)."""
    match event:
        case ev.ClaimSubmitted():
            return claim_deletion(event)
        case ev.DeviceClassPublished(device_class=cls):
            return ev.DeviceClassRemoved(name=cls.metadata.name)
        case ev.ResourceSlicePublished(slice=s):
            return ev.ResourceSliceRemoved(name=s.metadata.name, driver=s.spec.driver, pool=s.spec.pool.name, generation=s.spec.pool.generation)
        case ev.NodePublished(node=node):
            return ev.NodeRemoved(name=node.metadata.name)
        case ev.DeviceTaintRulePublished(rule=rule):
            return ev.DeviceTaintRuleRemoved(name=rule.metadata.name)
    return None


def claim_deletion(event: ev.ClaimSubmitted) -> ev.ClaimDeleted:
    """The event that deletes the claim `event` submitted."""
    meta = event.claim.metadata
    return ev.ClaimDeleted(namespace=meta.namespace or "default", name=meta.name, uid=meta.uid or "")


def changes(previous: dict[str, SourceEvent], current: Iterable[SourceEvent]) -> tuple[list[SourceEvent], dict[str, SourceEvent]]:
    """Events that turn the `previous` state (by subject) into `current`: removals first, then news."""
    now = {event.subject: event for event in current}
    removed = [undo for subject, old in previous.items() if subject not in now and (undo := removal_of(old))]
    replaced: list[SourceEvent] = []
    for subject, event in now.items():
        old = previous.get(subject)
        if old is not None and old.msg_id != event.msg_id and isinstance(old, ev.ClaimSubmitted):
            replaced.append(claim_deletion(old))  # a changed claim is a new object: delete the old one first
    fresh = [event for subject, event in now.items() if subject not in previous or previous[subject].msg_id != event.msg_id]
    return removed + replaced + fresh, now
