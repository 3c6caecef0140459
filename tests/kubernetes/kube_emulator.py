"""An in-memory Kubernetes API server that behaves like the real one where dralloc depends on it.

kmock's `KubernetesEmulator` keeps objects as plain dicts with one constant
resourceVersion, replays everything on `watch=True` and has no subresources, so
a client that resumes watches, handles 410 Gone or relies on optimistic
concurrency cannot be tested against it. This module keeps kmock's HTTP server,
request parsing, discovery endpoints, Status error rendering and its reaction DSL
(tests can still inject faults with ``server[...] << 500``: user reactions win
over the emulator's), and replaces the object store with one that follows the
API server's contract:

- one cluster-wide resourceVersion counter; every write bumps it and stamps the
  object (`uid`, `generation`, `creationTimestamp` too);
- list returns the collection's resourceVersion; watch from a resourceVersion
  replays exactly the later events, sends BOOKMARKs when asked, ends after
  `timeoutSeconds`, and answers an ERROR event with a 410 Status ("Expired")
  when the version has been compacted away;
- create (201, `generateName`, 409 AlreadyExists), get, delete (finalizers set a
  deletionTimestamp; preconditions give 409), replace and patch (merge,
  strategic-merge treated as merge for the fields used here, JSON patch) with
  409 Conflict when the body names a stale `metadata.resourceVersion`;
- the `status` subresource: writes to the main resource keep status, writes to
  `/status` change only status; ResourceClaim status follows the API's
  validation (an allocation is never replaced by a different one;
  `reservedFor` needs an allocation) and every ResourceClaim write is decoded
  with dralloc's own `resource.k8s.io/v1` model, so a malformed body is a 422.

Test controls: `before_write` runs a hook before a client's write is applied, `compact()`
makes every older resourceVersion expire,
`close_watches()` ends open streams (as an API server restart would),
`hold_watches()` / `release_watches()` keep new watches waiting (a network
partition), `apply()` / `remove()` change objects as another client would.
"""

from __future__ import annotations

import asyncio
import copy
import datetime
import json
import secrets
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import attrs
import msgspec
from kmock import KubernetesError, KubernetesScaffold, Request, Response, resource

from dralloc.schemas.resource import ResourceClaim

RESOURCE_GROUP = "resource.k8s.io"


@dataclass(frozen=True)
class Kind:
    group: str
    version: str
    plural: str
    kind: str
    namespaced: bool
    status: bool  # has a status subresource

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version


KINDS = [
    Kind(RESOURCE_GROUP, "v1", "resourceclaims", "ResourceClaim", True, True),
    Kind(RESOURCE_GROUP, "v1", "resourceclaimtemplates", "ResourceClaimTemplate", True, False),
    Kind(RESOURCE_GROUP, "v1", "deviceclasses", "DeviceClass", False, False),
    Kind(RESOURCE_GROUP, "v1", "resourceslices", "ResourceSlice", False, False),
    Kind(RESOURCE_GROUP, "v1", "devicetaintrules", "DeviceTaintRule", False, True),
    Kind("", "v1", "pods", "Pod", True, True),
    Kind("", "v1", "events", "Event", True, False),
    Kind("policy", "v1", "poddisruptionbudgets", "PodDisruptionBudget", True, True),
]

DISRUPTION_BUDGET = "Cannot evict pod as it would violate the pod's disruption budget."
"""The API server's message for an eviction a PodDisruptionBudget forbids (429)."""
CLAIM_FINALIZER = "resource.kubernetes.io/delete-protection"

Key = tuple[str, str | None, str]  # (plural, namespace, name)


@dataclass
class _Watcher:
    kind: Kind
    namespace: str | None
    queue: asyncio.Queue[tuple[str, dict[str, Any]] | None] = field(default_factory=asyncio.Queue)


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _flag(value: str | None) -> bool:
    """A boolean query parameter as the API server parses it (Go's strconv.ParseBool)."""
    return value in ("1", "t", "T", "TRUE", "true", "True")


def _status(code: int, reason: str, message: str, **details: Any) -> KubernetesError:
    return KubernetesError(status=code, reason=reason, message=message, details=details or {"causes": []})


def _selects(selector: dict[str, Any] | None, labels: dict[str, str]) -> bool:
    """A label selector (matchLabels, matchExpressions In/NotIn/Exists/DoesNotExist) against labels;
    a missing selector selects nothing, an empty one everything (policy/v1 PodDisruptionBudget)."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expression in selector.get("matchExpressions") or []:
        key, operator, values = expression.get("key"), expression.get("operator"), expression.get("values") or []
        present = key in labels
        ok = {
            "In": present and labels.get(key) in values,
            "NotIn": not present or labels.get(key) not in values,
            "Exists": present,
            "DoesNotExist": not present,
        }.get(operator, False)
        if not ok:
            return False
    return True


def merge_patch(target: Any, patch: Any) -> Any:
    """RFC 7386 JSON merge patch."""
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    result = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            result.pop(key, None)
        else:
            result[key] = merge_patch(result.get(key), value)
    return result


def json_patch(doc: Any, ops: list[dict[str, Any]]) -> Any:
    """RFC 6902 JSON patch: add, remove, replace, test (what clients send for status)."""
    doc = copy.deepcopy(doc)
    for op in ops:
        parts = [p.replace("~1", "/").replace("~0", "~") for p in op["path"].split("/")[1:]]
        parent = doc
        for part in parts[:-1]:
            parent = parent[int(part)] if isinstance(parent, list) else parent[part]
        last = parts[-1] if parts else None
        kind = op["op"]
        try:
            if kind == "test":
                current = parent[int(last)] if isinstance(parent, list) else parent[last]
                if current != op["value"]:
                    raise _status(422, "Invalid", f"test operation failed at {op['path']}")
            elif kind == "remove":
                del parent[int(last) if isinstance(parent, list) else last]
            elif kind in ("add", "replace"):
                if isinstance(parent, list):
                    index = len(parent) if last == "-" else int(last)
                    if kind == "add":
                        parent.insert(index, op["value"])
                    else:
                        parent[index] = op["value"]
                else:
                    if kind == "replace" and last not in parent:
                        raise KeyError(last)
                    parent[last] = op["value"]
            else:
                raise _status(422, "Invalid", f"unsupported JSON patch operation {kind!r}")
        except (KeyError, IndexError, ValueError, TypeError) as exc:
            raise _status(422, "Invalid", f"JSON patch {kind} at {op['path']}: {exc!r}") from exc
    return doc


@attrs.define(kw_only=True)
class ApiServer(KubernetesScaffold):
    """kmock's Kubernetes scaffold with a faithful store for the kinds in `KINDS`."""

    history: int = 10_000
    """Events kept for watch resumption; older resourceVersions answer 410 Gone."""
    bookmark_interval: float = 0.2
    """Seconds between BOOKMARK events on an idle watch that asked for them."""
    max_watch_seconds: float | None = None
    """Server-side cap on a watch's duration (the API server's --min-request-timeout)."""

    _objects: dict[Key, dict[str, Any]] = attrs.field(factory=dict, init=False)
    _rv: int = attrs.field(default=1, init=False)
    _log: list[tuple[int, Kind, str, dict[str, Any]]] = attrs.field(factory=list, init=False)
    _compacted: int = attrs.field(default=0, init=False)
    _watchers: list[_Watcher] = attrs.field(factory=list, init=False)
    _gate: asyncio.Event = attrs.field(factory=asyncio.Event, init=False)
    writes: list[tuple[str, str, Key]] = attrs.field(factory=list, init=False)
    """(verb, subresource, key) of every successful write, for assertions on what a client did."""
    claim_controller: bool = False
    """Play the resourceclaim controller's part for a Pod that is gone (`_unreserve`); off by default,
    as the tests written before it expect nothing of it."""
    disabled_gates: set[str] = attrs.field(factory=set, init=False)
    """Test control: feature gates switched off; a claim's status write loses their result fields
    unless the claim used them before (`_drop_disabled_status_fields`)."""
    before_write: list[Any] = attrs.field(factory=list, init=False)
    """Test control: callables `(subresource, key, body)` run when a client's replace or patch
    arrives, before it is applied (another client's write landing first: a race made exact)."""

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._gate.set()
        for kind in KINDS:
            res = resource(kind.group, kind.version, kind.plural)
            self.resources[res] = self.ResourceInfo(
                kind=kind.kind,
                namespaced=kind.namespaced,
                subresources=(["status"] if kind.status else []) + (["binding", "eviction"] if kind.plural == "pods" else []),
                verbs=["get", "list", "watch", "create", "update", "patch", "delete"],
            )
            # Above kmock's discovery fallbacks, below any reaction a test adds.
            (self.fallback**1)[res] << self._serve

    # --- test controls ----------------------------------------------------------------

    @property
    def resource_version(self) -> int:
        return self._rv

    def compact(self) -> None:
        """Forget the event history: a watch from any older resourceVersion gets 410 Gone."""
        self._compacted = self._rv
        self._log.clear()

    def close_watches(self) -> None:
        for watcher in self._watchers:
            watcher.queue.put_nowait(None)

    def hold_watches(self) -> None:
        self._gate.clear()

    def release_watches(self) -> None:
        self._gate.set()

    @property
    def open_watches(self) -> int:
        return len(self._watchers)

    def read(self, plural: str, namespace: str | None, name: str) -> dict[str, Any] | None:
        obj = self._objects.get((plural, namespace, name))
        return copy.deepcopy(obj) if obj is not None else None

    def objects_of(self, plural: str) -> list[dict[str, Any]]:
        return self._list_raw(next(k for k in KINDS if k.plural == plural), None)

    def apply(self, obj: dict[str, Any]) -> dict[str, Any]:
        """Create or replace (status included) as another client would; returns the stored object."""
        kind = self._kind_of(obj)
        meta = obj.get("metadata", {})
        key = (kind.plural, meta.get("namespace") if kind.namespaced else None, meta["name"])
        if key not in self._objects:
            return self._create(kind, key[1], obj, keep_status=True)
        current = self._objects[key]
        new = copy.deepcopy(obj)
        new["metadata"] = {**current["metadata"], **{k: v for k, v in meta.items() if k != "resourceVersion"}}
        return self._store(kind, key, new, "MODIFIED", spec_of=current)

    def remove(self, plural: str, namespace: str | None, name: str) -> None:
        kind = next(k for k in KINDS if k.plural == plural)
        self._delete(kind, (plural, namespace, name), None)

    # --- HTTP -------------------------------------------------------------------------

    def _serve(self, request: Request) -> Any:
        kind = next(k for k in KINDS if k.plural == request.resource.plural and k.group == request.resource.group)
        method = str(request.method.value).upper()
        if kind.plural == "pods" and request.subresource == "binding" and method == "POST":
            return self._bind(request)
        if kind.plural == "pods" and request.subresource == "eviction" and method == "POST":
            return self._evict(request)
        if request.subresource not in (None, "status") or (request.subresource and not kind.status):
            return self._fail(404, "NotFound", f"the server could not find the requested resource ({request.subresource})")
        # Every answer names its status: kmock's reaction keeps the last status it rendered.
        if method == "GET" and _flag(request.params.get("watch")):
            return Response(status=200, headers={"Content-Type": "application/json"}, payload=self._watch(kind, request))
        return self._unary(kind, request, method)

    async def _fail(self, code: int, reason: str, message: str) -> Any:
        raise _status(code, reason, message)

    async def _bind(self, request: Request) -> Any:
        """`pods/binding`, as kube-scheduler binds: only an unbound Pod without scheduling gates."""
        kind = next(k for k in KINDS if k.plural == "pods")
        key: Key = ("pods", request.namespace, request.name or "")
        pod = self._existing(kind, key)
        target = ((request.data or {}).get("target") or {}).get("name") if isinstance(request.data, dict) else None
        if not target:
            raise _status(400, "BadRequest", "Binding: target.name is required")
        if pod["spec"].get("schedulingGates"):
            raise _status(422, "Invalid", f"pod {key[2]} has non-empty .spec.schedulingGates")
        if pod["spec"].get("nodeName"):
            raise _status(409, "Conflict", f'pod {key[2]} is already assigned to node "{pod["spec"]["nodeName"]}"')
        bound = copy.deepcopy(pod)
        bound["spec"]["nodeName"] = target
        self.writes.append(("create", "binding", key))
        self._store(kind, key, bound, "MODIFIED", spec_of=pod)
        return Response(status=201, payload={"apiVersion": "v1", "kind": "Status", "status": "Success", "code": 201})

    async def _evict(self, request: Request) -> Any:
        """`pods/eviction`, as the API server's eviction subresource (pkg/registry/core/pod/storage/eviction.go):
        the body must be a policy/v1 (or v1beta1) Eviction naming the Pod (400), the Pod must exist (404) and
        match `deleteOptions.preconditions` (409). A Pod already terminating or not running (phase Pending,
        Succeeded or Failed; a Pod without a phase is Pending, the API server's default) is deleted without
        asking its budget. Otherwise the PodDisruptionBudgets of its namespace whose selector matches its
        labels decide: none, deleted; more than one, 500; one whose status is not observed yet or whose
        `status.disruptionsAllowed` is 0, 429 TooManyRequests with the API server's message and a
        `DisruptionBudget` cause naming it; else its `disruptionsAllowed` is decremented and the Pod noted in
        `disruptedPods` before it is deleted. Deleted as a DELETE deletes (finalizers keep it with a
        deletionTimestamp; the garbage collector and `claim_controller` follow). 201 Success."""
        kind = next(k for k in KINDS if k.plural == "pods")
        key: Key = ("pods", request.namespace, request.name or "")
        body = request.data if isinstance(request.data, dict) else {}
        if (body.get("apiVersion"), body.get("kind")) not in (("policy/v1", "Eviction"), ("policy/v1beta1", "Eviction")):
            raise _status(400, "BadRequest", "Object 'Kind' is missing or not Eviction (policy/v1) in the request body")
        if (body.get("metadata") or {}).get("name") != key[2]:
            raise _status(400, "BadRequest", "name in URL does not match name in Eviction object")
        pod = self._existing(kind, key)
        options = body.get("deleteOptions") or None
        pre = (options or {}).get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if pre.get(field_name) and pre[field_name] != pod["metadata"].get(field_name):
                raise _status(
                    409,
                    "Conflict",
                    f"Precondition failed: {field_name} in precondition: {pre[field_name]}, {field_name} in object meta: {pod['metadata'].get(field_name)}",
                )
        phase = (pod.get("status") or {}).get("phase") or "Pending"
        if not pod["metadata"].get("deletionTimestamp") and phase not in ("Pending", "Succeeded", "Failed"):
            labels = pod["metadata"].get("labels") or {}
            budgets = [b for b in self._list_raw(KINDS[-1], key[1]) if _selects((b.get("spec") or {}).get("selector"), labels)]
            if len(budgets) > 1:
                raise _status(500, "InternalError", "This pod has more than one PodDisruptionBudget, which the eviction subresource does not support.")
            if budgets:
                self._spend_budget(budgets[0], key[2])
        self.writes.append(("create", "eviction", key))
        self._delete(kind, key, options)
        return Response(status=201, payload={"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Success", "code": 201})

    def _spend_budget(self, budget: dict[str, Any], pod: str) -> None:
        """One disruption of `budget` for `pod`, or 429 when it allows none now."""
        name = budget["metadata"]["name"]
        status = budget.get("status") or {}
        if status.get("observedGeneration", 0) < budget["metadata"].get("generation", 1):
            cause = f"The disruption budget {name} is still being processed by the server."
            raise _status(429, "TooManyRequests", DISRUPTION_BUDGET, causes=[{"reason": "DisruptionBudget", "message": cause}])
        if status.get("disruptionsAllowed", 0) <= 0:
            cause = f"The disruption budget {name} needs {status.get('desiredHealthy', 0)} healthy pods and has {status.get('currentHealthy', 0)} currently"
            raise _status(429, "TooManyRequests", DISRUPTION_BUDGET, causes=[{"reason": "DisruptionBudget", "message": cause}])
        spent = copy.deepcopy(budget)
        spent["status"] = {**status, "disruptionsAllowed": status["disruptionsAllowed"] - 1, "disruptedPods": {**status.get("disruptedPods", {}), pod: _now()}}
        key: Key = ("poddisruptionbudgets", budget["metadata"]["namespace"], name)
        self._store(KINDS[-1], key, spent, "MODIFIED", spec_of=self._objects[key])

    async def _unary(self, kind: Kind, request: Request, method: str) -> Any:
        namespace = request.namespace if kind.namespaced else None
        if kind.namespaced and method == "POST" and not namespace:
            raise _status(405, "MethodNotAllowed", "create needs a namespace")
        key: Key = (kind.plural, namespace, request.name or "")
        status = request.subresource == "status"
        if request.name is None:
            if method == "GET":
                return Response(status=200, payload=self._list(kind, request.namespace))
            if method == "POST":
                body = request.data if isinstance(request.data, dict) else {}
                if (body.get("apiVersion"), body.get("kind")) != (kind.api_version, kind.kind):
                    # A real API server decodes the body by its own apiVersion/kind, not by the URL.
                    raise _status(400, "BadRequest", f"Object 'Kind' is missing or not {kind.kind} ({kind.api_version}) in the request body")
                return Response(status=201, payload=self._create(kind, namespace, request.data, keep_status=False))
            raise _status(405, "MethodNotAllowed", f"{method} on a collection is not supported")
        if method == "GET":
            return Response(status=200, payload=copy.deepcopy(self._existing(kind, key)))
        if method == "DELETE":
            return Response(status=200, payload=self._delete(kind, key, request.data if isinstance(request.data, dict) else None))
        if method in ("PUT", "PATCH"):
            for hook in list(self.before_write):
                hook(request.subresource or "", key, request.data)
        if method == "PUT":
            return Response(status=200, payload=self._write(kind, key, lambda _current: request.data, status, "replace"))
        if method == "PATCH":
            content_type = request.headers.get("Content-Type", "").split(";")[0].strip()
            if content_type == "application/json-patch+json":
                change = lambda current: json_patch(current, request.data)  # noqa: E731
            elif content_type in ("application/merge-patch+json", "application/strategic-merge-patch+json"):
                change = lambda current: merge_patch(current, request.data)  # noqa: E731
            else:
                change = None
            if change is not None:
                return Response(status=200, payload=self._write(kind, key, change, status, "patch"))
            raise _status(
                415,
                "UnsupportedMediaType",
                f"the body of the request was in an unknown format - accepted media types include: application/json-patch+json, application/merge-patch+json, application/strategic-merge-patch+json (got {content_type!r})",
            )
        raise _status(405, "MethodNotAllowed", f"{method} is not supported")

    def _list(self, kind: Kind, namespace: str | None) -> dict[str, Any]:
        items = []
        for (plural, ns, _name), obj in sorted(self._objects.items(), key=lambda item: (item[0][1] or "", item[0][2])):
            if plural == kind.plural and (namespace is None or ns == namespace):
                item = copy.deepcopy(obj)
                # Items of a list carry no apiVersion/kind, exactly as the API server writes them.
                item.pop("apiVersion", None)
                item.pop("kind", None)
                items.append(item)
        return {"apiVersion": kind.api_version, "kind": f"{kind.kind}List", "metadata": {"resourceVersion": str(self._rv)}, "items": items}

    async def _watch(self, kind: Kind, request: Request) -> AsyncIterator[bytes]:
        await self._gate.wait()
        namespace = request.namespace if kind.namespaced else None
        since = request.params.get("resourceVersion", "")
        bookmarks = _flag(request.params.get("allowWatchBookmarks"))
        timeout = float(request.params.get("timeoutSeconds", 0)) or None
        if self.max_watch_seconds is not None:
            timeout = min(timeout or self.max_watch_seconds, self.max_watch_seconds)
        deadline = asyncio.get_running_loop().time() + timeout if timeout else None
        yield b""  # send the headers now: a watch is a 200 response even when nothing happens

        # Replay and registration happen without a suspension point in between, so no event is lost.
        backlog: list[tuple[str, dict[str, Any]]]
        if since in ("", "0"):
            backlog = [("ADDED", obj) for obj in self._list_raw(kind, namespace)]
        elif not since.isdigit() or int(since) < self._compacted:
            yield self._line(
                "ERROR",
                {
                    "apiVersion": "v1",
                    "kind": "Status",
                    "metadata": {},
                    "status": "Failure",
                    "message": f"too old resource version: {since} ({self._compacted})",
                    "reason": "Expired",
                    "code": 410,
                },
            )
            return
        else:
            backlog = [
                (t, o) for rv, k, t, o in self._log if rv > int(since) and k == kind and (namespace is None or o["metadata"].get("namespace") == namespace)
            ]
        watcher = _Watcher(kind, namespace)
        for item in backlog:
            watcher.queue.put_nowait(item)
        self._watchers.append(watcher)
        try:
            while True:
                wait = self.bookmark_interval if bookmarks else None
                if deadline is not None:
                    left = deadline - asyncio.get_running_loop().time()
                    if left <= 0:
                        return
                    wait = min(wait, left) if wait is not None else left
                try:
                    item = await asyncio.wait_for(watcher.queue.get(), wait)
                except TimeoutError:
                    if bookmarks and (deadline is None or asyncio.get_running_loop().time() < deadline):
                        yield self._line("BOOKMARK", {"apiVersion": kind.api_version, "kind": kind.kind, "metadata": {"resourceVersion": str(self._rv)}})
                    continue
                if item is None:
                    return
                yield self._line(*item)
        finally:
            self._watchers.remove(watcher)

    @staticmethod
    def _line(kind: str, obj: dict[str, Any]) -> bytes:
        return json.dumps({"type": kind, "object": obj}).encode() + b"\n"

    def _list_raw(self, kind: Kind, namespace: str | None) -> list[dict[str, Any]]:
        return [
            copy.deepcopy(o)
            for (p, ns, _), o in sorted(self._objects.items(), key=lambda i: (i[0][1] or "", i[0][2]))
            if p == kind.plural and (namespace is None or ns == namespace)
        ]

    # --- the store ----------------------------------------------------------------------

    def _kind_of(self, obj: dict[str, Any]) -> Kind:
        for kind in KINDS:
            if kind.kind == obj.get("kind") and kind.api_version == obj.get("apiVersion"):
                return kind
        raise ValueError(f"not served: {obj.get('apiVersion')} {obj.get('kind')}")

    def _existing(self, kind: Kind, key: Key) -> dict[str, Any]:
        obj = self._objects.get(key)
        if obj is None:
            raise _status(404, "NotFound", f'{kind.plural}.{kind.group or "core"} "{key[2]}" not found', name=key[2], group=kind.group, kind=kind.plural)
        return obj

    def _create(self, kind: Kind, namespace: str | None, body: Any, keep_status: bool) -> dict[str, Any]:
        if not isinstance(body, dict):
            raise _status(400, "BadRequest", "the request body must be a JSON object")
        obj = copy.deepcopy(body)
        meta = obj.setdefault("metadata", {})
        if kind.namespaced:
            if meta.get("namespace") not in (None, namespace):
                raise _status(400, "BadRequest", "the namespace of the provided object does not match the namespace sent on the request")
            meta["namespace"] = namespace
        name = meta.get("name") or (meta["generateName"] + secrets.token_hex(3)[:5] if meta.get("generateName") else "")
        if not name:
            raise _status(422, "Invalid", f"{kind.kind} is invalid: metadata.name: Required value: name or generateName is required")
        key = (kind.plural, namespace, name)
        if key in self._objects:
            raise _status(409, "AlreadyExists", f'{kind.plural}.{kind.group or "core"} "{name}" already exists', name=name, kind=kind.plural)
        meta.update(name=name, uid=str(uuid.uuid4()), generation=1, creationTimestamp=_now())
        meta.pop("resourceVersion", None)
        obj["apiVersion"], obj["kind"] = kind.api_version, kind.kind
        if kind.status and not keep_status:
            obj.pop("status", None)  # status is written through /status only
        self._validate(kind, None, obj)
        return self._commit(kind, key, obj, "ADDED")

    def _write(self, kind: Kind, key: Key, change: Any, status: bool, verb: str) -> dict[str, Any]:
        current = self._existing(kind, key)
        new = change(copy.deepcopy(current))
        if not isinstance(new, dict):
            raise _status(400, "BadRequest", "the result of the change is not a JSON object")
        sent_rv = (new.get("metadata") or {}).get("resourceVersion")
        if sent_rv not in (None, "") and sent_rv != current["metadata"]["resourceVersion"]:
            raise _status(
                409,
                "Conflict",
                f'Operation cannot be fulfilled on {kind.plural}.{kind.group or "core"} "{key[2]}": '
                "the object has been modified; please apply your changes to the latest version and try again",
                name=key[2],
                kind=kind.plural,
            )
        if status:
            # The status subresource changes status only; everything else is kept as it was.
            result = copy.deepcopy(current)
            if "status" in new:
                result["status"] = new["status"]
            else:
                result.pop("status", None)
        else:
            result = new
            result["metadata"] = {
                **new.get("metadata", {}),
                **{
                    k: current["metadata"][k]
                    for k in ("uid", "creationTimestamp", "name", "namespace", "generation", "deletionTimestamp")
                    if k in current["metadata"]
                },
            }
            if kind.status:
                if "status" in current:
                    result["status"] = current["status"]
                else:
                    result.pop("status", None)
        result["apiVersion"], result["kind"] = kind.api_version, kind.kind
        if status and kind.plural == "resourceclaims":
            self._drop_disabled_status_fields(current, result)
        self._validate(kind, current, result)
        self.writes.append((verb, "status" if status else "", key))
        meta = result["metadata"]
        if meta.get("deletionTimestamp") and not meta.get("finalizers"):
            self._commit(kind, key, result, "DELETED", delete=True)
            return result
        return self._store(kind, key, result, "MODIFIED", spec_of=current)

    GATED_RESULT_FIELDS = {
        "DRAAdminAccess": ("adminAccess",),
        "DRAConsumableCapacity": ("shareID", "consumedCapacity"),
        "DRADeviceBindingConditions": ("bindingConditions", "bindingFailureConditions"),
        "DRAOptionalNodeOperations": ("skipNodeOperations",),
    }
    """The result fields the API server's status strategy drops per feature gate (dropDisabledStatusFields)."""

    def _drop_disabled_status_fields(self, old: dict[str, Any], new: dict[str, Any]) -> None:
        """As the API server's ResourceClaim status strategy: the result fields of a gate that is off
        are dropped, unless the claim's allocation as stored uses them already."""

        def results(claim: dict[str, Any]) -> list[dict[str, Any]]:
            return (((claim.get("status") or {}).get("allocation") or {}).get("devices") or {}).get("results") or []

        for gate in self.disabled_gates:
            names = self.GATED_RESULT_FIELDS[gate]
            if any(name in result for result in results(old) for name in names):
                continue  # in use: kept
            for result in results(new):
                for name in names:
                    result.pop(name, None)

    def _store(self, kind: Kind, key: Key, obj: dict[str, Any], event: str, spec_of: dict[str, Any]) -> dict[str, Any]:
        if obj.get("spec") != spec_of.get("spec"):
            obj["metadata"]["generation"] = spec_of["metadata"].get("generation", 1) + 1
        return self._commit(kind, key, obj, event)

    def _delete(self, kind: Kind, key: Key, options: dict[str, Any] | None) -> dict[str, Any]:
        current = self._existing(kind, key)
        pre = (options or {}).get("preconditions") or {}
        for field_name in ("uid", "resourceVersion"):
            if pre.get(field_name) and pre[field_name] != current["metadata"].get(field_name):
                raise _status(
                    409,
                    "Conflict",
                    f"Precondition failed: {field_name} in precondition: {pre[field_name]}, {field_name} in object meta: {current['metadata'].get(field_name)}",
                )
        self.writes.append(("delete", "", key))
        obj = copy.deepcopy(current)
        if obj["metadata"].get("finalizers"):
            if not obj["metadata"].get("deletionTimestamp"):
                obj["metadata"]["deletionTimestamp"] = _now()
                return self._commit(kind, key, obj, "MODIFIED")
            return obj
        return self._commit(kind, key, obj, "DELETED", delete=True)

    def _commit(self, kind: Kind, key: Key, obj: dict[str, Any], event: str, delete: bool = False) -> dict[str, Any]:
        self._rv += 1
        obj["metadata"]["resourceVersion"] = str(self._rv)
        if delete:
            del self._objects[key]
        else:
            self._objects[key] = obj
        result = self._announce(kind, key, obj, event)
        if delete and kind.plural == "pods" and self.claim_controller:
            self._unreserve(obj)
        if delete:
            self._collect_dependents(obj["metadata"].get("uid"))
        return result

    def _unreserve(self, pod: dict[str, Any]) -> None:
        """The resourceclaim controller for a Pod that is gone (pkg/controller/resourceclaim): it is dropped
        from the `reservedFor` of the claims of its namespace; a claim then reserved for nobody is
        deallocated and its delete-protection finalizer dropped (a claim being deleted then goes)."""
        uid, namespace = pod["metadata"].get("uid"), pod["metadata"].get("namespace")
        kind = KINDS[0]
        for key, claim in list(self._objects.items()):
            reserved = (claim.get("status") or {}).get("reservedFor") or []
            if key[0] != "resourceclaims" or key[1] != namespace or not any(r.get("uid") == uid for r in reserved):
                continue
            new = copy.deepcopy(claim)
            left = [r for r in reserved if r.get("uid") != uid]
            if left:
                new["status"]["reservedFor"] = left
            else:
                new["status"] = {k: v for k, v in new["status"].items() if k not in ("reservedFor", "allocation")}
                finalizers = [f for f in new["metadata"].get("finalizers") or [] if f != CLAIM_FINALIZER]
                new["metadata"].pop("finalizers", None)
                if finalizers:
                    new["metadata"]["finalizers"] = finalizers
            if new["metadata"].get("deletionTimestamp") and not new["metadata"].get("finalizers"):
                self._commit(kind, key, new, "DELETED", delete=True)
            else:
                self._store(kind, key, new, "MODIFIED", spec_of=claim)

    def _collect_dependents(self, uid: str | None) -> None:
        """The garbage collector's background cascade: objects whose owners are all gone are deleted
        (finalizers hold them with a deletionTimestamp, as for any delete)."""
        if not uid:
            return
        living = {o["metadata"].get("uid") for o in self._objects.values()}
        for key, obj in list(self._objects.items()):
            owners = obj["metadata"].get("ownerReferences") or []
            if (
                any(ref.get("uid") == uid for ref in owners)
                and not any(ref.get("uid") in living for ref in owners)
                and key in self._objects
                and not obj["metadata"].get("deletionTimestamp")
            ):
                self._delete(next(k for k in KINDS if k.plural == key[0]), key, None)

    def _announce(self, kind: Kind, key: Key, obj: dict[str, Any], event: str) -> dict[str, Any]:
        snapshot = copy.deepcopy(obj)
        self._log.append((self._rv, kind, event, snapshot))
        if len(self._log) > self.history:
            dropped = self._log.pop(0)
            self._compacted = dropped[0]
        for watcher in self._watchers:
            if watcher.kind == kind and (watcher.namespace is None or watcher.namespace == key[1]):
                watcher.queue.put_nowait((event, copy.deepcopy(snapshot)))
        return copy.deepcopy(obj)

    def _validate(self, kind: Kind, old: dict[str, Any] | None, new: dict[str, Any]) -> None:
        if kind.plural == "pods" and old is not None:
            # After creation a scheduling gate may only be removed (the API server's pod update validation).
            before = [g.get("name") for g in (old.get("spec") or {}).get("schedulingGates") or []]
            if not before and (old.get("spec") or {}).get("affinity") != (new.get("spec") or {}).get("affinity"):
                raise _status(
                    422,
                    "Invalid",
                    f'Pod "{new["metadata"]["name"]}" is invalid: spec: Forbidden: pod updates may '
                    "not change fields other than ... (spec.affinity only while the Pod has scheduling gates)",
                )
            for gate in (new.get("spec") or {}).get("schedulingGates") or []:
                if gate.get("name") not in before:
                    raise _status(
                        422,
                        "Invalid",
                        f'Pod "{new["metadata"]["name"]}" is invalid: spec.schedulingGates: '
                        f"Forbidden: only deletion is allowed, but found new scheduling gate '{gate.get('name')}'",
                    )
        if kind.plural != "resourceclaims":
            return
        try:
            msgspec.convert(new, ResourceClaim)
        except msgspec.ValidationError as exc:
            raise _status(422, "Invalid", f'ResourceClaim.resource.k8s.io "{new["metadata"]["name"]}" is invalid: {exc}') from exc
        before = (old or {}).get("status") or {}
        after = new.get("status") or {}
        if before.get("allocation") and after.get("allocation") and before["allocation"] != after["allocation"]:
            raise _status(
                422,
                "Invalid",
                f'ResourceClaim.resource.k8s.io "{new["metadata"]["name"]}" is invalid: status.allocation: Forbidden: may not be changed once set',
            )
        if after.get("reservedFor") and not after.get("allocation"):
            raise _status(
                422,
                "Invalid",
                f'ResourceClaim.resource.k8s.io "{new["metadata"]["name"]}" is invalid: status.reservedFor: Forbidden: may not be set when not allocated',
            )
