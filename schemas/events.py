"""Bus events: the messages the four services exchange over NATS JetStream.

Every event is a `msgspec.Struct` in one tagged union, `Event`: JSON on the
wire, the tag in the field ``type`` (the class name), a ``schemaVersion`` on
every message so a subscriber can refuse a version it does not know. Resource
objects inside events are the `dralloc.schemas.resource` Structs, so an event
carries exactly the Kubernetes JSON.

Each event knows its own subject and its ``Nats-Msg-Id``. The id is derived
from the content's identity (claim uid + generation, slice name + generation),
never from a counter or a clock, so a retried publish is deduplicated by
JetStream.

Subjects
--------
=====================================================  ============  =======================
subject                                                stream        events
=====================================================  ============  =======================
``dra.inventory.<driver>.<pool>.<slice>``              INVENTORY     ResourceSlicePublished/Removed
``dra.deviceclasses.<name>``                           INVENTORY     DeviceClassPublished/Removed
``dra.nodes.<name>``                                   INVENTORY     NodePublished/Removed
``dra.devicetaintrules.<name>``                        INVENTORY     DeviceTaintRulePublished/Removed
``dra.claims.<namespace>.<name>``                      CLAIMS        ClaimSubmitted/Deleted
``dra.claims.<namespace>.<claim>.evictrefused``         CLAIMS        EvictionRefused
``dra.allocations.<namespace>.<name>``                 ALLOCATIONS   AllocationCommitted/Failed/Released
``dra.allocations.<namespace>.<name>.evict``           ALLOCATIONS   EvictionRequested
=====================================================  ============  =======================

A NATS subject token cannot contain ``.``, ``*``, ``>`` or whitespace, but
driver names (``gpu.nvidia.com``) and object names contain dots. Each token
is therefore percent-encoded: ``%`` and those characters become ``%XX``
(``gpu.nvidia.com`` -> ``gpu%2Envidia%2Ecom``). `encode_token` /
`decode_token` are the reversible pair; subscribers in other languages
undo it with any URL-unquote function.
"""

from __future__ import annotations

import hashlib
import math
import re
from typing import TYPE_CHECKING, Literal, Protocol
from urllib.parse import unquote

import msgspec

from dralloc.schemas.limits import json_problem
from dralloc.schemas.resource import AllocationResult, DeviceClass, DeviceTaintRule, Node, ResourceClaim, ResourceClaimConsumerReference, ResourceSlice
from dralloc.schemas.validation import is_dns_subdomain, metadata_errors, name_error, namespace_error, pool_name_error

SCHEMA_VERSION = 1
"""Bumped on any incompatible change to an event; additions of optional fields do not bump it."""

SUBJECT_PREFIX = "dra"

_UNSAFE = {".": "%2E", "*": "%2A", ">": "%3E", "%": "%25", " ": "%20", "\t": "%09", "\n": "%0A", "\r": "%0D"}
_UNSAFE_TABLE = str.maketrans(_UNSAFE)
_UNSAFE_CHAR = re.compile("[" + re.escape("".join(_UNSAFE)) + "]")


def encode_token(text: str) -> str:
    """One subject token from any string, reversibly (percent-encoding of the unsafe characters)."""
    if not text:
        return "%00"  # an empty token is not a valid subject; names are never empty in practice
    # Names hold no unsafe character (DNS names): one regex search, not a translate through a dict per
    # character (~4 x as long; every event's subject is made of these, several times per claim).
    return text.translate(_UNSAFE_TABLE) if _UNSAFE_CHAR.search(text) else text


def decode_token(token: str) -> str:
    return "" if token == "%00" else unquote(token)


def subject(*tokens: str) -> str:
    return ".".join([SUBJECT_PREFIX, *(encode_token(t) for t in tokens)])


def _digest(*parts: str | bytes) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\x00")
    return h.hexdigest()[:16]


class _Event(msgspec.Struct, tag_field="type", rename="camel", kw_only=True, frozen=True):
    schema_version: int = SCHEMA_VERSION


def _claim_id(claim: ResourceClaim) -> tuple[str, str, int]:
    meta = claim.metadata
    return meta.uid or "", claim.key, meta.generation or 1


# --- inventory -------------------------------------------------------------------


class ResourceSlicePublished(_Event, tag=True, frozen=True):
    """A node's (or a driver's) ResourceSlice, created or changed. The latest per subject is the current slice."""

    slice: ResourceSlice

    @property
    def subject(self) -> str:
        spec = self.slice.spec
        return subject("inventory", spec.driver, spec.pool.name, self.slice.metadata.name)

    @property
    def msg_id(self) -> str:
        meta, pool = self.slice.metadata, self.slice.spec.pool
        return f"slice:{meta.name}:{meta.generation or 0}:{pool.generation}:{_digest(msgspec.json.encode(self.slice))}"


class ResourceSliceRemoved(_Event, tag=True, frozen=True):
    """The slice is gone; replaces the slice's last ResourceSlicePublished on its subject."""

    name: str
    driver: str
    pool: str
    generation: int = 0

    @property
    def subject(self) -> str:
        return subject("inventory", self.driver, self.pool, self.name)

    @property
    def msg_id(self) -> str:
        return f"slice-removed:{self.name}:{self.generation}"


class DeviceClassPublished(_Event, tag=True, frozen=True):
    device_class: DeviceClass

    @property
    def subject(self) -> str:
        return subject("deviceclasses", self.device_class.metadata.name)

    @property
    def msg_id(self) -> str:
        meta = self.device_class.metadata
        return f"class:{meta.name}:{meta.generation or 0}:{_digest(msgspec.json.encode(self.device_class))}"


class DeviceClassRemoved(_Event, tag=True, frozen=True):
    name: str

    @property
    def subject(self) -> str:
        return subject("deviceclasses", self.name)

    @property
    def msg_id(self) -> str:
        return f"class-removed:{self.name}"


class NodePublished(_Event, tag=True, frozen=True):
    """A node's name and labels (what node selectors match), from discovery."""

    node: Node

    @property
    def subject(self) -> str:
        return subject("nodes", self.node.metadata.name)

    @property
    def msg_id(self) -> str:
        return f"node:{self.node.metadata.name}:{_digest(msgspec.json.encode(self.node))}"


class NodeRemoved(_Event, tag=True, frozen=True):
    name: str

    @property
    def subject(self) -> str:
        return subject("nodes", self.name)

    @property
    def msg_id(self) -> str:
        return f"node-removed:{self.name}"


class DeviceTaintRulePublished(_Event, tag=True, frozen=True):
    """A DeviceTaintRule (resource.k8s.io/v1), created or changed: the devices it selects are
    tainted as a taint in their slice would taint them. From files or Kubernetes (the ingestor);
    also the way to taint devices of slices that are not the publisher's to change."""

    rule: DeviceTaintRule

    @property
    def subject(self) -> str:
        return subject("devicetaintrules", self.rule.metadata.name)

    @property
    def msg_id(self) -> str:
        meta = self.rule.metadata
        return f"taintrule:{meta.name}:{meta.generation or 0}:{_digest(msgspec.json.encode(self.rule))}"


class DeviceTaintRuleRemoved(_Event, tag=True, frozen=True):
    name: str

    @property
    def subject(self) -> str:
        return subject("devicetaintrules", self.name)

    @property
    def msg_id(self) -> str:
        return f"taintrule-removed:{self.name}"


# --- claims ----------------------------------------------------------------------


class ClaimSubmitted(_Event, tag=True, frozen=True):
    """A ResourceClaim to allocate. Its ``metadata.uid`` is its identity (the ingestor sets one when missing)."""

    claim: ResourceClaim
    cluster: bool = False
    """The claim as a Kubernetes cluster holds it now, status included (the Kubernetes source): its
    status is the truth the allocator follows (an allocation there is adopted, and one that
    replaces or removes dralloc's releases dralloc's). Each change of the object is news (see `msg_id`)."""
    needs_pod: bool = False
    """Allocated only together with the other claims of a Pod that uses it (`PodSubmitted`); alone
    it waits (Kubernetes' delayed allocation). False: allocated on its own as soon as it fits."""

    @property
    def subject(self) -> str:
        return subject("claims", self.claim.metadata.namespace or "default", self.claim.metadata.name)

    @property
    def msg_id(self) -> str:
        uid, key, generation = _claim_id(self.claim)
        if self.cluster and self.claim.metadata.resource_version:
            # Status changes (an allocation written or cleared by anyone) keep the generation.
            return f"claim:{uid or key}:{generation}:{self.claim.metadata.resource_version}"
        return f"claim:{uid or key}:{generation}"


class ClaimDeleted(_Event, tag=True, frozen=True):
    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("claims", self.namespace, self.name)

    @property
    def msg_id(self) -> str:
        return f"claim-deleted:{self.uid or self.key}"


class PodSubmitted(_Event, tag=True, frozen=True):
    """A Pod waiting for dralloc (its scheduling gate): the claims it uses, allocated as one unit,
    all or none, on one node. ``claims`` are claim names in the Pod's namespace (direct
    ``resourceClaimName``s, the claims made from its templates, its extended-resource claim).
    Stream CLAIMS, subject ``dra.claims.<namespace>.<pod>.pod`` (a claim subject has one token less)."""

    namespace: str
    name: str
    uid: str
    claims: list[str]

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("claims", self.namespace, self.name, "pod")

    @property
    def msg_id(self) -> str:
        return f"pod:{self.uid or self.key}:{_digest(*self.claims)}"


class PodDeleted(_Event, tag=True, frozen=True):
    """The Pod is gone, or no longer waits for dralloc (its gate lifted): its unit is forgotten.
    Its claims are released by their own deletion (or kept, when shared)."""

    namespace: str
    name: str
    uid: str = ""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("claims", self.namespace, self.name, "pod")

    @property
    def msg_id(self) -> str:
        return f"pod-deleted:{self.uid or self.key}"


EVICTION_WORDS_MAX = 1000
"""The most characters of the API server's words an `EvictionRefused` carries (longer is refused)."""
EVICTION_GANG_PODS_MAX = 1000
"""The most Pods an `EvictionRequested` names as its gang's (``gangPods``; more is refused): a gang is
committed in one atomic batch, at most 1,000 messages."""
EVICTION_REFUSALS_MAX = 64
"""The most refusals in a row an `EvictionRequested` counts (``refusedBefore``; more is refused): the
allocator's backoff stops doubling long before."""


class EvictionRefused(_Event, tag=True, frozen=True):
    """The Kubernetes status writer tells the allocator that an eviction it asked for
    (`EvictionRequested`) was refused: a PodDisruptionBudget forbade it (429), or the Pod is one
    ``kubectl drain`` would not evict. The allocator stops holding devices for the waiting Pod at
    once, says why in its failure, and asks again only after a backoff
    (services/allocator/evicting.py). Stream CLAIMS (the allocator's input; ALLOCATIONS is fenced
    for the allocator's writes alone), subject ``dra.claims.<namespace>.<claim>.evictrefused``
    (one token more than the claim's own)."""

    namespace: str
    name: str
    """The claim in the way (the Pod refused is in its namespace)."""
    uid: str
    pod: str
    """The Pod that was not evicted."""
    for_namespace: str
    for_pod: str
    """The Pod the room was asked for."""
    asked_at: float = 0.0
    """The request's ``askedAt``: which asking was refused (an older one's refusal is no news)."""
    message: str = ""
    """Why (the API server's words), at most `EVICTION_WORDS_MAX` characters."""
    refused_at: float = 0.0
    """When it was refused (seconds since the epoch; 0: unknown): the allocator's backoff counts from
    then, also for a leader that replays the refusal after a takeover (a finite number, not negative)."""
    gang: str = ""
    """The request's ``gang`` (the room was asked for that gang), "" for a Pod or claim alone."""
    for_claim: str = ""
    """The request's ``forClaim`` (the room was asked for that claim of its own; ``forPod`` is "")."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("claims", self.namespace, self.name, "evictrefused")

    @property
    def msg_id(self) -> str:
        return f"evict-refused:{self.uid or self.key}:{self.for_namespace}/{self.for_pod}:{self.asked_at!r}:{_digest(self.pod, self.message)}"


# --- allocation decisions (written only by the allocator) ------------------------


class _CommittedMeta(Protocol):
    @property
    def name(self) -> str: ...
    @property
    def namespace(self) -> str | None: ...
    @property
    def uid(self) -> str | None: ...


class _CommittedStatus(Protocol):
    @property
    def allocation(self) -> AllocationResult | None: ...


class _CommittedClaim(Protocol):
    @property
    def metadata(self) -> _CommittedMeta: ...
    @property
    def status(self) -> _CommittedStatus | None: ...


class CommitView:
    """A commit's identity and allocation, from its claim: `AllocationCommitted`'s, and those of
    a partial read of one (the status writer's `reading.Committed`) by the same code."""

    __slots__ = ()
    if TYPE_CHECKING:

        @property
        def claim(self) -> _CommittedClaim: ...

    @property
    def key(self) -> str:
        return f"{self.claim.metadata.namespace or 'default'}/{self.claim.metadata.name}"

    @property
    def uid(self) -> str:
        return self.claim.metadata.uid or ""

    @property
    def allocation(self) -> AllocationResult | None:
        return self.claim.status.allocation if self.claim.status else None

    @property
    def subject(self) -> str:
        return subject("allocations", self.claim.metadata.namespace or "default", self.claim.metadata.name)


class AllocationCommitted(_Event, CommitView, tag=True, frozen=True):
    """The claim, with ``status.allocation`` set, as the allocator committed it."""

    claim: ResourceClaim
    node: str | None = None

    @property
    def msg_id(self) -> str:
        uid, key, generation = _claim_id(self.claim)
        return f"committed:{uid or key}:{generation}"


class AllocationFailed(_Event, tag=True, frozen=True):
    """No allocation for the claim now: ``unsatisfiable`` (valid, no fit) or ``error`` (invalid input)."""

    namespace: str
    name: str
    uid: str
    generation: int
    reason: Literal["unsatisfiable", "error"]
    message: str
    pod: str = ""
    """The Pod (in the claim's namespace) whose unit this claim failed with, if any (its Events)."""
    reserved_nodes: list[str] = []
    """Nodes held for the claim while it waits (services/allocator/reservations.py): other claims take them last."""
    reserved_until: float = 0.0
    """When the claim's wait for a reservation is over (seconds since the epoch; 0: it has none)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("allocations", self.namespace, self.name)

    @property
    def msg_id(self) -> str:
        # The same failure for the same claim is one message; a different reason is news (and a
        # reservation begun, moved or ended).
        held = (*self.reserved_nodes, repr(self.reserved_until)) if self.reserved_until else ()
        return f"failed:{self.uid or self.key}:{self.generation}:{_digest(self.reason, self.message, *held)}"


class AllocationReleased(_Event, tag=True, frozen=True):
    """The claim was deleted; its devices are free again."""

    namespace: str
    name: str
    uid: str
    allocation: AllocationResult | None = None
    """The allocation released, when known: a status writer clears a claim's status only if it
    holds that allocation (never one made elsewhere, even after a restart forgot what it wrote)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("allocations", self.namespace, self.name)

    @property
    def msg_id(self) -> str:
        return f"released:{self.uid or self.key}"


class HeldDevice(msgspec.Struct, rename="camel", frozen=True):
    """One device held for a Pod while the Pods in its way are evicted (`EvictionRequested.held`)."""

    driver: str
    pool: str
    device: str


class EvictionRequested(_Event, tag=True, frozen=True):
    """The allocator asks that the Pods using a claim be evicted (policy/v1 Eviction) to make room for
    a Pod that waits (services/allocator/evicting.py): a claim reserved for a Pod cannot be re-placed
    in place. Not a decision about the claim: it stays allocated until the cluster deallocates or
    deletes it once its Pods are gone. Only the Kubernetes status writer acts on it (the local store
    ignores it). Subject ``dra.allocations.<namespace>.<claim>.evict`` (one token more than the
    claim's decisions, so it never stands as the claim's last decision)."""

    namespace: str
    name: str
    """The claim in the way."""
    uid: str
    pods: list[ResourceClaimConsumerReference]
    """The Pods to evict: the claim's ``reservedFor`` (Pods only)."""
    for_namespace: str
    for_pod: str
    """The Pod the room is made for (its Events say what became of the request)."""
    node: str = ""
    """The node the eviction empties for it."""
    message: str = ""
    held: list[HeldDevice] = []
    """A share of the devices the Pod would get there, held for it while the eviction is in flight: the
    requests made for it at once carry them all between them, each device once (a large gang's batch
    stays small): a new leader holds their union again (services/allocator/evicting.py)."""
    asked_at: float = 0.0
    """When the allocator asked (seconds since the epoch; 0: unknown): a new leader keeps the
    eviction in flight until that time plus its patience, not longer."""
    gang: str = ""
    """The gang (annotation ``dralloc.dev/gang``, in ``forNamespace``; an object name) the room is made
    for, ``forPod`` (``forClaim``) one of its Pods (claims); "" when it is made for one Pod or claim."""
    for_claim: str = ""
    """A claim of its own (from a file or ``dralloc submit``, reserved for no Pod) the room is made for;
    then ``forPod`` is "" (no Pod waits, none is told)."""
    gang_pods: list[str] = []
    """With ``gang``: every member's Pod (names in ``forNamespace``, at most `EVICTION_GANG_PODS_MAX`),
    each told of a refusal by an Event; [] for a Pod or claim alone (``forPod`` alone is told)."""
    refused_before: int = 0
    """Refusals in a row the allocator had heard for the unit before this asking (0 to
    `EVICTION_REFUSALS_MAX`): the backoff after a refusal of it doubles once more than after the last,
    also for a new leader that reads the request back (services/allocator/evicting.py)."""

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"

    @property
    def subject(self) -> str:
        return subject("allocations", self.namespace, self.name, "evict")

    @property
    def msg_id(self) -> str:
        return f"evict:{self.uid or self.key}:{self.for_namespace}/{self.for_pod or 'claim:' + self.for_claim}:{_digest(*(p.uid for p in self.pods))}"


InventoryEvent = (
    ResourceSlicePublished
    | ResourceSliceRemoved
    | DeviceClassPublished
    | DeviceClassRemoved
    | NodePublished
    | NodeRemoved
    | DeviceTaintRulePublished
    | DeviceTaintRuleRemoved
)
ClaimEvent = ClaimSubmitted | ClaimDeleted | PodSubmitted | PodDeleted | EvictionRefused
AllocationEvent = AllocationCommitted | AllocationFailed | AllocationReleased | EvictionRequested
Event = InventoryEvent | ClaimEvent | AllocationEvent

EVENT_TYPES: tuple[type[_Event], ...] = (
    ResourceSlicePublished,
    ResourceSliceRemoved,
    DeviceClassPublished,
    DeviceClassRemoved,
    NodePublished,
    NodeRemoved,
    DeviceTaintRulePublished,
    DeviceTaintRuleRemoved,
    ClaimSubmitted,
    ClaimDeleted,
    PodSubmitted,
    PodDeleted,
    EvictionRefused,
    AllocationCommitted,
    AllocationFailed,
    AllocationReleased,
    EvictionRequested,
)

_encoder = msgspec.json.Encoder()
_decoder: msgspec.json.Decoder[Event] = msgspec.json.Decoder(Event)  # (a union is not a type: annotated)


class EventDecodeError(ValueError):
    """A message that is not a valid event of a supported schema version."""


def encode(event: Event) -> bytes:
    return _encoder.encode(event)


def decode(data: bytes) -> Event:
    """Decode one message; raises `EventDecodeError` with a reason a person can read.

    Refused before decoding: nesting deeper than `limits.MAX_DEPTH`, an integer outside int64
    (`limits.json_problem`). Refused after: names the API server would refuse (`identity_problem`)."""
    if (problem := json_problem(data)) is not None:
        raise EventDecodeError(f"not a dralloc event: {problem}")
    try:
        event = _decoder.decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise EventDecodeError(f"not a dralloc event: {exc}") from None
    if event.schema_version != SCHEMA_VERSION:
        raise EventDecodeError(f"{type(event).__name__} has schemaVersion {event.schema_version}; this build reads {SCHEMA_VERSION}")
    if (problem := identity_problem(event)) is not None:
        raise EventDecodeError(f"{type(event).__name__}: {problem}")
    return event


def identity_problem(event: Event) -> str | None:
    """Why the names an event is about (what its subject and KV key are built from) are not
    names the API server would accept, or None. Checked by every consumer (`decode`) and by
    the ingestor before it publishes: with namespaces DNS labels and names DNS subdomains, a
    claim key ``namespace/name`` and a subject are each one object's (no ``/`` in either part)."""
    match event:
        case (
            ClaimSubmitted(claim=obj)
            | AllocationCommitted(claim=obj)
            | DeviceClassPublished(device_class=obj)
            | NodePublished(node=obj)
            | DeviceTaintRulePublished(rule=obj)
        ):
            errors = metadata_errors(obj)
            return "; ".join(str(e) for e in errors) if errors else None
        case ResourceSlicePublished(slice=obj):
            errors = metadata_errors(obj)
            problem = pool_name_error(obj.spec.pool.name) or (
                None if is_dns_subdomain(obj.spec.driver) else f"driver {obj.spec.driver!r} is not a DNS subdomain"
            )
            return "; ".join([*(str(e) for e in errors), *([problem] if problem else [])]) or None
        case ClaimDeleted(namespace=ns, name=name) | AllocationFailed(namespace=ns, name=name) | AllocationReleased(namespace=ns, name=name):
            problem = namespace_error(ns) or name_error(name)
            return f"claim {ns}/{name}: {problem}" if problem else None
        case PodSubmitted(namespace=ns, name=name, claims=claims):
            problem = namespace_error(ns) or name_error(name) or next(filter(None, map(name_error, claims)), None)
            return f"Pod {ns}/{name}: {problem}" if problem else None
        case PodDeleted(namespace=ns, name=name):
            problem = namespace_error(ns) or name_error(name)
            return f"Pod {ns}/{name}: {problem}" if problem else None
        case EvictionRequested(namespace=ns, name=name, for_namespace=for_ns, for_pod=for_pod, pods=pods):
            problem = namespace_error(ns) or name_error(name) or namespace_error(for_ns) or _for_problem(for_pod, event.for_claim)
            problem = problem or next(filter(None, (name_error(p.name) for p in pods)), None)
            problem = problem or next(filter(None, (_held_problem(d) for d in event.held)), None)
            problem = problem or (_gang_problem(event.gang) if event.gang else None)
            problem = problem or _gang_pods_problem(event.gang, event.gang_pods)
            problem = problem or _time_problem("askedAt", event.asked_at)
            if problem is None and not 0 <= event.refused_before <= EVICTION_REFUSALS_MAX:
                problem = f"refusedBefore {event.refused_before} is not a count of refusals (0 to {EVICTION_REFUSALS_MAX})"
            return f"eviction for claim {ns}/{name}: {problem}" if problem else None
        case EvictionRefused(namespace=ns, name=name, pod=pod, for_namespace=for_ns, for_pod=for_pod, message=words):
            problem = namespace_error(ns) or name_error(name) or name_error(pod) or namespace_error(for_ns) or _for_problem(for_pod, event.for_claim)
            if problem is None and len(words) > EVICTION_WORDS_MAX:
                problem = f"its message is {len(words)} characters long (at most {EVICTION_WORDS_MAX})"
            problem = problem or _time_problem("askedAt", event.asked_at) or _time_problem("refusedAt", event.refused_at)
            problem = problem or (_gang_problem(event.gang) if event.gang else None)
            return f"eviction refusal for claim {ns}/{name}: {problem}" if problem else None
        case ResourceSliceRemoved(name=name, driver=driver, pool=pool):
            return name_error(name) or pool_name_error(pool) or (None if is_dns_subdomain(driver) else f"driver {driver!r} is not a DNS subdomain")
        case DeviceClassRemoved(name=name) | NodeRemoved(name=name) | DeviceTaintRuleRemoved(name=name):
            return name_error(name)
    return None


def _time_problem(field: str, value: float) -> str | None:
    """Why `value` (the event's `field`) is not a time in seconds since the epoch (0: unknown), or None."""
    return None if math.isfinite(value) and value >= 0 else f"{field} {value!r} is not a time (seconds since the epoch)"


def _for_problem(pod: str, claim: str) -> str | None:
    """Why what an eviction makes room for is not one Pod or one claim named as an object is, or None."""
    if not claim:
        return name_error(pod)
    if pod:
        return f"forPod {pod[:64]!r} and forClaim {claim[:64]!r}: room is made for one Pod or one claim"
    problem = name_error(claim)
    return f"forClaim: {problem}" if problem else None


def _gang_problem(gang: str) -> str | None:
    """Why an eviction's gang is not a gang name it may carry (an object name), or None."""
    problem = name_error(gang)
    return f"gang: {problem}" if problem else None


def _gang_pods_problem(gang: str, pods: list[str]) -> str | None:
    """Why an eviction's gang's Pods are not a gang's Pods named as objects are, or None."""
    if pods and not gang:
        return "gangPods without a gang"
    if len(pods) > EVICTION_GANG_PODS_MAX:
        return f"gangPods names {len(pods)} Pods (at most {EVICTION_GANG_PODS_MAX})"
    problem = next(filter(None, map(name_error, pods)), None)
    return f"gangPods: {problem}" if problem else None


def _held_problem(device: HeldDevice) -> str | None:
    """Why a held device's names are not names a ResourceSlice could carry, or None."""
    if not is_dns_subdomain(device.driver):
        return f"held device driver {device.driver[:64]!r} is not a DNS subdomain"
    problem = pool_name_error(device.pool) or name_error(device.device)
    return f"held device {device.device[:64]!r}: {problem}" if problem else None
