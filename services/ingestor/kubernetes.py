"""The Kubernetes claim source: list, then watch, what a cluster has, and say it as bus events.

Each watched collection (ResourceClaims in all namespaces or in each listed
namespace, DeviceClasses, and when asked the ResourceSlices other DRA drivers
publish) runs one `Reflector`, the loop client-go's reflector runs:

1. list, remember the collection's resourceVersion;
2. watch from it with bookmarks; every event (and bookmark) advances the
   version, so a watch that ends (server timeout, connection loss) resumes
   from where it stopped and nothing is replayed or lost;
3. when the version has expired (410 Gone, as an ERROR event or a response),
   list again and compare with what was known: objects that vanished in the gap
   are reported deleted, so no deletion is lost either.

Objects are decoded straight from the API's JSON into dralloc's
`resource.k8s.io/v1` Structs (the generated client models are skipped: they are
slow and not what the bus carries); an object that does not decode is reported
and skipped, the watch goes on.

What is published:
- a claim -> `ClaimSubmitted` with ``cluster`` set: the claim as the cluster
  holds it, status included, on every change of the object (the message id
  carries its resourceVersion), so an allocation written or cleared by anyone
  reaches the allocator, which follows it (adopts an allocation made
  elsewhere, releases its own decision when the cluster holds another one or
  none any more). ``needs_pod`` (unless `KubeSourceOptions.unused_claims` is
  ``allocate``): the claim is allocated only with a gated Pod that uses it.
  A claim deleted (or given a deletionTimestamp) -> `ClaimDeleted`.
- a Pod carrying dralloc's scheduling gate -> `PodSubmitted` (its claims, one
  unit), its deletion -> `PodDeleted`; the gate is lifted once its claims are
  allocated (`dralloc.ingestor.podgate`).
- DeviceClass / ResourceSlice / DeviceTaintRule -> `...Published` / `...Removed`
  (DeviceTaintRules through `taintrules`: the v1 kind the generated client lacks).
Every event's `Nats-Msg-Id` is its content identity (claim uid + generation),
and the source also skips an event identical to the last one it produced for
the same subject (seeded at start from what the bus holds, `seed`), so a
restart or a re-list does not submit a handled claim again.

Pods with `resourceClaimTemplateName` entries get their generated claims the
way Kubernetes' resourceclaim controller makes them (`ClaimController`), when
`claim_templates` is on (off by default: a cluster runs the real controller).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import re
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

import aiohttp
import msgspec
from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api, ResourceV1Api

from dralloc.bus import Bus
from dralloc.ingestor import taintrules
from dralloc.ingestor.podgate import GatedPod, PodGate
from dralloc.ingestor.sources import Report, SourceEvent
from dralloc.kube import KubeSettings, api_client, body_of, describe, ensure_ok
from dralloc.manifests import unknown_fields
from dralloc.pods import POD_CLAIM_NAME_ANNOTATION, claim_from_template
from dralloc.schemas import events as ev
from dralloc.schemas.limits import json_problem, without_deep_items
from dralloc.schemas.resource import (
    DeviceClass,
    DeviceTaintRule,
    ObjectMeta,
    Pod,
    ResourceClaim,
    ResourceClaimTemplate,
    ResourceSlice,
    to_builtins,
)

log = logging.getLogger("dralloc.ingestor.kubernetes")


class _Listed(Protocol):
    """What a reflector follows: a Kubernetes object (its metadata carries the resourceVersion)."""

    @property
    def metadata(self) -> ObjectMeta: ...


T = TypeVar("T", bound=_Listed)

WATCH_SECONDS = 300
"""Server-side watch timeout: the watch is renewed (from its resourceVersion) this often."""


class _ListMeta(msgspec.Struct):
    resourceVersion: str = ""  # noqa: N815 (the API's name)


class _RawList(msgspec.Struct):
    metadata: _ListMeta = msgspec.field(default_factory=_ListMeta)
    items: list[msgspec.Raw] = []


class _RawEvent(msgspec.Struct):
    type: str
    object: msgspec.Raw


class _Bookmark(msgspec.Struct):
    metadata: _ListMeta


class Gone(Exception):
    """The resourceVersion has expired: list again."""


@dataclass
class Reflector(Generic[T]):
    """List + watch one collection; calls `on_change(kind, obj)` with ADDED/MODIFIED/DELETED, in order."""

    what: str
    """For messages: `resourceclaims`, `deviceclasses`, ..."""
    lister: Callable[..., Awaitable[Any]]
    """A generated `list_*` method of the client, already bound to its namespace when namespaced."""
    item_type: type[T]
    on_change: Callable[[str, T], Awaitable[None]]
    report: Report
    watch_seconds: int = WATCH_SECONDS
    known: dict[str, T] = field(default_factory=dict)
    resource_version: str = ""
    synced: asyncio.Event = field(default_factory=asyncio.Event)
    """Set once the first list has been delivered."""
    check_fields: bool = False
    """Report the fields of the object's spec dralloc does not know (`_report_unknown`): the resource.k8s.io kinds."""
    unknown_seen: set[str] = field(default_factory=set)
    """The unknown fields reported, indices left out: each is said once per run."""

    async def run(self, stop: asyncio.Event) -> None:
        delay = 0.1
        while not stop.is_set():
            try:
                if not self.resource_version:
                    await self._relist()
                    self.synced.set()
                await self._watch(stop)
                delay = 0.1
            except Gone:
                log.info("%s: resourceVersion %s expired; listing again", self.what, self.resource_version)
                self.resource_version = ""
            except ApiException as exc:
                self.report(f"{self.what}: {describe(exc)}; retrying in {delay:.1f}s")
                await _sleep(stop, delay)
                delay = min(delay * 2, 10.0)
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                self.report(f"{self.what}: API server unreachable ({exc or type(exc).__name__}); retrying in {delay:.1f}s")
                await _sleep(stop, delay)
                delay = min(delay * 2, 10.0)

    async def _relist(self) -> None:
        body = await body_of(self.lister(_preload_content=False))
        unreadable: list[str] = []
        if (problem := json_problem(body)) is not None:  # an item too deep for any decoder: cut it out first
            body, unreadable = without_deep_items(body)
            for name in unreadable:
                self.report(f"{self.what}: {self.item_type.__name__}/{name} skipped: {problem}")
        page = msgspec.json.decode(body, type=_RawList)
        current: dict[str, T] = {}
        kept = set(unreadable)  # an object that cannot be read now is not taken for deleted
        for raw in page.items:
            if len(raw) == 4 and bytes(raw) == b"null":
                continue  # cut out above, and reported
            obj = self._decode(raw)
            if obj is not None:
                current[_key(obj)] = obj
            else:
                kept.add(_name_of(raw))
        # Deletions that happened while no watch was open are found by comparing with what was known.
        for key in sorted(self.known.keys() - current.keys() - kept):
            await self.on_change("DELETED", self.known.pop(key))
        for key, obj in current.items():
            kind = "MODIFIED" if key in self.known else "ADDED"
            self.known[key] = obj
            await self.on_change(kind, obj)
        self.resource_version = page.metadata.resourceVersion

    async def _watch(self, stop: asyncio.Event) -> None:
        response = await self.lister(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=self.watch_seconds,
            _preload_content=False,
            # No total timeout on a stream; a silent connection is dropped after a bookmark interval's worth.
            _request_timeout=aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=self.watch_seconds + 60),
        )
        stopping = asyncio.ensure_future(stop.wait())
        reading: asyncio.Future[bytes] | None = None
        try:
            if response.status == 410:
                raise Gone()
            await ensure_ok(response)
            while True:
                reading = asyncio.ensure_future(response.content.readline())
                done, _ = await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
                if reading not in done:
                    return
                line = reading.result()
                if not line:
                    return  # the server ended the watch; resume from resource_version
                await self._event(line)
        finally:
            stopping.cancel()
            if reading is not None and not reading.done():
                reading.cancel()
                # Releasing the response may still fail the read; that outcome is of no interest now.
                reading.add_done_callback(lambda f: f.cancelled() or f.exception())
            response.release()

    async def _event(self, line: bytes) -> None:
        if (problem := json_problem(line)) is not None:
            _, names = without_deep_items(line, level=1)  # (to name the object, when it is too deep)
            self.report(f"{self.what}: watch event for {self.item_type.__name__}/{(names or ['?'])[0]} skipped: {problem}")
            return
        try:
            event = msgspec.json.decode(line, type=_RawEvent)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            self.report(f"{self.what}: undecodable watch event skipped: {exc}")
            return
        if event.type == "ERROR":
            status = msgspec.json.decode(event.object)
            if isinstance(status, dict) and status.get("code") == 410:
                raise Gone()
            raise ApiException(status=status.get("code", 500) if isinstance(status, dict) else 500, reason=f"watch error: {status}")
        if event.type == "BOOKMARK":
            self.resource_version = msgspec.json.decode(event.object, type=_Bookmark).metadata.resourceVersion
            return
        obj = self._decode(event.object)
        if obj is None:
            return
        key = _key(obj)
        if event.type == "DELETED":
            self.known.pop(key, None)
        else:
            self.known[key] = obj
        self.resource_version = obj.metadata.resource_version or self.resource_version
        await self.on_change(event.type, obj)

    def _decode(self, raw: msgspec.Raw) -> T | None:
        if (problem := json_problem(raw)) is not None:
            self.report(f"{self.what}: {self.item_type.__name__}/{_name_of(raw)} skipped: {problem}")
            return None
        try:
            obj = msgspec.json.decode(raw, type=self.item_type)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            name = _name_of(raw)
            self.report(f"{self.what}: {self.item_type.__name__}/{name} skipped: {exc}")
            return None
        if self.check_fields:
            self._report_unknown(raw)
        return obj

    def _report_unknown(self, raw: msgspec.Raw) -> None:
        """Say which fields of the object's `spec` dralloc does not know, each once: the API server
        has checked them, so they are a newer Kubernetes' (or a feature's dralloc does not read), and
        the decoded object goes on without them, as a Kubernetes scheduler older than its API
        server goes on (Go drops a field it does not know). A field that restricts allocation (as
        1.37's compatibilityGroups did before dralloc read them) would otherwise be ignored in
        silence. Only `spec` is decoded again (metadata, managedFields and status are skipped, not
        built): 7-10 us a claim (its typed decode 4-5), 0.1 ms an 8-GPU slice, 1.2-2.4 ms a 52-device
        MIG slice. At most UNKNOWN_REPORTED distinct fields are said per watch and run, then that
        no more will be: a newer Kubernetes adds a few, and an API server (or a proxy in front
        of one) sending thousands of made-up names gets one line, not a line and a set entry each."""
        if len(self.unknown_seen) > UNKNOWN_REPORTED:
            return  # (said that no more will be said)
        spec = msgspec.json.decode(raw, type=_Spec).spec
        if not isinstance(spec, dict):
            return  # (no spec, or not an object: the typed decode has said so already)
        for path in unknown_fields({"spec": spec}, self.item_type):
            general = _INDEX.sub("[]", path)
            if general in self.unknown_seen:
                continue
            self.unknown_seen.add(general)
            if len(self.unknown_seen) > UNKNOWN_REPORTED:
                self.report(f"{self.what}: more than {UNKNOWN_REPORTED} fields dralloc does not know; no more are reported in this run")
                return
            self.report(
                f"{self.what}: {self.item_type.__name__}/{_name_of(raw)}: field {path} is not one dralloc knows "
                "(a newer Kubernetes?); ignored, here and wherever else it appears"
            )


UNKNOWN_REPORTED = 50
"""Distinct unknown fields a reflector says per run (`Reflector._report_unknown`)."""


class _Spec(msgspec.Struct):
    """An object's `spec` alone, the rest of it skipped by the decoder (`Reflector._report_unknown`)."""

    spec: Any = None


_INDEX = re.compile(r"\[[^\]]*\]")


def _key(obj: Any) -> str:
    meta = obj.metadata
    return f"{meta.namespace}/{meta.name}" if meta.namespace else meta.name


def _name_of(raw: msgspec.Raw) -> str:
    try:
        meta = msgspec.json.decode(raw).get("metadata", {})
        return f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name"))
    except Exception:  # noqa: BLE001 - only for a message about an object that is already bad
        return "?"


async def _sleep(stop: asyncio.Event, seconds: float) -> None:
    try:
        await asyncio.wait_for(stop.wait(), seconds)
    except TimeoutError:
        pass


# --- what each change publishes (pure) ---------------------------------------------------------


def claim_events(kind: str, claim: ResourceClaim, *, needs_pod: bool = False) -> list[SourceEvent]:
    """A claim as the cluster holds it (`cluster`: its status is the truth); `needs_pod`: allocated
    only with a Pod that uses it (Kubernetes' delayed allocation)."""
    meta = claim.metadata
    if kind == "DELETED" or meta.deletion_timestamp:
        return [ev.ClaimDeleted(namespace=meta.namespace or "default", name=meta.name, uid=meta.uid or "")]
    return [ev.ClaimSubmitted(claim=claim, cluster=True, needs_pod=needs_pod)]


def class_events(kind: str, device_class: DeviceClass) -> list[SourceEvent]:
    if kind == "DELETED" or device_class.metadata.deletion_timestamp:
        return [ev.DeviceClassRemoved(name=device_class.metadata.name)]
    return [ev.DeviceClassPublished(device_class=device_class)]


def slice_events(kind: str, resource_slice: ResourceSlice) -> list[SourceEvent]:
    if kind == "DELETED" or resource_slice.metadata.deletion_timestamp:
        spec = resource_slice.spec
        return [ev.ResourceSliceRemoved(name=resource_slice.metadata.name, driver=spec.driver, pool=spec.pool.name, generation=spec.pool.generation)]
    return [ev.ResourceSlicePublished(slice=resource_slice)]


# --- the source ------------------------------------------------------------------------------


@dataclass
class KubeSourceOptions:
    namespaces: list[str] = field(default_factory=list)
    """Empty: all namespaces."""
    slices: bool = False
    """Also publish the ResourceSlices the cluster's DRA drivers write."""
    claim_templates: bool = False
    """Create the claims Pods ask for through templates (the resourceclaim controller's job)."""
    pods: bool = True
    """Handle the Pods that carry dralloc's scheduling gate (`podgate`): their claims allocated as one unit."""
    unused_claims: str = "pending"
    """Claims no gated Pod uses: ``pending`` (Kubernetes' delayed allocation: they wait for a Pod)
    or ``allocate`` (each allocated on its own as soon as it fits, as claims from files are)."""
    settings: KubeSettings = field(default_factory=KubeSettings)
    watch_seconds: int = WATCH_SECONDS

    @classmethod
    def from_config(cls, config: Any) -> KubeSourceOptions:
        """From the ingestor's `Config` (`namespace`: one or a comma-separated list, `kubeconfig`) and the
        environment: ``DRALLOC_INGESTOR_SLICES``, ``DRALLOC_INGESTOR_CLAIM_TEMPLATES``, ``DRALLOC_INGESTOR_PODS``
        (true/false), ``DRALLOC_INGESTOR_UNUSED_CLAIMS`` (pending/allocate), ``DRALLOC_KUBE_SERVER``,
        ``DRALLOC_KUBE_CONTEXT``."""
        namespaces = [ns.strip() for ns in (getattr(config, "namespace", None) or "").split(",") if ns.strip()]
        env = KubeSettings.from_env()
        unused = os.environ.get("DRALLOC_INGESTOR_UNUSED_CLAIMS", "pending").strip().lower() or "pending"
        if unused not in ("pending", "allocate"):
            raise ValueError(f"DRALLOC_INGESTOR_UNUSED_CLAIMS must be pending or allocate, not {unused!r}")
        return cls(
            namespaces=namespaces,
            slices=_env_flag("DRALLOC_INGESTOR_SLICES"),
            claim_templates=_env_flag("DRALLOC_INGESTOR_CLAIM_TEMPLATES"),
            pods=os.environ.get("DRALLOC_INGESTOR_PODS", "true").strip().lower() not in ("0", "false", "no", "off"),
            unused_claims=unused,
            settings=KubeSettings(server=env.server, kubeconfig=getattr(config, "kubeconfig", None) or env.kubeconfig, context=env.context),
        )


class KubernetesSource:
    """A `ClaimSource` over a cluster's API server (see the module doc)."""

    def __init__(self, config: Any, report: Report, *, options: KubeSourceOptions | None = None) -> None:
        self.options = options or KubeSourceOptions.from_config(config)
        self.report = report
        self.last: dict[str, str] = {}
        """subject -> msg id of the last event produced for it: an identical event is not produced again."""
        self.reflectors: list[Reflector[Any]] = []
        self.gate: PodGate | None = None

    async def seed(self, bus: Bus) -> None:
        """Resume: what the bus already holds (the last event per subject) is not produced again."""
        for stream in ("CLAIMS", "INVENTORY"):
            events, _ = await bus.replay(stream)
            self.last.update((event.subject, event.msg_id) for event in events)

    async def events(self, stop: asyncio.Event) -> AsyncIterator[SourceEvent]:
        queue: asyncio.Queue[SourceEvent] = asyncio.Queue(maxsize=1024)
        async with await api_client(self.options.settings, "ingestor") as api:
            self.reflectors = self._reflectors(api, queue)
            tasks = [asyncio.create_task(r.run(stop), name=f"reflector {r.what}") for r in self.reflectors]
            if self.options.claim_templates:
                controller = ClaimController(api, self.report, self._claims_reflectors(), self.options.namespaces)
                tasks.append(asyncio.create_task(controller.run(stop, self.options.watch_seconds), name="claim controller"))
            if self.gate is not None:
                tasks.append(asyncio.create_task(self._run_gate(stop), name="pod gate"))
            stopping = asyncio.ensure_future(stop.wait())
            try:
                while True:
                    getting = asyncio.ensure_future(queue.get())
                    done, _ = await asyncio.wait({getting, stopping, *tasks}, return_when=asyncio.FIRST_COMPLETED)
                    if getting in done:
                        yield getting.result()
                        continue
                    getting.cancel()
                    for task in done & set(tasks):
                        task.result()  # a reflector only ends by raising a bug: let it surface
                    return
            finally:
                stopping.cancel()
                for task in tasks:
                    task.cancel()
                await asyncio.gather(*tasks, return_exceptions=True)

    def _reflectors(self, api: ApiClient, queue: asyncio.Queue[SourceEvent]) -> list[Reflector[Any]]:
        v1 = ResourceV1Api(api)

        async def publish(event: SourceEvent) -> None:
            if self.last.get(event.subject) != event.msg_id:
                self.last[event.subject] = event.msg_id
                await queue.put(event)

        if self.options.pods:
            self.gate = PodGate(
                api, self.report, self._known_claims, self._known_classes, publish, submitted=lambda subject: self.last.get(subject, "").startswith("pod:")
            )

        def sink(mapper: Callable[[str, Any], list[SourceEvent]]) -> Callable[[str, Any], Awaitable[None]]:
            async def on_change(kind: str, obj: Any) -> None:
                for event in mapper(kind, obj):
                    await publish(event)
                if self.gate is not None and isinstance(obj, ResourceClaim):
                    await self.gate.claim_changed(obj)  # after the claim's own event: the bus has it first

            return on_change

        needs_pod = self.options.pods and self.options.unused_claims == "pending"
        claim_events_here = functools.partial(claim_events, needs_pod=needs_pod)

        def reflector(what: str, lister: Callable[..., Awaitable[Any]], item_type: type, mapper: Callable[[str, Any], list[SourceEvent]]) -> Reflector[Any]:
            return Reflector(what, lister, item_type, sink(mapper), self.report, watch_seconds=self.options.watch_seconds, check_fields=True)

        found = [
            reflector("deviceclasses", v1.list_device_class, DeviceClass, class_events),
            reflector("devicetaintrules", taintrules.lister(api), DeviceTaintRule, taintrules.taint_rule_events),
        ]
        if self.options.slices:
            found.append(reflector("resourceslices", v1.list_resource_slice, ResourceSlice, slice_events))
        if self.options.namespaces:
            for namespace in self.options.namespaces:
                lister = _bind(v1.list_namespaced_resource_claim, namespace)
                found.append(reflector(f"resourceclaims in {namespace}", lister, ResourceClaim, claim_events_here))
        else:
            found.append(reflector("resourceclaims", v1.list_resource_claim_for_all_namespaces, ResourceClaim, claim_events_here))
        return found

    def _claims_reflectors(self) -> list[Reflector[ResourceClaim]]:
        return [r for r in self.reflectors if r.item_type is ResourceClaim]

    def _known_claims(self) -> Iterable[ResourceClaim]:
        for reflector in self._claims_reflectors():
            yield from reflector.known.values()

    def _known_classes(self) -> Iterable[DeviceClass]:
        for reflector in self.reflectors:
            if reflector.item_type is DeviceClass:
                yield from reflector.known.values()

    async def _run_gate(self, stop: asyncio.Event) -> None:
        """Follow the Pods (once the claims and classes they refer to are listed) for the gate."""
        assert self.gate is not None
        for reflector in self.reflectors:
            if reflector.item_type in (ResourceClaim, DeviceClass):
                await reflector.synced.wait()
        core = self.gate.core
        listers = [("pods in " + ns, _bind(core.list_namespaced_pod, ns)) for ns in self.options.namespaces] or [("pods", core.list_pod_for_all_namespaces)]
        reflectors = [Reflector(what, lister, GatedPod, self.gate.on_pod, self.report, watch_seconds=self.options.watch_seconds) for what, lister in listers]
        await asyncio.gather(*(r.run(stop) for r in reflectors))


def _env_flag(name: str) -> bool:
    return os.environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")


def _bind(method: Callable[..., Awaitable[Any]], namespace: str) -> Callable[..., Awaitable[Any]]:
    async def call(**kwargs: Any) -> Any:
        return await method(namespace, **kwargs)

    return call


# --- Pods and ResourceClaimTemplates -------------------------------------------------------------


class _PodClaimStatus(msgspec.Struct, rename="camel", kw_only=True):
    name: str
    resource_claim_name: str | None = None


class _PodStatus(msgspec.Struct, rename="camel", kw_only=True):
    resource_claim_statuses: list[_PodClaimStatus] = []


class PodWithStatus(Pod, kw_only=True):
    """A Pod with the one status field the controller reads and writes."""

    status: _PodStatus | None = None


class ClaimController:
    """Creates the ResourceClaim each Pod's template entry asks for, as Kubernetes' resourceclaim controller does.

    For every Pod entry with `resourceClaimTemplateName` and no claim yet: a claim
    from the template (`generateName` `<pod>-<entry>-`, owner reference to the
    Pod, annotation `resource.kubernetes.io/pod-claim-name`), created through the
    API (so the API server picks the name); then the Pod's
    `status.resourceClaimStatuses` records the generated name. An entry the Pod's
    status already names, or whose claim exists (owner uid + annotation, among
    the claims being watched or created here), creates nothing: a restart or a
    repeated Pod event never makes a second claim.
    """

    def __init__(self, api: ApiClient, report: Report, claims: Iterable[Reflector[ResourceClaim]], namespaces: list[str]) -> None:
        self.core = CoreV1Api(api)
        self.resource = ResourceV1Api(api)
        self.report = report
        self.claims = list(claims)
        self.namespaces = namespaces
        self.created: dict[tuple[str, str], str] = {}
        """(pod uid, entry name) -> claim name, for claims whose ADDED event may not have arrived yet."""

    async def run(self, stop: asyncio.Event, watch_seconds: int) -> None:
        for reflector in self.claims:
            await reflector.synced.wait()  # know the existing claims before creating any
        listers = [("pods in " + ns, _bind(self.core.list_namespaced_pod, ns)) for ns in self.namespaces] or [("pods", self.core.list_pod_for_all_namespaces)]
        reflectors = [Reflector(what, lister, PodWithStatus, self.on_pod, self.report, watch_seconds=watch_seconds) for what, lister in listers]
        await asyncio.gather(*(r.run(stop) for r in reflectors))

    async def on_pod(self, kind: str, pod: PodWithStatus) -> None:
        if kind == "DELETED" or pod.metadata.deletion_timestamp:
            return  # its claims go with it (owner references: the garbage collector's job)
        recorded = {s.name: s.resource_claim_name for s in (pod.status.resource_claim_statuses if pod.status else [])}
        statuses = dict(recorded)
        for entry in pod.spec.resource_claims:
            if entry.resource_claim_template_name is None or recorded.get(entry.name):
                continue
            try:
                statuses[entry.name] = await self._claim_for(pod, entry)
            except ApiException as exc:
                self.report(f"Pod {pod.metadata.namespace}/{pod.metadata.name} claim {entry.name!r}: {describe(exc)}")
            except ValueError as exc:  # its template cannot be read (too deep, does not decode): the others go on
                self.report(f"Pod {pod.metadata.namespace}/{pod.metadata.name} claim {entry.name!r}: {exc}")
        if statuses != recorded:
            # The whole list, so that merge and strategic-merge semantics give the same result.
            patch = {"status": {"resourceClaimStatuses": [{"name": name, "resourceClaimName": claim} for name, claim in sorted(statuses.items())]}}
            try:
                await self.core.patch_namespaced_pod_status(pod.metadata.name, pod.metadata.namespace or "default", patch)
            except ApiException as exc:
                self.report(f"Pod {pod.metadata.namespace}/{pod.metadata.name}: recording its claims failed: {describe(exc)}")

    def _existing(self, pod: Pod, entry_name: str) -> str | None:
        made = self.created.get((pod.metadata.uid or "", entry_name))
        if made:
            return made
        for reflector in self.claims:
            for claim in reflector.known.values():
                meta = claim.metadata
                if (
                    meta.namespace == pod.metadata.namespace
                    and meta.annotations.get(POD_CLAIM_NAME_ANNOTATION) == entry_name
                    and any(ref.uid == pod.metadata.uid and ref.controller for ref in meta.owner_references)
                ):
                    return meta.name
        return None

    async def _claim_for(self, pod: Pod, entry: Any) -> str:
        existing = self._existing(pod, entry.name)
        if existing:
            return existing
        namespace = pod.metadata.namespace or "default"
        body = await body_of(self.resource.read_namespaced_resource_claim_template(entry.resource_claim_template_name, namespace, _preload_content=False))
        if (problem := json_problem(body)) is not None:  # (a ValueError, as a template that does not decode is)
            raise ValueError(f"ResourceClaimTemplate {namespace}/{entry.resource_claim_template_name}: {problem}")
        template = msgspec.json.decode(body, type=ResourceClaimTemplate)
        wanted = claim_from_template(pod, entry, template, suffix="")
        # No name: the API server completes `generateName`, as for the real controller's claims.
        claim_body = to_builtins(msgspec.structs.replace(wanted, metadata=msgspec.structs.replace(wanted.metadata, name="")))
        sent = self.resource.create_namespaced_resource_claim(namespace, claim_body, _preload_content=False)  # type: ignore[arg-type]  # the client sends a dict body as is; the stub names the model only
        claim = msgspec.json.decode(await body_of(sent), type=ResourceClaim)
        self.created[(pod.metadata.uid or "", entry.name)] = claim.metadata.name
        log.info("created ResourceClaim %s/%s for Pod %s", namespace, claim.metadata.name, pod.metadata.name)
        return claim.metadata.name
