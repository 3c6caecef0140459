"""Pods naming a ResourceClaimTemplate get their claim as Kubernetes' resourceclaim controller makes it."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from kube_emulator import ApiServer

from dralloc.ingestor.kubernetes import KubernetesSource, KubeSourceOptions
from dralloc.ingestor.sources import SourceEvent
from dralloc.kube import KubeSettings, user_agent
from dralloc.pods import POD_CLAIM_NAME_ANNOTATION
from dralloc.schemas import events as ev

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "infra"))
from kustomize_render import granted, render  # noqa: E402

INFRA = Path(__file__).resolve().parents[2] / "infra"

TEMPLATE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "ResourceClaimTemplate",
    "metadata": {"name": "one-gpu", "namespace": "ml"},
    "spec": {
        "metadata": {"labels": {"team": "vision"}},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}}]}},
    },
}


def pod(name: str = "trainer", template: str = "one-gpu") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {
            "containers": [{"name": "main", "image": "busybox"}],
            "resourceClaims": [{"name": "gpu", "resourceClaimTemplateName": template}, {"name": "shared", "resourceClaimName": "existing"}],
        },
    }


class Run:
    def __init__(self, apiserver: ApiServer) -> None:
        self.problems: list[str] = []
        options = KubeSourceOptions(settings=KubeSettings(server=str(apiserver.url).rstrip("/")), claim_templates=True, slices=True)
        self.source = KubernetesSource(None, self.problems.append, options=options)
        self.stop = asyncio.Event()
        self.events: asyncio.Queue[SourceEvent] = asyncio.Queue()
        self.task = asyncio.create_task(self._run())

    async def _run(self) -> None:
        async for event in self.source.events(self.stop):
            self.events.put_nowait(event)

    async def close(self) -> None:
        self.stop.set()
        await asyncio.wait_for(self.task, 5)


@pytest.fixture
async def runs(apiserver: ApiServer) -> AsyncIterator[Any]:
    started: list[Run] = []

    def start() -> Run:
        started.append(Run(apiserver))
        return started[-1]

    yield start
    for run in started:
        if not run.task.done():
            await run.close()


async def generated_claims(apiserver: ApiServer, count: int = 1, timeout: float = 5) -> list[dict[str, Any]]:
    async with asyncio.timeout(timeout):
        while len(found := apiserver.objects_of("resourceclaims")) < count:
            await asyncio.sleep(0.02)
    return found


async def test_pod_gets_its_claim_like_the_controller_makes_it(apiserver: ApiServer, runs: Any) -> None:
    apiserver.apply(TEMPLATE)
    stored_pod = apiserver.apply(pod())
    run = runs()
    (made,) = await generated_claims(apiserver)
    meta = made["metadata"]
    assert meta["generateName"] == "trainer-gpu-" and meta["name"].startswith("trainer-gpu-") and len(meta["name"]) > 12
    assert meta["annotations"][POD_CLAIM_NAME_ANNOTATION] == "gpu"
    assert meta["labels"] == {"team": "vision"}
    assert meta["ownerReferences"] == [
        {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": stored_pod["metadata"]["uid"], "controller": True, "blockOwnerDeletion": True}
    ]
    assert made["spec"] == TEMPLATE["spec"]["spec"]
    # The Pod's status names its claim, and the claim is submitted for allocation.
    async with asyncio.timeout(5):
        while not (apiserver.read("pods", "ml", "trainer").get("status") or {}).get("resourceClaimStatuses"):
            await asyncio.sleep(0.02)
        event = await run.events.get()
    assert apiserver.read("pods", "ml", "trainer")["status"]["resourceClaimStatuses"] == [{"name": "gpu", "resourceClaimName": meta["name"]}]
    assert isinstance(event, ev.ClaimSubmitted) and event.claim.metadata.name == meta["name"]


async def test_restart_and_repeated_events_create_no_second_claim(apiserver: ApiServer, runs: Any) -> None:
    apiserver.apply(TEMPLATE)
    apiserver.apply(pod())
    first = runs()
    await generated_claims(apiserver)
    # Pod updates arrive (labels), the source restarts, the Pod's status is lost: still one claim.
    current = apiserver.read("pods", "ml", "trainer")
    apiserver.apply({**current, "metadata": {**current["metadata"], "labels": {"x": "1"}}})
    await asyncio.sleep(0.2)
    await first.close()
    apiserver.apply({**apiserver.read("pods", "ml", "trainer"), "status": {}})
    runs()
    async with asyncio.timeout(5):
        while not (apiserver.read("pods", "ml", "trainer").get("status") or {}).get("resourceClaimStatuses"):
            await asyncio.sleep(0.02)  # the existing claim was adopted and recorded again
    assert len(apiserver.objects_of("resourceclaims")) == 1


async def test_missing_template_is_reported(apiserver: ApiServer, runs: Any) -> None:
    apiserver.apply(pod(template="nope"))
    run = runs()
    async with asyncio.timeout(5):
        while not run.problems:
            await asyncio.sleep(0.02)
    assert "trainer" in run.problems[0] and "404" in run.problems[0]
    assert apiserver.objects_of("resourceclaims") == []


async def test_rbac_of_the_claim_templates_overlay_is_exactly_what_is_called(apiserver: ApiServer, runs: Any) -> None:
    apiserver.apply(TEMPLATE)
    apiserver.apply(pod())
    runs()
    await generated_claims(apiserver)
    async with asyncio.timeout(5):
        while not (apiserver.read("pods", "ml", "trainer").get("status") or {}).get("resourceClaimStatuses"):
            await asyncio.sleep(0.02)
        while not any(r.params.get("watch") and r.resource.plural == "pods" for r in apiserver._requests if r.resource):
            await asyncio.sleep(0.02)
    agent = user_agent("ingestor")

    def verb(r: Any) -> str:
        method = r.method.value.upper()
        if method == "GET":
            return "watch" if r.params.get("watch") in ("true", "True", "1") else ("get" if r.name else "list")
        return {"POST": "create", "PATCH": "patch", "PUT": "update", "DELETE": "delete"}[method]

    called = {
        (r.resource.group, r.resource.plural + (f"/{r.subresource}" if r.subresource else ""), verb(r))
        for r in apiserver._requests
        if r.headers.get("User-Agent") == agent and r.resource is not None
    }
    overlay, base = granted(render(INFRA / "claim-templates"), "dralloc-ingestor"), granted(render(INFRA), "dralloc-ingestor")
    assert called <= overlay  # nothing it calls is missing
    assert overlay - base <= called  # and the overlay adds only what the controller calls
