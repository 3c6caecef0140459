"""The engine remembers what failed on a node (misfits.py) only while nothing there changes:
a remembered failure must never hide a node that has become able to take the claim."""

from __future__ import annotations

import msgspec

from dralloc.allocator.engine import Engine, misfits
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice


def _node(name: str) -> Node:
    return msgspec.convert({"metadata": {"name": name, "labels": {"kubernetes.io/hostname": name}}}, Node)


def _class() -> DeviceClass:
    return msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}, DeviceClass)


def _slice(name: str, node: str, devices: list[dict], *, pool: str, count: int = 1, counters: list | None = None) -> ResourceSlice:
    spec = {"driver": "gpu.example.com", "pool": {"name": pool, "generation": 1, "resourceSliceCount": count}, "nodeName": node, "devices": devices}
    if counters:
        spec["sharedCounters"] = counters
    return msgspec.convert({"metadata": {"name": name}, "spec": spec}, ResourceSlice)


def _claim(name: str, count: int = 1) -> ResourceClaim:
    return msgspec.convert(
        {
            "metadata": {"name": name, "namespace": "ns"},
            "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}},
        },
        ResourceClaim,
    )


def _engine(*slices: ResourceSlice) -> Engine:
    engine = Engine()
    for obj in (_node("node-1"), _node("node-2"), _class(), *slices):
        engine.apply(obj)
    return engine


def test_a_remembered_failure_gives_the_same_message_and_ends_when_the_node_changes():
    engine = _engine(*(_slice(f"{n}-gpus", n, [{"name": "gpu-0"}, {"name": "gpu-1"}], pool=n) for n in ("node-1", "node-2")))
    full = engine.allocate([_claim("a", 2), _claim("b", 2)])
    assert [o.status for o in full] == ["allocated", "allocated"]
    (first,) = engine.allocate([_claim("c")], node="node-2")
    (again,) = engine.allocate([_claim("d")], node="node-2")  # the same shape, nothing changed: remembered
    assert first.status == again.status == "unsatisfiable"
    assert again.message == first.message.replace("ns/c", "ns/d")
    held = full[0] if full[0].node == "node-2" else full[1]
    assert engine.release(held.claim)
    (after,) = engine.allocate([_claim("e")], node="node-2")
    assert after.status == "allocated" and after.node == "node-2"


def test_a_change_on_another_node_of_the_same_pool_ends_what_was_remembered():
    # one pool across two nodes, one counter shared by a device on each: taking the device on
    # node-1 leaves node-2's without counter room; releasing it (a change on node-1) gives it back
    counters = [{"name": "board", "counters": {"power": {"value": "1"}}}]
    uses = [{"counterSet": "board", "counters": {"power": {"value": "1"}}}]
    engine = _engine(
        _slice("s-1", "node-1", [{"name": "dev-a", "consumesCounters": uses}], pool="shared", count=2, counters=counters),
        _slice("s-2", "node-2", [{"name": "dev-b", "consumesCounters": uses}], pool="shared", count=2),
    )
    (x,) = engine.allocate([_claim("x")], node="node-1")
    assert x.status == "allocated"
    (y,) = engine.allocate([_claim("y")], node="node-2")
    assert y.status == "unsatisfiable" and "counter" in y.message
    assert engine.release("ns/x")
    (z,) = engine.allocate([_claim("z")], node="node-2")
    assert z.status == "allocated" and [r.device for r in z.allocation.devices.results] == ["dev-b"]


def _grouped_claim(name: str, count: int) -> ResourceClaim:
    claim = msgspec.to_builtins(_claim(name, count))
    claim["spec"]["devices"]["constraints"] = [{"matchAttribute": "gpu.example.com/domain"}]
    return msgspec.convert(claim, ResourceClaim)


def test_nodes_without_a_large_enough_matchattribute_group_are_skipped_not_lost():
    # node-1: four GPUs in NVLink pairs; node-2: four in one domain, one of them listing both
    # domains (a list attribute counts for each of its values)
    pairs = [{"name": f"gpu-{i}", "attributes": {"domain": {"string": f"pair-{i // 2}"}}} for i in range(4)]
    quad = [{"name": f"gpu-{i}", "attributes": {"domain": {"string": "quad"}}} for i in range(3)]
    quad.append({"name": "gpu-3", "attributes": {"domain": {"strings": ["pair-x", "quad"]}}})
    engine = _engine(_slice("node-1-gpus", "node-1", pairs, pool="node-1"), _slice("node-2-gpus", "node-2", quad, pool="node-2"))
    (four,) = engine.allocate([_grouped_claim("four", 4)])
    assert four.status == "allocated" and four.node == "node-2"
    (two,) = engine.allocate([_grouped_claim("two", 2)])
    assert two.status == "allocated" and two.node == "node-1"
    (more,) = engine.allocate([_grouped_claim("more", 4)])
    assert more.status == "unsatisfiable"
    assert "or no 4 of them with one value of gpu.example.com/domain (matchAttribute)" in more.message


def _one_of(name: str, domain: str) -> ResourceClaim:
    claim = msgspec.to_builtins(_claim(name))
    expression = f'device.attributes["gpu.example.com"].domain == "{domain}"'
    claim["spec"]["devices"]["requests"][0]["exactly"]["selectors"] = [{"cel": {"expression": expression}}]
    return msgspec.convert(claim, ResourceClaim)


def test_a_claim_that_fits_nowhere_skips_unchanged_nodes_and_tries_a_node_again_once_it_changes():
    # three nodes of two NVLink-style pairs; one GPU of each pair taken: two free on every node,
    # never two of one domain, so a matched pair fits nowhere
    engine = Engine()
    for obj in (_node("node-1"), _node("node-2"), _node("node-3"), _class()):
        engine.apply(obj)
    for n in ("node-1", "node-2", "node-3"):
        gpus = [{"name": f"gpu-{i}", "attributes": {"domain": {"string": "ab"[i // 2]}}} for i in range(4)]
        engine.apply(_slice(f"{n}-gpus", n, gpus, pool=n))
        for domain in "ab":
            (held,) = engine.allocate([_one_of(f"held-{n}-{domain}", domain)], node=n)
            assert held.status == "allocated"
    (first,) = engine.allocate([_grouped_claim("first", 2)])
    assert first.status == "unsatisfiable" and "(3 nodes tried)" in first.message
    plans = [engine._plan(_grouped_claim("probe", 2))]
    assert engine.misfits.known(plans) == 0b111  # every node remembered for this shape
    (second,) = engine.allocate([_grouped_claim("second", 2)])
    # not walked again: one remembered node still says why
    assert second.status == "unsatisfiable" and "nodes tried" not in second.message and "node-1" in second.message
    assert second.message.replace("ns/second", "ns/first").endswith(first.message.split("; ", 1)[1])
    assert engine.release("ns/held-node-2-a")
    assert engine.misfits.known(plans) == 0b101  # node-2 changed: its failure no longer holds
    (third,) = engine.allocate([_grouped_claim("third", 2)])
    assert third.status == "allocated" and third.node == "node-2"
    # a claim of another shape knows nothing of these failures
    assert engine.misfits.known([engine._plan(_grouped_claim("other", 3))]) == 0


def test_a_record_logs_each_node_it_changes_once_however_many_devices_it_holds_there():
    # Misfits reads the ledger's log of changed nodes per claim shape: a four-device claim is one
    # change of its node (taken and released), and a pool across two nodes is a change of both
    counters = [{"name": "board", "counters": {"power": {"value": "1"}}}]
    uses = [{"counterSet": "board", "counters": {"power": {"value": "1"}}}]
    engine = _engine(
        _slice("node-1-gpus", "node-1", [{"name": f"gpu-{i}"} for i in range(4)], pool="node-1"),
        _slice("s-1", "node-2", [{"name": "dev-a", "consumesCounters": uses}], pool="shared", count=2, counters=counters),
        _slice("s-2", "node-1", [{"name": "dev-b", "consumesCounters": uses}], pool="shared", count=2),
    )
    ledger, rank = engine.ledger, engine.inventory.node_rank
    (four,) = engine.allocate([_claim("four", 4)], node="node-1")
    assert four.status == "allocated" and len(four.allocation.devices.results) == 4
    assert ledger.touched == [rank["node-1"]]
    assert engine.release("ns/four")
    assert ledger.touched == [rank["node-1"]] * 2
    (one,) = engine.allocate([_claim("one")], node="node-2")
    assert one.status == "allocated" and [r.device for r in one.allocation.devices.results] == ["dev-a"]
    assert sorted(ledger.touched[2:]) == sorted([rank["node-1"], rank["node-2"]])
    assert ledger.node_changes == {"node-1": 3, "node-2": 1}


def test_a_shape_is_numbered_once_and_a_number_never_names_another_shape_after_a_restart(monkeypatch):
    # keys hold a shape's number: claims of one template share it; once the memo starts over,
    # a new shape must not be given a number a plan still holds for another
    engine = _engine(*(_slice(f"{n}-gpus", n, [{"name": "gpu-0"}, {"name": "gpu-1"}], pool=n) for n in ("node-1", "node-2")))
    memo = engine.misfits
    one, two, one_again = engine._plan(_claim("one")), engine._plan(_claim("two", 2)), engine._plan(_claim("one-again"))
    assert memo.shape(one) == memo.shape(one_again) != memo.shape(two)
    monkeypatch.setattr(misfits, "MAX_ENTRIES", 0)  # the next remembered failure starts the memo over
    memo.put(memo.key([one], "node-1"), one, "claim ns/one, does not fit", None, 1)
    grouped = engine._plan(_grouped_claim("grouped", 2))
    assert memo.shape(grouped) not in (memo.shape(one), memo.shape(two))
    assert memo.shape(engine._plan(_claim("one-later"))) != memo.shape(grouped)
