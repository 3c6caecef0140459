"""The Kubernetes status sink: committed allocations go into `ResourceClaim.status`, where Kubernetes looks.

Every write is a read of the claim's status subresource followed by a JSON
merge patch of `status` that carries the resourceVersion just read, so the API
server rejects it (409 Conflict) if the claim changed in between; then the
claim is read again and the decision re-made. Decisions, per event:

committed
    no allocation yet -> write `status.allocation` (and `reservedFor` when the
    claim names its consumer: the Pod that owns it as controller);
    the same allocation already there -> nothing to do (a redelivered event;
    the same as `dralloc.schemas.allocation` says: the result fields of a
    feature gate that is off, dropped by the API server, are no difference);
    a different allocation -> never overwritten: it came from elsewhere, it is
    reported and left alone;
    claim gone, or re-created under the same name (another uid) -> nothing.
released
    clears `allocation` and `reservedFor`, unless the allocation there is not
    the one released (the event carries it; for an older event without it:
    the one this writer wrote) (then it is reported and kept) or the claim is
    gone or re-created. What was written is remembered per process; after a
    restart, a released claim's allocation is cleared unless it was seen to be
    foreign since (release follows the claim's deletion, so this only matters
    for a claim a finalizer still holds).
failed
    Kubernetes has no claim status field for "could not allocate": a Warning
    Event on the claim, and on the Pod whose unit failed, says why
    (`kube_events`: one Event per object and explanation, its count raised
    on a repeat, rate-limited).

evict (EvictionRequested, moves on)
    each Pod the allocator names is evicted through the Eviction API, which
    honours its PodDisruptionBudget (`evictions.py`: a refusal is an Event on
    the waiting Pod, not retried here).

An allocation is written as kube-scheduler writes one: first the finalizer
``resource.kubernetes.io/delete-protection`` (an update of the claim), then
``status.allocation`` and ``reservedFor`` in one status patch; a release clears
both and drops the finalizer, as the resourceclaim controller does.

The status writer consumes ALLOCATIONS in order and one event at a time, so
writes are ordered per claim; a per-claim lock keeps them ordered even if a
caller runs several at once. It uses `get`/`patch` on `resourceclaims/status`,
`patch` on `resourceclaims` (the finalizer), `get` on `pods` and `create`/`get`/`patch`
on `events`, and `create` on `pods/eviction` for the evictions the allocator asks for
(`evictions.py`) (infra/rbac.yaml grants exactly that).
"""

from __future__ import annotations

import asyncio
import enum
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, ResourceV1Api
from opentelemetry.trace import SpanKind

from dralloc import telemetry
from dralloc.bus import Permanent
from dralloc.kube import KubeSettings, api_client, body_of, check_settings, describe, merge_patch
from dralloc.schemas import events as ev
from dralloc.schemas.allocation import same_allocation
from dralloc.schemas.limits import json_problem
from dralloc.schemas.resource import AllocationResult, ResourceClaim
from dralloc.statuswriter.evictions import Evictor
from dralloc.statuswriter.kube_events import EventRecorder, Involved

log = logging.getLogger("dralloc.statuswriter.kubernetes")

MAX_ATTEMPTS = 8
"""Conflicting writes retried this many times before the event is handed back to the bus for redelivery."""

FINALIZER = "resource.kubernetes.io/delete-protection"
"""The finalizer kube-scheduler puts on a claim it allocates (resourceapi.Finalizer)."""


class Outcome(enum.Enum):
    WRITTEN = "written"
    UNCHANGED = "unchanged"
    CLEARED = "cleared"
    KEPT_FOREIGN = "kept-foreign"
    """The claim has an allocation dralloc did not make: reported, never overwritten or cleared."""
    GONE = "gone"
    """The claim no longer exists, or is another object with the same name."""
    SKIPPED = "skipped"


@dataclass(frozen=True, slots=True)
class Result:
    claim: str
    outcome: Outcome
    message: str = ""


class ConflictRetriesExhausted(Exception):
    """The claim kept changing under every write; the bus redelivers the event later."""


def consumer_of(claim: ResourceClaim) -> list[dict[str, str]]:
    """`reservedFor` for the claim: the consumer the allocator committed it for (the Pod whose unit
    it was allocated with), else the Pod that owns it as controller."""
    if claim.status is not None and claim.status.reserved_for:
        return [{"resource": r.resource, "name": r.name, "uid": r.uid} for r in claim.status.reserved_for]
    for ref in claim.metadata.owner_references:
        if ref.kind == "Pod" and ref.api_version == "v1" and ref.controller:
            return [{"resource": "pods", "name": ref.name, "uid": ref.uid}]
    return []


class KubernetesSink:
    """A `StatusSink` writing `ResourceClaim.status` through the API server (see the module doc)."""

    def __init__(
        self,
        config: Any = None,
        *,
        api: ApiClient | None = None,
        report: Callable[[Result], None] | None = None,
        settings: KubeSettings | None = None,
        tell: Callable[[ev.EvictionRefused], Awaitable[Any]] | None = None,
    ) -> None:
        """`tell`: publishes an eviction's refusal for the allocator (the bus's publish; evictions.py)."""
        env = KubeSettings.from_env()
        self.settings = settings or KubeSettings(
            server=env.server,
            kubeconfig=getattr(config, "kubeconfig", None) or env.kubeconfig,
            context=env.context,
        )
        if api is None:
            check_settings(self.settings)  # misconfigured: fail at start, not on every event
        self._api = api
        self._owns_api = api is None
        self.report = report or _log_result
        self._locks: dict[str, list[Any]] = {}
        """claim key -> [lock, users]: writes to one claim are serialised."""
        self._written: dict[str, AllocationResult] = {}
        """claim uid -> the allocation this writer wrote, to recognise it again on release."""
        self._foreign: set[str] = set()
        """uids of claims found allocated by someone else: their allocation is never cleared here."""
        self.events = EventRecorder(self._made_client)
        self.evictor = Evictor(self._client, self.events, self._pod, self._read, _classify, tell)

    async def close(self) -> None:
        if self._api is not None and self._owns_api:
            await self._api.close()
            self._api = None

    def _made_client(self) -> ApiClient:
        """The client `_client()` made: Events are recorded only from failed(), which makes it first."""
        if self._api is None:
            raise RuntimeError("the status writer records an Event before it has a Kubernetes client (or after close)")
        return self._api

    async def _client(self) -> ApiClient:
        if self._api is None:
            self._api = await api_client(self.settings, "statuswriter")
        return self._api

    async def _v1(self) -> ResourceV1Api:
        return ResourceV1Api(await self._client())

    # --- the StatusSink protocol --------------------------------------------------------------

    async def committed(self, event: ev.AllocationCommitted) -> None:
        self.report(await self._traced("write", event.key, self._commit, event))

    async def released(self, event: ev.AllocationReleased) -> None:
        self.report(await self._traced("clear", event.key, self._release, event))

    async def failed(self, event: ev.AllocationFailed) -> None:
        """No claim status field says "could not allocate": an Event on the claim (and its Pod) does."""
        await self._client()
        involved = [Involved("ResourceClaim", "resource.k8s.io/v1", event.namespace, event.name, event.uid)]
        if event.pod:
            pod = await self._pod(event.namespace, event.pod)
            if pod is not None:
                involved.append(pod)
        for target in involved:
            await self.events.record(target, event.message)
        self.report(Result(event.key, Outcome.SKIPPED, f"{event.reason}: {event.message}"))

    async def evict(self, event: ev.EvictionRequested) -> None:
        """The Pods using a claim evicted (policy/v1 Eviction) to make room for a waiting Pod (evictions.py)."""
        for done in await self.evictor.evict(event):
            log.info("%s: Pod %s %s for Pod %s/%s %s", event.key, done.pod, done.outcome, event.for_namespace, event.for_pod, done.message)

    async def _pod(self, namespace: str, name: str) -> Involved | None:
        """The Pod an Event is about (its uid: `kubectl describe` matches on it), None if gone."""
        core = CoreV1Api(await self._client())
        try:
            body = await body_of(core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status != 404:
                log.warning("Pod %s/%s not read for its Event: %s", namespace, name, describe(exc))
            return None
        uid = msgspec.json.decode(body, type=_Named).metadata.uid
        return Involved("Pod", "v1", namespace, name, uid)

    # --- decisions -----------------------------------------------------------------------------

    async def _traced(self, what: str, key: str, action: Callable[[Any], Any], event: Any) -> Result:
        # A span in the claim's trace (the status writer's consumer span is current): what was done to its status.
        namespace, _, name = key.partition("/")
        with telemetry.tracer().start_as_current_span(
            f"{what} ResourceClaim status", kind=SpanKind.CLIENT, attributes={"k8s.namespace.name": namespace, "dralloc.claim": name}
        ) as span:
            result = await self._locked(key, action, event)
            span.set_attribute("dralloc.outcome", result.outcome.value)
            return result

    async def _locked(self, key: str, action: Callable[[Any], Any], event: Any) -> Result:
        entry = self._locks.setdefault(key, [asyncio.Lock(), 0])
        entry[1] += 1
        try:
            async with entry[0]:
                return await action(event)
        finally:
            entry[1] -= 1
            if entry[1] == 0:  # no one else holds or waits for it: drop it, the map stays small
                del self._locks[key]

    async def _commit(self, event: ev.AllocationCommitted) -> Result:
        claim, want = event.claim, event.allocation
        if want is None:
            return Result(event.key, Outcome.SKIPPED, "the event carries no allocation")
        namespace, name, uid = claim.metadata.namespace or "default", claim.metadata.name, claim.metadata.uid
        want_json = msgspec.to_builtins(want)
        reserved = consumer_of(claim)
        for _ in range(MAX_ATTEMPTS):
            current = await self._read(namespace, name)
            if current is None or (uid and current.metadata.uid != uid):
                return Result(event.key, Outcome.GONE, "the claim was deleted (or re-created) before its allocation was written")
            status = current.status
            have = status.allocation if status else None
            if status is not None and have is not None:
                if not same_allocation(have, want):
                    self._written.pop(current.metadata.uid or "", None)
                    self._foreign.add(current.metadata.uid or "")
                    return Result(
                        event.key,
                        Outcome.KEPT_FOREIGN,
                        f"the claim is already allocated elsewhere ({_devices(have)}); dralloc's allocation ({_devices(want)}) was not written",
                    )
                self._written[current.metadata.uid or ""] = want
                missing = [r for r in reserved if r["uid"] not in {c.uid for c in status.reserved_for}]
                if not missing:
                    return Result(event.key, Outcome.UNCHANGED)
                patch = {"status": {"reservedFor": msgspec.to_builtins(status.reserved_for) + missing}}
            else:
                if FINALIZER not in current.metadata.finalizers:
                    # As kube-scheduler does before it writes an allocation: the claim is not deleted
                    # while allocated, and the resourceclaim controller deallocates it once unreserved.
                    current = await self._add_finalizer(namespace, name, current)
                    if current is None:
                        continue  # changed meanwhile: read it again
                patch = {"status": {"allocation": want_json, **({"reservedFor": reserved} if reserved else {})}}
            if await self._patch(namespace, name, current, patch):
                self._written[current.metadata.uid or ""] = want
                return Result(event.key, Outcome.WRITTEN, _devices(want))
        raise ConflictRetriesExhausted(f"{event.key}: status kept changing during {MAX_ATTEMPTS} attempts")

    async def _release(self, event: ev.AllocationReleased) -> Result:
        for _ in range(MAX_ATTEMPTS):
            current = await self._read(event.namespace, event.name)
            if current is None or (event.uid and current.metadata.uid != event.uid):
                return Result(event.key, Outcome.GONE, "nothing to clear: the claim is gone")
            have = current.status.allocation if current.status else None
            if have is None:
                if current.metadata.deletion_timestamp:
                    await self._remove_finalizer(event.namespace, event.name)  # a deleted claim, deallocated: let it go
                return Result(event.key, Outcome.UNCHANGED)
            ours = self._written.get(current.metadata.uid or "")
            if event.allocation is not None:  # the allocator says what it releases: clear only that
                foreign = not same_allocation(have, event.allocation)
            else:
                foreign = current.metadata.uid in self._foreign or (ours is not None and not same_allocation(have, ours))
            if foreign:
                return Result(event.key, Outcome.KEPT_FOREIGN, f"the allocation there ({_devices(have)}) is not dralloc's; kept")
            if await self._patch(event.namespace, event.name, current, {"status": {"allocation": None, "reservedFor": None}}):
                self._written.pop(current.metadata.uid or "", None)
                self._foreign.discard(current.metadata.uid or "")
                await self._remove_finalizer(event.namespace, event.name)
                return Result(event.key, Outcome.CLEARED)
        raise ConflictRetriesExhausted(f"{event.key}: status kept changing during {MAX_ATTEMPTS} attempts")

    # --- API calls (resourceclaims/status only) ---------------------------------------------------

    async def _read(self, namespace: str, name: str) -> ResourceClaim | None:
        v1 = await self._v1()
        try:
            body = await body_of(v1.read_namespaced_resource_claim_status(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return None
            raise _classify(exc) from exc
        return _claim_of(body, namespace, name)

    async def _patch(self, namespace: str, name: str, current: ResourceClaim, patch: dict[str, Any]) -> bool:
        """Patch `status` if the claim is still at the version read; False on a conflict (re-read and decide again)."""
        body = {"metadata": {"resourceVersion": current.metadata.resource_version}, **patch}
        v1 = await self._v1()
        try:
            await merge_patch(v1.patch_namespaced_resource_claim_status, name, namespace, body)
            return True
        except ApiException as exc:
            if exc.status == 409:
                log.info("%s/%s changed while writing its status (%s); reading it again", namespace, name, describe(exc))
                return False
            if exc.status == 404:
                return False  # deleted in between: the re-read says so
            raise _classify(exc) from exc

    async def _add_finalizer(self, namespace: str, name: str, current: ResourceClaim) -> ResourceClaim | None:
        """The claim with `FINALIZER` added at the version read; None on a conflict (re-read and decide again)."""
        body = {"metadata": {"resourceVersion": current.metadata.resource_version, "finalizers": [*current.metadata.finalizers, FINALIZER]}}
        v1 = await self._v1()
        try:
            return _claim_of(await merge_patch(v1.patch_namespaced_resource_claim, name, namespace, body), namespace, name)
        except ApiException as exc:
            if exc.status in (404, 409):
                return None
            raise _classify(exc) from exc

    async def _remove_finalizer(self, namespace: str, name: str) -> None:
        """Drop `FINALIZER` from a claim no longer allocated (as the resourceclaim controller does)."""
        v1 = await self._v1()
        for _ in range(MAX_ATTEMPTS):
            current = await self._read(namespace, name)
            if current is None or FINALIZER not in current.metadata.finalizers:
                return
            if current.status is not None and current.status.allocation is not None:
                return  # allocated again meanwhile: the finalizer protects that allocation now
            body = {
                "metadata": {
                    "resourceVersion": current.metadata.resource_version,
                    "finalizers": [f for f in current.metadata.finalizers if f != FINALIZER] or None,
                }
            }
            try:
                await merge_patch(v1.patch_namespaced_resource_claim, name, namespace, body)
                return
            except ApiException as exc:
                if exc.status == 404:
                    return
                if exc.status != 409:
                    raise _classify(exc) from exc


class _NamedMeta(msgspec.Struct):
    uid: str = ""


class _Named(msgspec.Struct):
    metadata: _NamedMeta = msgspec.field(default_factory=_NamedMeta)


def _claim_of(body: bytes, namespace: str, name: str) -> ResourceClaim:
    """The claim the API server answered with; `Permanent` (dead-lettered with the reason, never
    retried) when no decoder can take it: nested past the limit, an integer outside int64."""
    if (problem := json_problem(body)) is not None:
        raise Permanent(f"claim {namespace}/{name} as the cluster holds it cannot be read: {problem}")
    return msgspec.json.decode(body, type=ResourceClaim)


def _classify(exc: ApiException) -> Exception:
    """A request the API server will refuse again (invalid, forbidden) is permanent; others are retried."""
    if 400 <= exc.status < 500 and exc.status not in (408, 429):
        return Permanent(f"Kubernetes refused the status write: {describe(exc)}")
    return exc


def _devices(allocation: AllocationResult) -> str:
    return ", ".join(f"{r.driver}/{r.pool}/{r.device}" for r in allocation.devices.results) or "no devices"


def _log_result(result: Result) -> None:
    # Per claim: only what needs a person (an allocation dralloc did not make) is a warning; the
    # routine outcomes are debug, so a busy cluster's log is not a line per claim.
    if result.outcome is Outcome.KEPT_FOREIGN:
        log.warning("%s: %s", result.claim, result.message)
    else:
        log.debug("%s: %s %s", result.claim, result.outcome.value, result.message)
