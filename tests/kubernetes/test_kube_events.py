"""Events for claims dralloc cannot allocate: one per object and explanation, updated, rate-limited."""

from __future__ import annotations

from typing import Any

from kube_emulator import ApiServer
from kubernetes_asyncio.client import ApiClient

from dralloc.statuswriter.kube_events import EventRecorder, Involved

CLAIM = Involved("ResourceClaim", "resource.k8s.io/v1", "ml", "train", "uid-1")


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def events(apiserver: ApiServer) -> list[dict[str, Any]]:
    return apiserver.objects_of("events")


async def test_a_repeat_updates_the_event_and_a_burst_is_counted_not_written(apiserver: ApiServer, api: ApiClient) -> None:
    clock = Clock()
    recorder = EventRecorder(lambda: api, interval=10, clock=clock)
    await recorder.record(CLAIM, "no node has enough free devices")
    (event,) = events(apiserver)
    assert (event["count"], event["reason"], event["type"]) == (1, "AllocationFailed", "Warning")
    assert event["involvedObject"] == {"kind": "ResourceClaim", "apiVersion": "resource.k8s.io/v1", "namespace": "ml", "name": "train", "uid": "uid-1"}
    writes = len(apiserver.writes)
    await recorder.record(CLAIM, "no node has enough free devices")  # inside the interval: not written
    await recorder.record(CLAIM, "no node has enough free devices")
    assert len(apiserver.writes) == writes and events(apiserver)[0]["count"] == 1
    clock.now += 11
    await recorder.record(CLAIM, "no node has enough free devices")  # carries the two held back
    (event,) = events(apiserver)
    assert event["count"] == 4
    await recorder.record(CLAIM, "another reason")  # another explanation: its own Event
    assert sorted(e["message"] for e in events(apiserver)) == ["another reason", "no node has enough free devices"]


async def test_a_restarted_writer_adds_to_the_event_an_earlier_run_made(apiserver: ApiServer, api: ApiClient) -> None:
    await EventRecorder(lambda: api).record(CLAIM, "unsatisfiable")
    await EventRecorder(lambda: api).record(CLAIM, "unsatisfiable")  # a new process: create says AlreadyExists
    (event,) = events(apiserver)
    assert event["count"] == 2 and event["lastTimestamp"] >= event["firstTimestamp"]
