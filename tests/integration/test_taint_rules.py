"""DeviceTaintRule over the bus: from a file, through the ingestor and INVENTORY, into the allocator."""

from __future__ import annotations

import asyncio
from pathlib import Path

from test_pipeline import EXAMPLES, ONE_NODE, claims_text, submitted, wait_for_store

from dralloc import demo
from dralloc.bus import Bus
from dralloc.manifest_events import events_from_manifests, removal_of
from dralloc.manifests import load_text
from dralloc.schemas import events as ev

RULE = """apiVersion: resource.k8s.io/v1
kind: DeviceTaintRule
metadata: {name: drain-everything}
spec:
  deviceSelector: {}
  taint: {key: example.com/drain, value: maintenance, effect: NoSchedule}
"""


def test_rule_events_from_files_round_trip() -> None:
    [event] = events_from_manifests(load_text(RULE, "rule.yaml"), print)
    assert isinstance(event, ev.DeviceTaintRulePublished)
    assert event.subject == "dra.devicetaintrules.drain-everything"
    assert ev.decode(ev.encode(event)) == event
    removed = removal_of(event)
    assert removed == ev.DeviceTaintRuleRemoved(name="drain-everything")
    assert removed.subject == event.subject  # the removal replaces the rule in INVENTORY


def test_a_rule_with_a_bad_name_is_refused_by_consumers() -> None:
    [event] = events_from_manifests(load_text(RULE, "rule.yaml"), print)
    bad = ev.encode(event).replace(b'"drain-everything"', b'"Drain_Everything"')
    try:
        ev.decode(bad)
    except ev.EventDecodeError as exc:
        assert "metadata.name" in str(exc)
    else:
        raise AssertionError("a rule whose name the API server refuses was decoded")


async def wait_for_rule(bus: Bus) -> None:
    """Until INVENTORY holds the slices and the rule (the claim must not overtake them)."""
    async with asyncio.timeout(10):
        while True:
            replayed, _ = await bus.replay("INVENTORY")
            kinds = {type(e) for e in replayed}
            if {ev.DeviceTaintRulePublished, ev.ResourceSlicePublished} <= kinds:
                return
            await asyncio.sleep(0.05)


async def test_a_rule_taints_devices_until_it_is_removed(bus: Bus, nats_url: str, tmp_path: Path) -> None:
    (tmp_path / "classes.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text())
    (tmp_path / "rule.yaml").write_text(RULE)
    [claim] = submitted(claims_text(("one", 1, "")))
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=ONE_NODE):
        await wait_for_rule(bus)
        await bus.publish(claim)
        statuses = await wait_for_store(bus, lambda s: "ml/one" in s)
        assert statuses["ml/one"].state == "unsatisfiable"
        assert "taints" in statuses["ml/one"].message
        # the rule is withdrawn: the waiting claim is tried again and fits
        await bus.publish(ev.DeviceTaintRuleRemoved(name="drain-everything"))
        statuses = await wait_for_store(bus, lambda s: s["ml/one"].state == "allocated")
    assert statuses["ml/one"].allocation.devices.results
