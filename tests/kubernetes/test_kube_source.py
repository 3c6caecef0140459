"""The Kubernetes claim source against the emulated API server, through the real client over HTTP."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_emulator import ApiServer
from kube_objects import CLASS, claim, node_slice

from dralloc.bus import Bus, embedded_nats
from dralloc.ingestor.kubernetes import UNKNOWN_REPORTED, KubernetesSource, KubeSourceOptions
from dralloc.ingestor.sources import SourceEvent
from dralloc.kube import KubeSettings
from dralloc.schemas import events as ev

SLICE = node_slice([{"name": "gpu-0"}])


class Running:
    """A source running in the background; its events land in a queue."""

    def __init__(self, source: KubernetesSource, bus: Bus | None = None) -> None:
        self.source = source
        self.bus = bus
        self.stop = asyncio.Event()
        self.queue: asyncio.Queue[SourceEvent] = asyncio.Queue()
        self.problems: list[str] = []
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        if self.bus is not None:
            await self.source.seed(self.bus)  # what the ingestor's shell does before reading events
        async for event in self.source.events(self.stop):
            self.queue.put_nowait(event)

    async def take(self, count: int, timeout: float = 5.0) -> list[SourceEvent]:
        async with asyncio.timeout(timeout):
            return [await self.queue.get() for _ in range(count)]

    async def quiet(self, seconds: float = 0.3) -> list[SourceEvent]:
        """Whatever arrives within `seconds` (expected: nothing)."""
        await asyncio.sleep(seconds)
        found = []
        while not self.queue.empty():
            found.append(self.queue.get_nowait())
        return found

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)


@pytest.fixture
async def start(apiserver: ApiServer) -> AsyncIterator[Any]:
    running: list[Running] = []

    def _start(bus: Bus | None = None, **options: Any) -> Running:
        problems: list[str] = []
        settings = KubeSettings(server=str(apiserver.url).rstrip("/"))
        source = KubernetesSource(None, problems.append, options=KubeSourceOptions(settings=settings, **options))
        run = Running(source, bus)
        run.problems = problems
        running.append(run)
        return run

    yield _start
    for run in running:
        if not run.task.done():
            await run.close()


def names(events: list[SourceEvent]) -> list[tuple[str, str]]:
    out = []
    for event in events:
        match event:
            case ev.ClaimSubmitted(claim=c):
                out.append(("submitted", c.key))
            case ev.ClaimDeleted():
                out.append(("deleted", event.key))
            case ev.DeviceClassPublished(device_class=c):
                out.append(("class", c.metadata.name))
            case ev.DeviceClassRemoved(name=n):
                out.append(("class-removed", n))
            case ev.ResourceSlicePublished(slice=s):
                out.append(("slice", s.metadata.name))
            case ev.ResourceSliceRemoved(name=n):
                out.append(("slice-removed", n))
    return out


async def test_lists_then_watches_claims_and_classes(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(CLASS)
    apiserver.apply(claim("a"))
    apiserver.apply(claim("done", status={"allocation": {"devices": {"results": []}}}))
    run = start()
    listed = await run.take(3)
    # An allocated claim is submitted with its allocation, so the allocator adopts its devices as in use.
    assert sorted(names(listed)) == [("class", "gpu.example.com"), ("submitted", "default/a"), ("submitted", "default/done")]
    done = next(e.claim for e in listed if isinstance(e, ev.ClaimSubmitted) and e.claim.key == "default/done")
    assert done.status is not None and done.status.allocation is not None
    apiserver.apply(claim("b", "team-1"))
    apiserver.remove("resourceclaims", "default", "a")
    apiserver.remove("deviceclasses", None, "gpu.example.com")
    events = await run.take(3)
    assert sorted(names(events)) == [("class-removed", "gpu.example.com"), ("deleted", "default/a"), ("submitted", "team-1/b")]
    submitted = next(e for e in events if isinstance(e, ev.ClaimSubmitted))
    assert submitted.claim.metadata.uid == apiserver.read("resourceclaims", "team-1", "b")["metadata"]["uid"]
    deleted = next(e for e in events if isinstance(e, ev.ClaimDeleted))
    assert deleted.uid  # the uid of the deleted claim: the allocator releases exactly that claim
    assert await run.quiet() == [] and run.problems == []


async def test_a_status_change_is_news_and_a_relist_is_not(apiserver: ApiServer, start: Any) -> None:
    """The cluster's status is the truth dralloc follows (an allocation written or cleared by anyone):
    each change of the object is sent, once; the same object listed again is not."""
    stored = apiserver.apply(claim("a"))
    run = start()
    (first,) = await run.take(1)
    assert first.cluster and first.claim.status is None
    apiserver.apply({**stored, "status": {"allocation": {"devices": {"results": []}}}})  # a status writer's write
    (written,) = await run.take(1)
    assert written.claim.status.allocation is not None and written.msg_id != first.msg_id
    apiserver.compact()
    apiserver.close_watches()  # a re-list finds the same object: nothing new
    assert await run.quiet() == []


async def test_claim_held_by_finalizer_is_deleted_when_marked(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(claim("a") | {"metadata": {"name": "a", "namespace": "default", "finalizers": ["example.com/hold"]}})
    run = start()
    await run.take(1)
    apiserver.remove("resourceclaims", "default", "a")  # sets deletionTimestamp only
    assert names(await run.take(1)) == [("deleted", "default/a")]


async def test_slices_of_other_drivers_when_asked(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(SLICE)
    without = start()
    with_slices = start(slices=True)
    assert names(await with_slices.take(1)) == [("slice", "node-0-gpu")]
    apiserver.remove("resourceslices", None, "node-0-gpu")
    removed = await with_slices.take(1)
    assert names(removed) == [("slice-removed", "node-0-gpu")]
    assert removed[0].driver == "gpu.example.com" and removed[0].pool == "node-0"
    assert await without.quiet(0.1) == []


async def test_namespace_list(apiserver: ApiServer, start: Any) -> None:
    for ns in ("a", "b", "c"):
        apiserver.apply(claim("x", ns))
    run = start(namespaces=["a", "c"])
    assert sorted(names(await run.take(2))) == [("submitted", "a/x"), ("submitted", "c/x")]
    apiserver.apply(claim("y", "b"))
    apiserver.apply(claim("y", "c"))
    assert names(await run.take(1)) == [("submitted", "c/y")]
    assert await run.quiet(0.1) == []


async def test_bookmarks_advance_the_resource_version(apiserver: ApiServer, start: Any) -> None:
    apiserver.bookmark_interval = 0.05
    apiserver.apply(claim("a"))
    run = start()
    await run.take(1)
    apiserver.apply({**CLASS, "metadata": {"name": "unrelated"}})  # bumps the version; claims' watch sees only a bookmark
    claims = next(r for r in run.source.reflectors if r.what == "resourceclaims")
    async with asyncio.timeout(3):
        while claims.resource_version != str(apiserver.resource_version):
            await asyncio.sleep(0.02)


async def test_expired_watch_resumes_without_loss_or_replay(apiserver: ApiServer, start: Any) -> None:
    apiserver.max_watch_seconds = 0.2  # the server ends every watch quickly, as API servers do (timeouts)
    apiserver.apply(claim("a"))
    run = start()
    assert names(await run.take(1)) == [("submitted", "default/a")]
    for i in range(3):
        await asyncio.sleep(0.25)  # across a watch renewal
        apiserver.apply(claim(f"n{i}"))
        assert names(await run.take(1)) == [("submitted", f"default/n{i}")]
    assert await run.quiet(0.3) == []  # nothing replayed by the renewed watches
    watches = [r for r in apiserver._requests if r.params.get("watch") and r.resource.plural == "resourceclaims"]
    assert len(watches) >= 3 and all(r.params.get("resourceVersion") for r in watches)


async def test_410_gone_relists_and_finds_what_happened_in_the_gap(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(claim("stays"))
    apiserver.apply(claim("goes"))
    run = start()
    assert sorted(names(await run.take(2))) == [("submitted", "default/goes"), ("submitted", "default/stays")]
    # A partition: the watch drops, changes happen, history is compacted before the client is back.
    apiserver.hold_watches()
    apiserver.close_watches()
    await asyncio.sleep(0.05)
    apiserver.remove("resourceclaims", "default", "goes")
    apiserver.apply(claim("new"))
    apiserver.compact()
    apiserver.release_watches()
    events = await run.take(2)
    assert sorted(names(events)) == [("deleted", "default/goes"), ("submitted", "default/new")]
    assert await run.quiet() == []  # `stays` was known: not submitted again
    lists = [r for r in apiserver._requests if r.resource and r.resource.plural == "resourceclaims" and r.method.value == "GET" and not r.params.get("watch")]
    assert len(lists) == 2  # the first list and the re-list after 410


async def test_restart_does_not_submit_handled_claims_again(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(CLASS)
    apiserver.apply(claim("a"))
    async with embedded_nats() as url, await Bus.connect(url, name="test") as bus:
        await bus.ensure_streams()
        first = start()
        for event in await first.take(2):
            await bus.publish(event)
        await first.close()
        second = start(bus)
        assert await second.quiet() == []
        apiserver.apply(claim("b"))
        assert names(await second.take(1)) == [("submitted", "default/b")]


async def test_bad_object_is_reported_and_skipped(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply({**CLASS, "metadata": {"name": "bad"}, "spec": {"selectors": "not a list"}})
    apiserver.apply(CLASS)
    run = start()
    assert names(await run.take(1)) == [("class", "gpu.example.com")]
    assert len(run.problems) == 1 and "DeviceClass/bad" in run.problems[0] and "selectors" in run.problems[0]


async def test_fields_of_a_newer_kubernetes_are_said_once_and_the_object_goes_on(apiserver: ApiServer, start: Any) -> None:
    """A slice field dralloc does not read could restrict allocation (as compatibilityGroups did
    before dralloc read them): the source says so, once per field, and publishes the slice."""
    newer = {**SLICE, "spec": {**SLICE["spec"], "devices": [{"name": "gpu-0", "futureLimit": 1}, {"name": "gpu-1", "futureLimit": 2}]}}
    apiserver.apply(newer)
    apiserver.apply({**CLASS, "spec": {**CLASS.get("spec", {}), "futureMode": "strict"}})
    run = start(slices=True)
    assert sorted(names(await run.take(2))) == [("class", "gpu.example.com"), ("slice", "node-0-gpu")]
    assert sorted(run.problems) == [
        "deviceclasses: DeviceClass/gpu.example.com: field spec.futureMode is not one dralloc knows (a newer Kubernetes?); ignored, here and wherever else it appears",
        "resourceslices: ResourceSlice/node-0-gpu: field spec.devices[0].futureLimit is not one dralloc knows (a newer Kubernetes?); ignored, here and wherever else it appears",
    ]
    apiserver.apply(
        {**newer, "metadata": {"name": "node-1-gpu"}, "spec": {**newer["spec"], "nodeName": "node-1", "pool": {**newer["spec"]["pool"], "name": "node-1"}}}
    )
    assert names(await run.take(1)) == [("slice", "node-1-gpu")]
    assert len(run.problems) == 2  # (said once)


def newer_claim(name: str) -> dict[str, Any]:
    """A claim whose request has a field of a newer Kubernetes, and an unknown metadata and status
    field (neither says what to allocate: not judged)."""
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", "futureMode": "strict"}}
    return claim(name, metadata={"futureMeta": "x"}, status={"futureStatus": 1}) | {"spec": {"devices": {"requests": [request]}}}


async def test_claim_fields_of_a_newer_kubernetes_are_said_once_and_the_claim_goes_on(apiserver: ApiServer, start: Any) -> None:
    """A claim's request may carry a newer Kubernetes' restriction dralloc does not read: the
    source says so, once per field, and submits the claim as an older scheduler would take it."""
    apiserver.apply(newer_claim("a"))
    run = start()
    assert names(await run.take(1)) == [("submitted", "default/a")]
    assert run.problems == [
        "resourceclaims: ResourceClaim/default/a: field spec.devices.requests[0].exactly.futureMode is not one dralloc knows "
        "(a newer Kubernetes?); ignored, here and wherever else it appears"
    ]
    apiserver.apply(newer_claim("b"))
    assert names(await run.take(1)) == [("submitted", "default/b")]
    assert len(run.problems) == 1  # (said once)


async def test_api_errors_are_retried(apiserver: ApiServer, start: Any) -> None:
    apiserver["get", apiserver.resource("resource.k8s.io", "v1", "resourceclaims")][:2] << 503  # the first two fail
    apiserver.apply(claim("a"))
    run = start()
    assert names(await run.take(1)) == [("submitted", "default/a")]
    assert any("503" in p for p in run.problems)


async def test_a_flood_of_made_up_fields_is_said_in_a_bounded_number_of_lines(apiserver: ApiServer, start: Any) -> None:
    """Thousands of distinct unknown fields (no Kubernetes has them: a hostile or broken API
    server) give UNKNOWN_REPORTED lines and one saying no more will be; every claim still goes on."""
    request = {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com", **{f"made{i}": i for i in range(UNKNOWN_REPORTED * 3)}}}
    apiserver.apply(claim("a") | {"spec": {"devices": {"requests": [request]}}})
    apiserver.apply(claim("b") | {"spec": {"devices": {"requests": [{**request, "other": 1}]}}})
    run = start()
    assert sorted(names(await run.take(2))) == [("submitted", "default/a"), ("submitted", "default/b")]
    assert len(run.problems) == UNKNOWN_REPORTED + 1
    assert run.problems[-1] == f"resourceclaims: more than {UNKNOWN_REPORTED} fields dralloc does not know; no more are reported in this run"
