"""The engine answers the usual one-request unit without building the search (engine.py
`_take_first`, `_no_group`, `_take_group`): the answers, the messages and the search steps charged must be the
search's own, so a step budget runs out exactly where the search would have run out."""

from __future__ import annotations

import msgspec
import pytest

from dralloc.allocator.engine import Engine
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice


def _engine(devices: list[dict], *, budget: int = 500_000) -> Engine:
    engine = Engine(budget=budget)
    node = msgspec.convert({"metadata": {"name": "node-1", "labels": {"kubernetes.io/hostname": "node-1"}}}, Node)
    cls = msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": 'device.driver == "gpu.example.com"'}}]}}, DeviceClass)
    spec = {"driver": "gpu.example.com", "pool": {"name": "node-1", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": devices}
    for obj in (node, cls, msgspec.convert({"metadata": {"name": "node-1-gpus"}, "spec": spec}, ResourceSlice)):
        engine.apply(obj)
    return engine


def _claim(name: str, count: int, match: str | None = None) -> ResourceClaim:
    devices: dict = {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu", "count": count}}]}
    if match:
        devices["constraints"] = [{"matchAttribute": match}]
    return msgspec.convert({"metadata": {"name": name, "namespace": "ns"}, "spec": {"devices": devices}}, ResourceClaim)


def _gpus(domains: list[str]) -> list[dict]:
    """GPUs with a model every one shares and an NVLink domain each."""
    return [{"name": f"gpu-{i}", "attributes": {"model": {"string": "h100"}, "gpu.example.com/nvlink": {"string": domain}}} for i, domain in enumerate(domains)]


def _devices(outcome) -> list[str]:
    return [r.device for r in outcome.allocation.devices.results]


def test_a_claim_without_constraints_takes_what_the_search_takes():
    # the same claims with a matchAttribute every device satisfies go through the search
    domains = ["a", "a", "b", "b", "b", "b", "c", "c"]
    plain, searched = _engine(_gpus(domains)), _engine(_gpus(domains))
    for i, count in enumerate([1, 2, 1, 3]):
        (p,) = plain.allocate([_claim(f"c{i}", count)])
        (s,) = searched.allocate([_claim(f"c{i}", count, match="gpu.example.com/model")])
        assert p.status == s.status == "allocated"
        assert _devices(p) == _devices(s)


def test_a_claim_without_constraints_is_charged_one_step_per_device():
    (enough,) = _engine(_gpus(["a"] * 4), budget=3).allocate([_claim("c", 3)])
    assert enough.status == "allocated"
    (short,) = _engine(_gpus(["a"] * 4), budget=2).allocate([_claim("c", 3)])
    assert short.status == "error"
    assert "search budget of 2 steps exhausted" in short.message


def test_no_group_of_the_matched_attribute_is_refused_as_the_search_refuses():
    (pairs,) = _engine(_gpus(["p0", "p0", "p1", "p1"])).allocate([_claim("c", 4, match="gpu.example.com/nvlink")])
    assert pairs.status == "unsatisfiable"
    assert "on node node-1: no combination of the candidate devices satisfies the constraints, counters and capacity together" in pairs.message
    (two,) = _engine(_gpus(["p0", "p0", "p1", "p1"])).allocate([_claim("c", 2, match="gpu.example.com/nvlink")])
    assert two.status == "allocated"
    assert _devices(two) in (["gpu-0", "gpu-1"], ["gpu-2", "gpu-3"])  # one NVLink pair


def test_no_group_is_charged_one_step_per_value_tried():
    # the search tries each of the two NVLink domains once before it fails: two steps
    (within,) = _engine(_gpus(["p0", "p0", "p1", "p1"]), budget=2).allocate([_claim("c", 4, match="gpu.example.com/nvlink")])
    assert within.status == "unsatisfiable"
    (over,) = _engine(_gpus(["p0", "p0", "p1", "p1"]), budget=1).allocate([_claim("c", 4, match="gpu.example.com/nvlink")])
    assert over.status == "error"
    assert "search budget of 1 steps exhausted" in over.message


def _outcomes(engine: Engine, claims: list[tuple[str, int, str | None]], releases: set[int]) -> list[tuple]:
    """Each claim (name, count, matchAttribute) allocated in turn, those at `releases` released after
    theirs: (status, message, node, devices) per claim."""
    got = []
    for i, (name, count, match) in enumerate(claims):
        (outcome,) = engine.allocate([_claim(name, count, match=match)])
        got.append((outcome.status, outcome.message, outcome.node, _devices(outcome) if outcome.allocation else None))
        if i in releases:
            engine.release(f"ns/{name}")
    return got


def test_a_matched_group_takes_what_the_search_takes_with_its_steps(monkeypatch):
    # random NVLink layouts and claims of 1-4 matched GPUs, one after another (some released): the
    # shortcut and the search (the shortcut turned off) give the same outcomes, messages and
    # devices, at every step budget from too few to enough
    import random

    rng = random.Random(5)
    nvlink = "gpu.example.com/nvlink"
    searched = 0
    for _ in range(20):
        domains = [rng.choice("abcd") for _ in range(rng.randint(2, 8))]
        claims = [(f"c{i}", rng.randint(2, 4)) for i in range(rng.randint(2, 5))]
        releases = {rng.randrange(len(claims))}
        for budget in (1, 2, 3, 4, 5, 6, 500_000):
            runs = []
            for shortcut in (True, False):
                if not shortcut:
                    monkeypatch.setattr(Engine, "_take_group", lambda *args: None)
                engine = _two_nodes(domains)
                engine.budget = budget
                runs.append(_outcomes(engine, [(name, count, nvlink) for name, count in claims], releases))
                monkeypatch.undo()
            assert runs[0] == runs[1]
            searched += sum(1 for status, *_ in runs[0] if status == "allocated")
    assert searched > 100  # the answers compared are mostly allocations, not refusals


def _partitions_engine(devices: list[dict], counters: list[dict]) -> Engine:
    engine = _engine([])
    spec = {
        "driver": "gpu.example.com",
        "pool": {"name": "node-1", "generation": 2, "resourceSliceCount": 1},
        "nodeName": "node-1",
        "sharedCounters": counters,
        "devices": devices,
    }
    assert engine.apply(msgspec.convert({"metadata": {"name": "node-1-gpus"}, "spec": spec}, ResourceSlice)) == []
    return engine


def _shared_claim(name: str, memory: str, match: str | None = None) -> ResourceClaim:
    claim = msgspec.to_builtins(_claim(name, 1, match))
    claim["spec"]["devices"]["requests"][0]["exactly"]["capacity"] = {"requests": {"memory": memory}}
    return msgspec.convert(claim, ResourceClaim)


def test_one_partition_takes_what_the_search_takes():
    # partitions of one chip of 4 slices: each one taken changes which others still fit; a claim for
    # one device skips the search, the same claim with a matchAttribute every device has does not
    counters = [{"name": "chip", "counters": {"slices": {"value": "4"}}}]
    sizes = [1, 2, 4, 2, 1]
    devices = [
        {
            "name": f"part-{i}",
            "attributes": {"model": {"string": "h100"}},
            "consumesCounters": [{"counterSet": "chip", "counters": {"slices": {"value": str(n)}}}],
        }
        for i, n in enumerate(sizes)
    ]
    plain, searched = _partitions_engine(devices, counters), _partitions_engine(devices, counters)
    got = []
    for i in range(5):
        if i == 4:  # part-1's 2 slices back
            assert plain.release("ns/c1") and searched.release("ns/c1")
        (p,) = plain.allocate([_claim(f"c{i}", 1)])
        (s,) = searched.allocate([_claim(f"c{i}", 1, match="gpu.example.com/model")])
        assert (p.status, p.message) == (s.status, s.message)
        got.append(_devices(p) if p.status == "allocated" else p.status)
        assert got[-1] == (_devices(s) if s.status == "allocated" else s.status)
    # 1 + 2 slices, then only part-4's 1 fits (part-2 needs 4, part-3 2), then none; part-1 again once freed
    assert got == [["part-0"], ["part-1"], ["part-4"], "unsatisfiable", ["part-1"]]


def test_one_share_takes_what_the_search_takes():
    memory = {"memory": {"value": "8Gi", "requestPolicy": {"default": "8Gi", "validRange": {"min": "1Gi", "step": "1Gi"}}}}
    devices = [{"name": f"gpu-{i}", "attributes": {"model": {"string": "l40s"}}, "allowMultipleAllocations": True, "capacity": memory} for i in range(2)]
    plain, searched = _engine(devices), _engine(devices)
    got = []
    for i, size in enumerate(["3Gi", "6Gi", "5Gi", "4Gi", "2Gi", "1Gi", "4Gi"]):
        (p,) = plain.allocate([_shared_claim(f"c{i}", size)])
        (s,) = searched.allocate([_shared_claim(f"c{i}", size, match="gpu.example.com/model")])
        assert (p.status, p.message) == (s.status, s.message)
        got.append(_devices(p) if p.status == "allocated" else p.status)
        assert got[-1] == (_devices(s) if s.status == "allocated" else s.status)
        if p.status == "allocated":
            assert p.allocation.devices.results[0].consumed_capacity == {"memory": size}
    # two devices of 8Gi: 3 and 5 share gpu-0, 6 and 2 gpu-1; 4, 1 and 4 find no room
    assert got == [["gpu-0"], ["gpu-1"], ["gpu-0"], "unsatisfiable", ["gpu-1"], "unsatisfiable", "unsatisfiable"]


def _two_nodes(domains: list[str] = ("p0", "p0", "p1", "p1")) -> Engine:
    """node-1: GPUs in these NVLink domains (two pairs); node-b: one NVLink domain of four."""
    engine = _engine(_gpus(list(domains)))
    node = msgspec.convert({"metadata": {"name": "node-b", "labels": {"kubernetes.io/hostname": "node-b"}}}, Node)
    spec = {
        "driver": "gpu.example.com",
        "pool": {"name": "node-b", "generation": 1, "resourceSliceCount": 1},
        "nodeName": "node-b",
        "devices": _gpus(["q"] * 4),
    }
    engine.apply(node)
    engine.apply(msgspec.convert({"metadata": {"name": "node-b-gpus"}, "spec": spec}, ResourceSlice))
    return engine


def test_a_node_without_a_pair_is_known_to_hold_no_group_of_four():
    # learning node-1 for a claim of two also notes it for the claims of four seen before: it has no
    # domain of four, so a later claim of four does not try it (and says no node can hold it)
    engine = _two_nodes()
    nvlink = "gpu.example.com/nvlink"
    (four,) = engine.allocate([_claim("four", 4, match=nvlink)], node="node-b")
    assert _devices(four) == ["gpu-0", "gpu-1", "gpu-2", "gpu-3"]
    (two,) = engine.allocate([_claim("two", 2, match=nvlink)], node="node-1")
    assert two.status == "allocated"
    plan = engine.planner.plan(_claim("x", 4, match=nvlink), engine.inventory.classes, engine.inventory.class_versions)
    alt = plan.requests[0].alts[0]
    seen, hit = engine.verdicts.get(alt, 0).nodes(engine.inventory.version, alt.learn_key)
    a, b = (1 << engine.inventory.node_rank[n] for n in ("node-1", "node-b"))
    assert (seen & a, hit & a) == (a, 0)  # node-1: learned along with the claim of two, no group of four
    assert (seen & b, hit & b) == (b, b)
    (again,) = engine.allocate([_claim("four-again", 4, match=nvlink)])
    assert again.status == "unsatisfiable"
    assert again.message.startswith("cannot allocate the claim: no node has enough free devices that match the requests")


def test_the_largest_group_is_what_the_search_can_find():
    # nodes of random NVLink layouts: learning one claim size there notes every size's answer, and
    # each is what that size's search there decides
    import random

    rng = random.Random(3)
    nvlink = "gpu.example.com/nvlink"
    for _ in range(12):
        domains = [rng.choice("abc") for _ in range(rng.randint(1, 7))]
        most = max(domains.count(d) for d in set(domains))
        for size in (2, 3, 4):
            engine = _two_nodes(domains)
            for other in (2, 3, 4):  # every size's memory exists (learned on node-b) before node-1 is learned
                assert engine.allocate([_claim(f"probe-{other}", other, match=nvlink)], node="node-b")[0].status == "allocated"
                engine.release(f"ns/probe-{other}")
            engine.allocate([_claim("c", size, match=nvlink)], node="node-1")
            node = 1 << engine.inventory.node_rank["node-1"]
            for other in (2, 3, 4):
                plan = engine.planner.plan(_claim("c", other, match=nvlink), engine.inventory.classes, engine.inventory.class_versions)
                alt = plan.requests[0].alts[0]
                seen, hit = engine.verdicts.get(alt, 0).nodes(engine.inventory.version, alt.learn_key)
                assert seen & node
                searched = _two_nodes(domains).allocate([_claim("s", other, match=nvlink)], node="node-1")[0]
                assert bool(hit & node) == (most >= other) == (searched.status == "allocated")


def test_the_learned_group_follows_the_nodes_devices():
    # a node's groups are counted from bitsets per attribute value cached on its topology
    # (topology.value_bits): when its devices are published anew (another NVLink layout, a device
    # without the attribute) they are counted anew, and agree with the search there
    nvlink = "gpu.example.com/nvlink"
    engine = _two_nodes(["p0", "p0", "p1", "p1"])
    node = 1 << engine.inventory.node_rank["node-1"]

    def learned(size: int) -> bool:
        plan = engine.planner.plan(_claim("x", size, match=nvlink), engine.inventory.classes, engine.inventory.class_versions)
        alt = plan.requests[0].alts[0]
        seen, hit = engine.verdicts.get(alt, 0).nodes(engine.inventory.version, alt.learn_key)
        assert seen & node
        return bool(hit & node)

    assert engine.allocate([_claim("four", 4, match=nvlink)], node="node-1")[0].status == "unsatisfiable"
    assert engine.allocate([_claim("two", 2, match=nvlink)], node="node-1")[0].status == "allocated"
    assert (learned(2), learned(4)) == (True, False)
    engine.release("ns/two")
    devices = [*_gpus(["q", "q", "q"]), {"name": "gpu-3", "attributes": {"model": {"string": "h100"}}}]
    spec = {"driver": "gpu.example.com", "pool": {"name": "node-1", "generation": 2, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": devices}
    engine.apply(msgspec.convert({"metadata": {"name": "node-1-gpus"}, "spec": spec}, ResourceSlice))
    (three,) = engine.allocate([_claim("three", 3, match=nvlink)], node="node-1")
    assert _devices(three) == ["gpu-0", "gpu-1", "gpu-2"]
    engine.release("ns/three")
    assert engine.allocate([_claim("four-again", 4, match=nvlink)], node="node-1")[0].status == "unsatisfiable"
    assert (learned(3), learned(4)) == (True, False)


def test_a_node_no_object_names_is_refused_not_a_traceback():
    engine = _engine(_gpus(["a", "a"]))
    (outcome,) = engine.allocate([_claim("c", 1)], node="no-such-node")
    assert outcome.status == "unsatisfiable"
    assert (
        outcome.message
        == "cannot allocate the claim on node no-such-node: claim ns/c, request gpu: 0 device(s) on node no-such-node match the class and selectors, 1 wanted"
    )
    (again,) = engine.allocate([_claim("c", 1)], node="no-such-node", explain=True)
    assert again.message == outcome.message
    assert engine.allocate([_claim("c", 1)])[0].status == "allocated"


def _chips(domains: list[str], split: set[int]) -> tuple[list[dict], list[dict]]:
    """MIG-capable chips of 2 slices, each its own counter set, in these NVLink domains: the whole
    chip takes both slices; a chip in `split` also publishes its halves (one slice each)."""
    devices, counters = [], []
    for i, domain in enumerate(domains):
        attributes = {"model": {"string": "a100"}, "gpu.example.com/nvlink": {"string": domain}}
        counters.append({"name": f"chip-{i}", "counters": {"slices": {"value": "2"}}})
        parts = [(f"chip-{i}", 2)] + ([(f"chip-{i}-half-{h}", 1) for h in range(2)] if i in split else [])
        for name, slices in parts:
            consumes = [{"counterSet": f"chip-{i}", "counters": {"slices": {"value": str(slices)}}}]
            devices.append({"name": name, "attributes": attributes, "consumesCounters": consumes})
    return devices, counters


@pytest.mark.interpreted
def test_candidates_with_counter_sets_of_their_own_take_what_the_search_takes(monkeypatch):
    # MIG-capable chips, some with their halves published too: the shortcuts take candidates that
    # each draw on a counter set of their own (`search.independent`) and leave the rest to the
    # search; with the shortcuts and without (all three turned off), the same outcomes, messages
    # and devices at every step budget, claims of 1-4 with and without a matchAttribute
    import random

    rng = random.Random(3)
    nvlink = "gpu.example.com/nvlink"
    shortcut_with_counters = 0
    for _ in range(40):
        domains = [rng.choice("ab") for _ in range(rng.randint(2, 6))]
        split = {i for i in range(len(domains)) if rng.random() < 0.3}
        devices, counters = _chips(domains, split)
        claims = [(f"c{i}", rng.randint(1, 4), rng.random() < 0.6) for i in range(rng.randint(2, 5))]
        releases = {rng.randrange(len(claims))}
        for budget in (1, 2, 3, 4, 6, 500_000):
            runs = []
            for shortcut in (True, False):
                if shortcut:
                    take_group = Engine._take_group

                    def counted(self, option, *args, _take_group=take_group):
                        nonlocal shortcut_with_counters
                        found = _take_group(self, option, *args)
                        shortcut_with_counters += found is not None and any(rec.consumes for rec in option[2])
                        return found

                    monkeypatch.setattr(Engine, "_take_group", counted)
                else:
                    monkeypatch.setattr(Engine, "_take_first", lambda *args: None)
                    monkeypatch.setattr(Engine, "_take_group", lambda *args: None)
                    monkeypatch.setattr(Engine, "_no_group", lambda *args: False)
                engine = _partitions_engine(devices, counters)
                engine.budget = budget
                runs.append(_outcomes(engine, [(name, count, nvlink if match else None) for name, count, match in claims], releases))
                monkeypatch.undo()
            assert runs[0] == runs[1]
    assert shortcut_with_counters > 25  # whole chips of their own sets did skip the search
