"""DeviceTaintRules (resource.k8s.io/v1) listed and watched from the emulated API server, through the real client over HTTP."""

from __future__ import annotations

from typing import Any

from kube_emulator import ApiServer
from test_kube_source import CLASS, start  # noqa: F401 - the fixture

from dralloc.schemas import events as ev

RULE = {
    "apiVersion": "resource.k8s.io/v1",
    "kind": "DeviceTaintRule",
    "metadata": {"name": "gpu-0-broken"},
    "spec": {
        "deviceSelector": {"driver": "gpu.example.com", "device": "gpu-0"},
        "taint": {"key": "example.com/unhealthy", "value": "ecc", "effect": "NoExecute"},
    },
}


def rules(events: list[Any]) -> list[tuple[str, str, str | None]]:
    out = []
    for event in events:
        match event:
            case ev.DeviceTaintRulePublished(rule=r):
                out.append(("rule", r.metadata.name, r.spec.taint.effect))
            case ev.DeviceTaintRuleRemoved(name=n):
                out.append(("rule-removed", n, None))
    return out


async def test_rules_are_listed_watched_and_removed(apiserver: ApiServer, start: Any) -> None:  # noqa: F811
    apiserver.apply(CLASS)
    apiserver.apply(RULE)
    run = start()
    listed = await run.take(2)
    assert rules(listed) == [("rule", "gpu-0-broken", "NoExecute")]
    [published] = [e for e in listed if isinstance(e, ev.DeviceTaintRulePublished)]
    assert published.rule.spec.device_selector.device == "gpu-0"
    # a changed taint is news; a deleted rule is removed from the bus
    apiserver.apply({**RULE, "spec": {**RULE["spec"], "taint": {**RULE["spec"]["taint"], "effect": "NoSchedule"}}})
    assert rules(await run.take(1)) == [("rule", "gpu-0-broken", "NoSchedule")]
    apiserver.remove("devicetaintrules", None, "gpu-0-broken")
    assert rules(await run.take(1)) == [("rule-removed", "gpu-0-broken", None)]
    assert await run.quiet() == [] and run.problems == []
