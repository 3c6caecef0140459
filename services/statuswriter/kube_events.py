"""Kubernetes Events for claims dralloc cannot allocate (and for its evictions): where `kubectl describe` shows them.

An `AllocationFailed` becomes one core/v1 Event (type Warning, reason
``AllocationFailed``, dralloc's one-line explanation as the message) on the
claim and, when the claim failed as part of a Pod's unit, on that Pod. The same
explanation for the same object is one Event, updated rather than repeated, as
client-go's event correlator does: its name is derived from the object's uid
and the message, a repeat raises ``count`` and ``lastTimestamp``. Writes are
rate-limited per Event (`interval`): a repeat inside the interval is counted in
memory and carried by the next write. A failure to record an Event is logged
and never fails the status writer (Events are best effort, as in Kubernetes).
"""

from __future__ import annotations

import datetime
import hashlib
import json
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from kubernetes_asyncio.client import ApiClient, ApiException, CoreV1Api

from dralloc.kube import body_of, describe, merge_patch

log = logging.getLogger("dralloc.statuswriter.events")

REASON = "AllocationFailed"
COMPONENT = "dralloc-statuswriter"
INTERVAL = 10.0
"""Seconds between two writes of one Event."""


@dataclass(frozen=True, slots=True)
class Involved:
    """The object an Event is about."""

    kind: str
    api_version: str
    namespace: str
    name: str
    uid: str


def event_name(involved: Involved, message: str, reason: str = REASON) -> str:
    """One name per object, reason and explanation (a Pod and its claim each get their own)."""
    digest = hashlib.sha256(f"{involved.uid}\x00{involved.kind}\x00{reason}\x00{message}".encode()).hexdigest()[:16]
    return f"{involved.name[:236]}.{digest}"


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


@dataclass
class _Seen:
    count: int
    written: float
    unwritten: int = 0


@dataclass
class EventRecorder:
    """Records `AllocationFailed` Events through the API server (create, then patch count)."""

    api: Callable[[], ApiClient]
    interval: float = INTERVAL
    clock: Callable[[], float] = time.monotonic
    seen: dict[str, _Seen] = field(default_factory=dict)
    """Event name -> what this process wrote of it (bounded by the failures still current)."""

    async def record(self, involved: Involved, message: str, *, reason: str = REASON, type_: str = "Warning", action: str = "Allocate") -> None:
        """One Event (`reason`, `type_` Warning or Normal, `action` what was done) on `involved`: made,
        or its count raised (see the module docstring); never raises for the API's refusal."""
        name = event_name(involved, message, reason)
        now = self.clock()
        seen = self.seen.get(name)
        if seen is not None and now - seen.written < self.interval:
            seen.unwritten += 1  # rate-limited: carried by the next write
            return
        core = CoreV1Api(self.api())
        try:
            if seen is None:
                seen = await self._create(core, involved, name, message, reason, type_, action)
            else:
                seen.count += 1 + seen.unwritten
                await self._patch(core, involved.namespace, name, seen.count)
                seen.unwritten = 0
            seen.written = now
            self.seen[name] = seen
        except ApiException as exc:
            if exc.status == 404 and seen is not None:
                self.seen.pop(name, None)  # expired (events have a TTL): the next failure creates it again
            log.warning("Event on %s %s/%s not recorded: %s", involved.kind, involved.namespace, involved.name, describe(exc))

    async def _create(self, core: CoreV1Api, involved: Involved, name: str, message: str, reason: str, type_: str, action: str) -> _Seen:
        stamp = _now()
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": involved.namespace},
            "involvedObject": {
                "kind": involved.kind,
                "apiVersion": involved.api_version,
                "namespace": involved.namespace,
                "name": involved.name,
                "uid": involved.uid,
            },
            "type": type_,
            "reason": reason,
            "message": message[:1024],
            "source": {"component": COMPONENT},
            "reportingComponent": "dralloc.dev/statuswriter",
            "reportingInstance": COMPONENT,
            "action": action,
            "firstTimestamp": stamp,
            "lastTimestamp": stamp,
            "count": 1,
        }
        try:
            await body_of(core.create_namespaced_event(involved.namespace, body, _preload_content=False))  # type: ignore[arg-type]  # the client sends a dict body as is; the stub names the model only
            return _Seen(count=1, written=self.clock())
        except ApiException as exc:
            if exc.status != 409:
                raise
        # Made by an earlier run of this writer: read its count and add to it.
        current = await body_of(core.read_namespaced_event(name, involved.namespace, _preload_content=False))
        count = int(json.loads(current).get("count") or 1) + 1
        await self._patch(core, involved.namespace, name, count)
        return _Seen(count=count, written=self.clock())

    async def _patch(self, core: CoreV1Api, namespace: str, name: str, count: int) -> None:
        await merge_patch(core.patch_namespaced_event, name, namespace, {"count": count, "lastTimestamp": _now()})
