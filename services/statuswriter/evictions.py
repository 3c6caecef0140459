"""Evictions the allocator asks for (`EvictionRequested`), carried out through the Eviction API.

A claim reserved for a Pod cannot be re-placed in place: to make room for a Pod that waits, the
allocator asks that the Pods using a claim in its way be evicted (services/allocator/evicting.py).
For each such Pod the status writer creates a policy/v1 Eviction (``pods/eviction``, what
``kubectl drain`` and the descheduler use), with the Pod's uid as a precondition, so a new Pod
that took the name since is never evicted for the old one. The API server checks the Pod's
PodDisruptionBudget and deletes the Pod (its controller makes a new one, which dralloc places
as any other); its claims are then deallocated or deleted by the cluster, which the allocator
hears as releases.

Outcomes per Pod:
- 201: evicted; a Normal Event ``Evicted`` on the Pod says it was evicted by dralloc to make room
  for the waiting Pod;
- a Pod the claim is not reserved for now (read from the cluster first): never evicted, logged;
- a Pod ``kubectl drain`` would not evict either (`why_not`: a static Pod's mirror, a Pod without a
  controller to make it again, a DaemonSet's Pod): not evicted, reported as a refusal (below);
- 404 (gone already) or 409 (the uid precondition: another Pod of that name now): nothing to do;
- 429 TooManyRequests (a PodDisruptionBudget forbids it now): a refusal. Logged, a Warning
  Event ``EvictionRefused`` on the waiting Pod (on each of a waiting gang's Pods: ``gangPods``)
  names the refusal, and the allocator is told (an `EvictionRefused` event on CLAIMS, its input:
  it lets go what it held for the waiting Pod and asks again only after a backoff of its own).
  Never retried here (the request is acknowledged);
- anything else: as the status writes (`kubernetes._classify`: refusals dead-lettered, the rest
  redelivered; a Pod evicted before that is then gone: 404).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from dralloc.kube import body_of, describe
from dralloc.schemas import events as ev
from dralloc.schemas.limits import json_problem
from dralloc.schemas.resource import ResourceClaim
from dralloc.statuswriter.kube_events import EventRecorder, Involved

log = logging.getLogger("dralloc.statuswriter.evictions")

EVICTED = "Evicted"
"""The reason of the Normal Event on an evicted Pod."""
REFUSED = "EvictionRefused"
"""The reason of the Warning Event on the waiting Pod when an eviction was refused."""


MIRROR = "kubernetes.io/config.mirror"
"""The annotation of a static Pod's mirror: the kubelet runs it, the API cannot evict it for good."""


class _Owner(msgspec.Struct, rename="camel"):
    kind: str = ""
    controller: bool | None = None


class _PodMeta(msgspec.Struct, rename="camel"):
    uid: str = ""
    annotations: dict[str, str] = {}
    owner_references: list[_Owner] = []


class _Pod(msgspec.Struct):
    metadata: _PodMeta = msgspec.field(default_factory=_PodMeta)


def why_not(pod: _Pod) -> str | None:
    """Why a Pod is not evicted whatever its budget says (None: it may be), as ``kubectl drain`` and the
    descheduler hold: a static Pod's mirror, a Pod no controller makes again (a bare Pod: evicted, its
    work is gone for good), a DaemonSet's Pod (made again on the same node: no room is made)."""
    meta = pod.metadata
    if MIRROR in meta.annotations:
        return "it is a static Pod (the kubelet runs it)"
    controller = next((o for o in meta.owner_references if o.controller), None)
    if controller is None:
        return "no controller would make it again (a bare Pod)"
    if controller.kind == "DaemonSet":
        return "it is a DaemonSet's Pod (made again on the same node: no room is made)"
    return None


class _Cause(msgspec.Struct):
    reason: str = ""
    message: str = ""


class _Details(msgspec.Struct):
    causes: list[_Cause] = []


class _Refusal(msgspec.Struct):
    message: str = ""
    details: _Details = msgspec.field(default_factory=_Details)


def _waiting(request: ev.EvictionRequested) -> str:
    """The unit the room is asked for, in words: its Pod, or its gang and the Pod named for it."""
    waiting = f"Pod {request.for_namespace}/{request.for_pod}" if request.for_pod else f"claim {request.for_namespace}/{request.for_claim}"
    return f"gang {request.for_namespace}/{request.gang} ({waiting})" if request.gang else waiting


def refusal(exc: ApiException) -> str:
    """The API server's words for a refused eviction: its message and causes (the budget named)."""
    try:
        status = msgspec.json.decode(exc.body or b"{}", type=_Refusal)
    except (msgspec.DecodeError, msgspec.ValidationError, TypeError):
        return describe(exc)
    causes = "; ".join(c.message for c in status.details.causes if c.message)
    text = status.message or describe(exc)
    return f"{text} ({causes})" if causes else text


@dataclass(frozen=True, slots=True)
class Evicted:
    """What became of one Pod: ``evicted``, ``gone`` or ``refused`` (and the API's words)."""

    pod: str
    outcome: str
    message: str = ""


@dataclass
class Evictor:
    """Carries out `EvictionRequested` events (see the module docstring)."""

    api: Callable[[], Awaitable[ApiClient]]
    events: EventRecorder
    pod_of: Callable[[str, str], Awaitable[Involved | None]]
    """The waiting Pod as an Event's object (its uid), None when it is gone."""
    read_claim: Callable[[str, str], Awaitable[ResourceClaim | None]]
    """The claim as the cluster holds it now (None: gone)."""
    classify: Callable[[ApiException], Exception]
    tell: Callable[[ev.EvictionRefused], Awaitable[Any]] | None = None
    """Publishes a refusal for the allocator (the bus's publish; None: not told, it waits out its patience)."""

    async def evict(self, request: ev.EvictionRequested) -> list[Evicted]:
        """Evict each Pod of the request that the claim, as the cluster holds it now, is still reserved
        for (a request names nothing else: not a Pod that stopped using it, not a claim re-created
        since, not a Pod of some other workload); returns what became of each Pod named."""
        claim = await self.read_claim(request.namespace, request.name)
        if claim is None or (request.uid and claim.metadata.uid != request.uid):
            return [Evicted(f"{request.namespace}/{ref.name}", "gone", "its claim is gone") for ref in request.pods]
        consumers = {r.uid for r in (claim.status.reserved_for if claim.status is not None else []) if r.resource == "pods" and not r.api_group}
        core = CoreV1Api(await self.api())
        out = []
        for ref in request.pods:
            if ref.resource != "pods" or ref.api_group or ref.uid not in consumers:
                log.warning("%s: %s %s is not a Pod the claim is reserved for: not evicted", request.key, ref.resource, ref.name)
                out.append(Evicted(f"{request.namespace}/{ref.name}", "skipped", "not a consumer of the claim"))
                continue
            out.append(await self._one(core, request, ref.name, ref.uid))
        return out

    async def _one(self, core: CoreV1Api, request: ev.EvictionRequested, name: str, uid: str) -> Evicted:
        namespace = request.namespace
        body = {
            "apiVersion": "policy/v1",
            "kind": "Eviction",
            "metadata": {"name": name, "namespace": namespace},
            "deleteOptions": {"preconditions": {"uid": uid}} if uid else {},
        }
        waiting = _waiting(request)
        try:
            raw = await body_of(core.read_namespaced_pod(name, namespace, _preload_content=False))
        except ApiException as exc:
            if exc.status == 404:
                return Evicted(f"{namespace}/{name}", "gone", describe(exc))
            raise self.classify(exc) from exc
        try:
            if (problem := json_problem(raw)) is not None:
                raise msgspec.DecodeError(problem)
            pod = msgspec.json.decode(raw, type=_Pod)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            return await self._refused(request, name, f"the Pod as the cluster holds it cannot be read: {str(exc)[:200]}")
        if uid and pod.metadata.uid != uid:
            return Evicted(f"{namespace}/{name}", "gone", "another Pod has its name now")
        if (reason := why_not(pod)) is not None:
            return await self._refused(request, name, f"not evicted: {reason}")
        try:
            await body_of(core.create_namespaced_pod_eviction(name, namespace, body, _preload_content=False))  # type: ignore[arg-type]  # the client sends a dict body as is
        except ApiException as exc:
            if exc.status in (404, 409):
                return Evicted(f"{namespace}/{name}", "gone", describe(exc))
            if exc.status != 429:
                raise self.classify(exc) from exc
            return await self._refused(request, name, refusal(exc))
        where = f" on node {request.node}" if request.node else ""
        message = f"evicted by dralloc to make room for {waiting}{where}: its claim {request.key} was in the way"
        await self.events.record(Involved("Pod", "v1", namespace, name, uid), message, reason=EVICTED, type_="Normal", action="Evict")
        return Evicted(f"{namespace}/{name}", "evicted")

    async def _refused(self, request: ev.EvictionRequested, name: str, words: str) -> Evicted:
        """Not evicted: logged, and a Warning Event on the waiting Pod says why (never retried here)."""
        waiting = _waiting(request)
        log.warning("Pod %s/%s not evicted to make room for %s: %s", request.namespace, name, waiting, words)
        if self.tell is not None:
            told = ev.EvictionRefused(
                namespace=request.namespace,
                name=request.name,
                uid=request.uid,
                pod=name,
                for_namespace=request.for_namespace,
                for_pod=request.for_pod,
                asked_at=request.asked_at,
                message=words[: ev.EVICTION_WORDS_MAX],
                refused_at=time.time(),
                gang=request.gang,
                for_claim=request.for_claim,
            )
            try:
                await self.tell(told)
            except Exception as exc:  # noqa: BLE001 - advisory: the allocator then waits out its patience; never evict again for it
                log.warning("%s: the allocator was not told of the refusal (it asks again after its patience): %s", request.key, exc)
        whom = f"this Pod's gang {request.gang}" if request.gang else "this Pod"
        message = f"dralloc could not evict Pod {request.namespace}/{name} (claim {request.key}) to make room for {whom}: {words}"
        for waiting_pod in told_pods(request):
            target = await self.pod_of(request.for_namespace, waiting_pod)
            if target is not None:
                await self.events.record(target, message, reason=REFUSED, action="Evict")
        return Evicted(f"{request.namespace}/{name}", "refused", words)


def told_pods(request: ev.EvictionRequested) -> list[str]:
    """The waiting Pods a refusal of `request` is told to by an Event: every member's of its gang
    (``gangPods``), else its Pod; none for a claim of its own (no Pod waits)."""
    return list(dict.fromkeys([request.for_pod, *request.gang_pods] if request.for_pod else request.gang_pods))
