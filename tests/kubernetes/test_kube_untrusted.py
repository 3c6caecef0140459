"""Objects in the cluster no decoder can take (nested past the limit, an integer outside int64) and
names the API server would refuse, through the real client over HTTP against the emulated API
server: each is reported and skipped, in a list and in a watch, and the others still flow."""

from __future__ import annotations

import asyncio
import json
from typing import Any

from kube_emulator import ApiServer
from test_kube_source import CLASS, claim, names, start  # noqa: F401 (start: the fixture)

from dralloc.bus import Bus, embedded_nats
from dralloc.bus.raw import jetstream
from dralloc.ingestor.service import publish_until_stored
from dralloc.schemas import events as ev

DEPTH = 200  # past dralloc's limit (100); the emulator (deepcopy, json) still takes it


def nested(depth: int) -> Any:
    value: Any = []
    for _ in range(depth - 1):
        value = [value]
    return value


def deep_claim(name: str) -> dict[str, Any]:
    doc = claim(name)
    doc["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.example.com", "parameters": nested(DEPTH)}}]
    return doc


async def test_a_listed_and_a_watched_poison_are_reported_and_skipped_and_not_taken_for_deleted(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(CLASS)
    apiserver.apply(claim("a"))
    apiserver.apply(deep_claim("deep-listed"))
    big = claim("big-listed")
    big["spec"]["devices"]["requests"][0]["exactly"]["count"] = 10**400
    apiserver.apply(big)
    run = start()
    listed = await run.take(2)
    assert sorted(names(listed)) == [("class", "gpu.example.com"), ("submitted", "default/a")]
    problems = sorted(run.problems)
    assert len(problems) == 2, problems
    assert problems[0].startswith("resourceclaims: ResourceClaim/default/big-listed skipped: an integer of 401 digits")
    assert problems[1] == "resourceclaims: ResourceClaim/default/deep-listed skipped: nested more than 100 levels deep"

    apiserver.apply(deep_claim("deep-watched"))
    apiserver.apply(claim("b"))
    (event,) = await run.take(1)
    assert names([event]) == [("submitted", "default/b")]
    assert run.problems[2] == "resourceclaims: watch event for ResourceClaim/default/deep-watched skipped: nested more than 100 levels deep"

    # A relist (410 Gone) sees the poisoned ones again: still skipped, never taken for deleted.
    apiserver.hold_watches()
    apiserver.close_watches()  # the next watch waits at the gate
    apiserver.apply(claim("c"))  # unseen by any watch, then history forgotten: the watch gets 410 Gone
    apiserver.apply(deep_claim("a"))  # a known claim turns unreadable: it is not taken for deleted either
    apiserver.compact()
    apiserver.release_watches()
    after = await run.take(1)  # c comes with the relist (a, b and the class are unchanged: not sent again)
    after += await run.quiet(0.5)
    assert names(after) == [("submitted", "default/c")]  # no ClaimDeleted for the poisoned ones
    assert sum("deep-listed skipped" in p for p in run.problems) == 2  # reported again by the relist
    assert "resourceclaims: ResourceClaim/default/a skipped: nested more than 100 levels deep" in run.problems


async def test_a_cluster_object_with_a_name_the_api_server_refuses_is_not_published(apiserver: ApiServer, start: Any) -> None:
    apiserver.apply(claim("bad name"))
    apiserver.apply(claim("c", namespace="team-a/b"))
    apiserver.apply(claim("fine"))
    run = start()
    listed = [e for e in await run.take(3) if isinstance(e, ev.ClaimSubmitted)]
    reports: list[str] = []
    async with embedded_nats() as url, await Bus.connect(url, name="test") as bus:
        await bus.ensure_streams()
        import dralloc.ingestor.service as service

        original, service._report = service._report, reports.append
        try:
            for event in listed:
                assert await publish_until_stored(bus, event, asyncio.Event())
        finally:
            service._report = original
        published = (await jetstream(bus).stream_info("CLAIMS", subjects_filter="dra.claims.>")).state.subjects or {}
    assert set(published) == {"dra.claims.default.fine"}
    assert sorted(reports) == [
        "not published: ClaimSubmitted: metadata.name: 'bad name' is not a DNS subdomain: at most 253 lowercase letters, digits, '-' and '.', starting and ending with a letter or digit",
        "not published: ClaimSubmitted: metadata.namespace: 'team-a/b' is not a DNS label: at most 63 lowercase letters, digits and '-', starting and ending with a letter or digit",
    ]
    json.dumps(reports)  # (plain lines: no traceback, nothing binary)


async def test_the_status_writer_refuses_a_cluster_claim_nested_past_the_limit_without_retrying(apiserver: ApiServer, api: Any) -> None:
    from test_kube_sink import committed

    from dralloc.bus import Permanent
    from dralloc.statuswriter.kubernetes import KubernetesSink

    sink = KubernetesSink(api=api, report=lambda result: None)
    stored = apiserver.apply(claim("c"))
    poisoned = deep_claim("c")
    poisoned["metadata"] = stored["metadata"]
    apiserver.apply(poisoned)
    try:
        await sink.committed(committed(stored))
    except Permanent as exc:  # dead-lettered with this reason by the status writer's consumer
        assert str(exc) == "claim default/c as the cluster holds it cannot be read: nested more than 100 levels deep"
    else:
        raise AssertionError("a claim no decoder can take was written")
    assert "status" not in apiserver.read("resourceclaims", "default", "c")


async def test_a_template_nested_past_the_limit_is_reported_and_other_pods_still_get_their_claims(apiserver: ApiServer) -> None:
    from test_kube_templates import TEMPLATE, Run, pod

    deep = json.loads(json.dumps(TEMPLATE))
    deep["metadata"]["name"] = "deep"
    deep["spec"]["spec"]["devices"]["config"] = [{"opaque": {"driver": "gpu.example.com", "parameters": nested(DEPTH)}}]
    apiserver.apply(deep)
    apiserver.apply(TEMPLATE)
    apiserver.apply(pod("poisoned", template="deep"))
    apiserver.apply(pod("fine"))
    run = Run(apiserver)
    try:
        async with asyncio.timeout(10):
            while not [c for c in apiserver.objects_of("resourceclaims") if c["metadata"]["name"].startswith("fine-gpu-")]:
                await asyncio.sleep(0.05)
            while not run.problems:
                await asyncio.sleep(0.05)
        assert run.problems == ["Pod ml/poisoned claim 'gpu': ResourceClaimTemplate ml/deep: nested more than 100 levels deep"]
        assert not [c for c in apiserver.objects_of("resourceclaims") if c["metadata"]["name"].startswith("poisoned-")]
        assert not run.task.done()  # the source goes on
    finally:
        await run.close()
