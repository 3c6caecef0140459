"""Selector projections (engine/projection.py) and the verdicts devices share through them (verdicts.py)."""

from __future__ import annotations

import re

import msgspec
import pytest
from one_node import claim, engine_with
from upstream_corpus import selectors_and_devices

from dralloc.allocator.engine import Engine, cel, projection, projector
from dralloc.allocator.engine.cel import CelCompileError, CelRuntimeError, compile_selector, device_env
from dralloc.allocator.engine.cel_syntax import parse
from dralloc.allocator.engine.projection import fields, fields_of
from dralloc.allocator.engine.projector import project, representable
from dralloc.schemas.resource import Device

D = 'device.attributes["gpu.example.com"]'

LISTED = [
    ('device.driver == "gpu.example.com"', [("driver",)]),
    ("device.allowMultipleAllocations", [("allowMultipleAllocations",)]),
    (f'{D}.model == "h100"', [("attributes", "gpu.example.com", "model")]),
    (f'{D}["model"] == "h100"', [("attributes", "gpu.example.com", "model")]),
    (f'{D}.?model.orValue("") == "h100"', [("attributes", "gpu.example.com", "model")]),
    (f'{D}[?"model"].hasValue()', [("attributes", "gpu.example.com", "model")]),
    (f"has({D}.model)", [("attributes", "gpu.example.com", "model")]),
    (f'"model" in {D}', [("attributes", "gpu.example.com", "model")]),
    ('device.attributes.gpu.model == "x"', [("attributes", "gpu", "model")]),
    ('device.capacity["gpu.example.com"].memory.compareTo(quantity("40Gi")) >= 0', [("capacity", "gpu.example.com", "memory")]),
    (f'has({D}.cc) && {D}.cc.isGreaterThan(semver("8.0.0")) || device.driver == "x"', [("attributes", "gpu.example.com", "cc"), ("driver",)]),
    (f"cel.bind(m, {D}.memory, m > 1 && m < 9)", [("attributes", "gpu.example.com", "memory")]),
    (f'["a", "b"].exists(x, {D}.model == x)', [("attributes", "gpu.example.com", "model")]),
    # a domain map bound by cel.bind: its named fields are what is read
    (f'cel.bind(m, {D}, m.model == "h100")', [("attributes", "gpu.example.com", "model")]),
    (f'cel.bind(m, {D}, "model" in m && has(m.cc) && m["arch"] == "x")', [("attributes", "gpu.example.com", n) for n in ("arch", "cc", "model")]),
    (f'cel.bind(m, {D}, cel.bind(n, m, n.model == "x"))', [("attributes", "gpu.example.com", "model")]),
    (f"cel.bind(m, {D}, [1].exists(m, m > 0) && m.model == 1)", [("attributes", "gpu.example.com", "model")]),  # shadowed, then back
    (f"cel.bind(m, {D}, cel.bind(m, 1, m > 0))", []),  # rebound to a value: not the map
    # `device` bound by a macro or cel.bind is not the device
    ("[1, 2].exists(device, device > 1)", []),
    ("cel.bind(device, 3, device > 1)", []),
    ("true", []),
]

DYNAMIC = [
    f"size({D}) > 0",  # the whole domain map
    f'{D}.exists(k, k == "model")',  # iterated
    f"{D} == {{}}",  # compared
    f"cel.bind(m, {D}, size(m) > 0)",  # a domain map bound, then used whole
    f'cel.bind(m, {D}, m.exists(k, k == "model"))',
    f"cel.bind(m, {D}, m == {{}})",
    '"gpu.example.com" in device.attributes',  # a domain's presence
    "has(device.attributes.gpu)",
    "size(device.attributes) > 0",
    'device.attributes.exists(d, d == "x")',
    'device.attributes["gpu" + ".example.com"].model == "h100"',  # computed domain
    'device.attributes[device.driver].model == "h100"',
    f'{D}["mo" + "del"] == "h100"',  # computed name
    f'["model"].exists(n, n in {D})',
    f'{D}[string(1)] == "h100"',
    "device.?driver.hasValue()",
    "has(device.driver)",
    "device.capacity.size() > 0",
    'device.attributes[?"gpu.example.com"].?model.hasValue()',  # optional domain lookup
    "[device].size() == 1",  # the device itself
    'cel.bind(d, device, d.driver == "x")',
    "[1].exists(x, cel.bind(device, x, true)) && device.attributes.size() > 0",  # shadowing ends with the scope
]


@pytest.mark.parametrize(("expression", "expected"), LISTED)
def test_fields_listed_statically(expression: str, expected: list) -> None:
    assert fields_of(expression) == tuple(sorted(expected))


@pytest.mark.parametrize("expression", DYNAMIC)
def test_dynamic_reads_have_no_projection(expression: str) -> None:
    """Evaluated on each device, never shared (some of these the checker also refuses)."""
    assert fields(parse(expression)) is None


def test_deep_nesting_has_no_projection_rather_than_a_crash() -> None:
    from dralloc.allocator.engine.cel_syntax import Binary, Lit

    ast = Lit(True, "bool")
    for _ in range(5000):  # deeper than the parser allows: the walk must not raise
        ast = Binary("&&", ast, Lit(True, "bool"))
    assert fields(ast) is None


def _device(raw: dict) -> Device:
    return msgspec.convert(raw, Device)


def test_projection_keeps_what_the_selector_sees_and_only_that() -> None:
    shape = fields_of(f'{D}.model == "h100"')
    a = _device({"name": "a", "attributes": {"model": {"string": "h100"}, "uuid": {"string": "1"}}})
    b = _device({"name": "b", "attributes": {"gpu.example.com/model": {"string": "h100"}, "uuid": {"string": "2"}}})
    c = _device({"name": "c", "attributes": {"model": {"string": "a100"}}})
    missing = _device({"name": "d", "attributes": {"uuid": {"string": "3"}}})
    key = project(shape, "gpu.example.com", a)
    assert key == project(shape, "gpu.example.com", b)  # bare and qualified names: the same field
    assert key != project(shape, "gpu.example.com", c)
    assert project(shape, "gpu.example.com", missing) not in (key, project(shape, "gpu.example.com", c))
    # a bare name belongs to the driver's domain: under another driver the field is absent
    assert project(shape, "other.example.com", a) == project(shape, "other.example.com", missing)


def test_projection_tells_types_apart() -> None:
    shape = fields_of(f"{D}.flag == true")
    one = _device({"name": "a", "attributes": {"flag": {"int": 1}}})
    true = _device({"name": "b", "attributes": {"flag": {"bool": True}}})
    assert project(shape, "gpu.example.com", one) != project(shape, "gpu.example.com", true)


def test_projection_follows_the_later_of_a_bare_and_a_qualified_name() -> None:
    shape = fields_of(f'{D}.model == "h100"')
    bare_last = _device({"name": "a", "attributes": {"gpu.example.com/model": {"string": "a100"}, "model": {"string": "h100"}}})
    qualified_last = _device({"name": "b", "attributes": {"model": {"string": "h100"}, "gpu.example.com/model": {"string": "a100"}}})
    sel = compile_selector(f'{D}.model == "h100"')
    for dev in (bare_last, qualified_last):
        assert sel.matches(device_env("gpu.example.com", dev)) is (project(shape, "gpu.example.com", dev)[1] == b'{"string":"h100"}')
    assert project(shape, "gpu.example.com", bare_last) != project(shape, "gpu.example.com", qualified_last)


def test_unrepresentable_devices_are_found() -> None:
    assert representable("gpu.example.com", _device({"name": "a", "attributes": {"v": {"version": "1.2.3"}}}))
    assert not representable("gpu.example.com", _device({"name": "a", "attributes": {"v": {"version": "not-a-version"}}}))
    assert not representable("gpu.example.com", _device({"name": "a", "attributes": {"v": {"int": 2**70}}}))
    assert not representable("gpu.example.com", _device({"name": "a", "attributes": {"v": {}}}))
    assert not representable("gpu.example.com", _device({"name": "a", "attributes": {"v": {"ints": [1, 2**70]}}}))
    assert not representable("gpu.example.com", _device({"name": "a", "capacity": {"m": {"value": "lots"}}}))
    assert representable("gpu.example.com", _device({"name": "a", "capacity": {"m": {"value": "80Gi"}}, "attributes": {"v": {"ints": [1]}}}))
    for raw in ({"v": {}}, {"v": {"version": "x"}}):  # what the engine's environment says of the same devices
        assert device_env("gpu.example.com", _device({"name": "a", "attributes": raw})).error is not None
    assert device_env("gpu.example.com", _device({"name": "a", "capacity": {"m": {"value": "lots"}}})).error is not None


def test_a_shared_capacity_map_is_answered_for_each_device_that_holds_it() -> None:
    """`representable` remembers a capacity map's answer by the map instance (repeats.py shares one
    map among the namesakes of a profile): every device holding it gets that answer, and a device
    whose own map differs, however alike it looks, is tested on its own."""
    good = _device({"name": "a", "capacity": {"m": {"value": "80Gi"}}})
    bad = _device({"name": "a", "capacity": {"m": {"value": "80 Gi"}}})
    assert representable("gpu.example.com", good)
    assert not representable("gpu.example.com", bad)
    shared_good = _device({"name": "b"})
    shared_good.capacity = good.capacity  # (as repeats.py points a namesake at the equal map)
    shared_bad = _device({"name": "b", "attributes": {"v": {"int": 1}}})
    shared_bad.capacity = bad.capacity
    assert representable("gpu.example.com", shared_good)
    assert not representable("gpu.example.com", shared_bad)
    for _ in range(projector.CAPACITY_MAPS_KEPT + 1):  # past the bound: starts over, answers stay right
        assert representable("gpu.example.com", _device({"name": "c", "capacity": {"m": {"value": "1"}}}))
    assert not representable("gpu.example.com", bad)


# --- the property: over the upstream corpus, sharing by projection changes no outcome ----------------


def _outcome(selector: cel.Selector, env: cel.DeviceEnv, name: str) -> object:
    """The per-device outcome, with this device's name taken out of an error (it names the device)."""
    try:
        return selector.matches(env)
    except CelRuntimeError as exc:
        return str(exc).replace(f" (device {env.driver}/{name})", " (device *)")


PER_GROUP = 6
"""Devices compared in each group of equal projections (all of a group must agree; a few suffice to
catch a field left out, and keep 650 selectors x 4,500 devices within a test's time)."""


def test_devices_with_equal_projections_get_equal_outcomes_over_the_upstream_corpus() -> None:
    expressions, raw_devices = selectors_and_devices()
    devices = [(driver, msgspec.convert(raw, Device)) for driver, raw in raw_devices]
    envs: dict[int, cel.DeviceEnv] = {}
    projected = shared_groups = 0
    for expression in expressions:
        try:
            selector = compile_selector(expression)
        except CelCompileError:
            continue
        shape = fields(selector.ast)
        if shape is None:
            continue
        projected += 1
        groups: dict[tuple, list[int]] = {}
        for i, (driver, dev) in enumerate(devices):
            if representable(driver, dev):
                groups.setdefault(project(shape, driver, dev), []).append(i)
        for members in groups.values():
            if len(members) < 2:
                continue
            shared_groups += 1
            outcomes = set()
            for i in members[:PER_GROUP]:
                driver, dev = devices[i]
                env = envs.get(i) or envs.setdefault(i, device_env(driver, dev))
                outcomes.add(_outcome(selector, env, dev.name))
            assert len(outcomes) == 1, (expression, [devices[i][1].name for i in members[:PER_GROUP]], outcomes)
    # the corpus exercises the feature: most selectors have a projection and share across devices
    assert projected > len(expressions) // 2 and shared_groups > 1000


# --- through the engine: shared verdicts are the per-device ones, and cost no environment ----------


def _engine(devices: int, budget: int | None = None) -> Engine:
    items = (
        f'{{name: gpu-{i}, attributes: {{index: {{int: {i}}}, uuid: {{string: "u-{i}"}}, model: {{string: {"h100" if i % 2 else "a100"}}}'
        f"{', memoryGiB: {int: 80}' if i % 4 == 1 else ''}}}}}"
        for i in range(devices)
    )
    return engine_with(items) if budget is None else engine_with(items, cel_budget=budget)


# a match on some devices (h100 with memoryGiB), no match on others (a100), a runtime error on the
# rest (h100 without memoryGiB: no such key), each on several devices that look the same to it
MIXED = f'{D}.model == "h100" && {D}.memoryGiB >= 80'


def _verdicts(engine: Engine) -> list[tuple[int, int, int, dict[int, str]]]:
    return sorted((v.evaluated, v.matched, v.failed, dict(v.errors)) for v in engine.verdicts._cache.values())


def _count_environments(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The names of the devices a CEL environment is built for, in order, from now on."""
    built: list[str] = []
    real_env = cel.device_env

    def counting_env(driver: str, device: Device) -> cel.DeviceEnv:
        built.append(device.name)
        return real_env(driver, device)

    monkeypatch.setattr(cel, "device_env", counting_env)
    return built


def test_shared_verdicts_equal_per_device_ones_and_errors_name_their_device(monkeypatch: pytest.MonkeyPatch) -> None:
    built = _count_environments(monkeypatch)
    shared = _engine(16)
    (outcome,) = shared.allocate([claim("c", MIXED)], node="node-a")
    # three shapes (a100 / h100 with memoryGiB / h100 without): one environment each, not sixteen
    assert len(built) == 3
    assert outcome.status == "error" and "no such key: memoryGiB" in outcome.message

    monkeypatch.setattr(projection, "fields_of", lambda expression: None)
    built.clear()
    alone = _engine(16)
    (outcome_alone,) = alone.allocate([claim("c", MIXED)], node="node-a")
    assert len(built) == 16
    assert outcome_alone.status == outcome.status
    assert _verdicts(shared) == _verdicts(alone)
    errors = next(v.errors for v in shared.verdicts._cache.values() if v.errors)
    assert len(errors) == 4
    for i, message in errors.items():
        name = shared.inventory.devices[i].name
        assert f"on device gpu.example.com/node-a/{name}:" in message and f"(device gpu.example.com/{name})" in message
        assert set(re.findall(r"gpu-[0-9]+", message)) == {name}  # that device and no other


def test_a_bound_domain_map_shares_verdicts_as_the_map_itself_does(monkeypatch: pytest.MonkeyPatch) -> None:
    """MIXED written with cel.bind: the same verdicts and errors as evaluating on every device,
    one environment per shape."""
    bound = f'cel.bind(a, {D}, a.model == "h100" && a.memoryGiB >= 80)'
    built = _count_environments(monkeypatch)
    shared = _engine(16)
    (outcome,) = shared.allocate([claim("c", bound)], node="node-a")
    assert len(built) == 3
    assert outcome.status == "error" and "no such key: memoryGiB" in outcome.message
    monkeypatch.setattr(projection, "fields_of", lambda expression: None)
    built.clear()
    alone = _engine(16)
    (outcome_alone,) = alone.allocate([claim("c", bound)], node="node-a")
    assert len(built) == 16
    assert (outcome_alone.status, outcome_alone.message) == (outcome.status, outcome.message)
    assert _verdicts(shared) == _verdicts(alone)


def test_a_reused_verdict_costs_no_budget() -> None:
    """Sixteen devices that look the same to a costly selector: one evaluation is paid for."""
    costly = "[" + ", ".join(str(i) for i in range(60)) + f"].all(x, x >= 0) && {D}.missing == 1"
    cost = compile_selector(costly).cost
    engine = _engine(16, budget=cost * 3)
    (outcome,) = engine.allocate([claim("costly", costly)])
    assert outcome.status == "error" and "evaluation budget" not in outcome.message
    assert "no such key: missing" in outcome.message


def test_projections_remembered_are_bounded(monkeypatch: pytest.MonkeyPatch) -> None:
    """A selector that reads a field unique to each device shares nothing: its memory stops at MAX_SHARED,
    and the devices past it are still evaluated (the verdict is the same)."""
    from dralloc.allocator.engine import verdicts

    monkeypatch.setattr(verdicts, "MAX_SHARED", 4)
    engine = _engine(16)
    (outcome,) = engine.allocate([claim("c", f"{D}.index >= 10")])
    assert outcome.status == "allocated"
    memos = [m for v in engine.verdicts._cache.values() for m in v.shared.values()]
    assert memos and max(len(m) for m in memos) == 4
    verdict = next(v for v in engine.verdicts._cache.values() if v.shared)
    assert verdict.matched.bit_count() == 6  # gpu-10 .. gpu-15
