"""List-type attributes (KEP-5491, resource.k8s.io/v1 `ints`/`bools`/`strings`/`versions`).

- CEL: the attribute is a list; `includes(v)` works on a list or a scalar (another
  type is false, not an error); `in`, `exists`, `size()`, indexing and version
  methods work on list elements. dralloc's fast path and reference interpreter
  are checked against the independent celpy oracle (tests/engine/cel_oracle.py).
- matchAttribute: the covered devices need one value every device's set contains
  (a scalar is a one-element set; an int list never matches a string list).
- distinctAttribute: the covered devices' sets are pairwise disjoint.
  Both are checked by hypothesis against a brute-force search over every choice.
- Validation: lists are non-empty, entries at most 64 bytes, at most 48 values per device.
"""

from __future__ import annotations

import itertools
from typing import Any

import msgspec
import pytest
from cel_oracle import verdict as oracle_verdict
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dralloc.allocator.engine import Engine, cel
from dralloc.schemas.resource import Device, DeviceClass, ResourceClaim, ResourceSlice
from dralloc.schemas.validation import validate

DRIVER = "gpu.example.com"
D = f'device.attributes["{DRIVER}"]'

DEVICES: list[dict] = [
    {
        "name": "lists",
        "attributes": {
            "models": {"strings": ["a100", "h100"]},
            "ids": {"ints": [1, 2, 3]},
            "flags": {"bools": [True]},
            "drivers": {"versions": ["1.2.3", "2.0.0-rc.1"]},
            "model": {"string": "h100"},
            "numa": {"int": 1},
        },
    },
    {
        "name": "scalars",
        "attributes": {
            "models": {"string": "a100"},
            "ids": {"int": 2},
            "flags": {"bool": False},
            "drivers": {"version": "1.2.3"},
        },
    },
    {"name": "bare", "attributes": {}},
]

EXPRESSIONS = [
    f'{D}.models.includes("h100")',
    f'{D}.models.includes("a100")',
    f'{D}.models.includes("v100")',
    f"{D}.models.includes(1)",  # type mismatch: false, not an error
    f"{D}.ids.includes(2)",
    f'{D}.ids.includes("2")',
    f"{D}.flags.includes(true)",
    f"{D}.flags.includes(1)",
    f'{D}.drivers.includes(semver("1.2.3"))',
    f'{D}.drivers.includes("1.2.3")',  # a string is not a version
    f'has({D}.models) && {D}.models.includes("a100")',
    f"{D}.ids.exists(i, i > 2)",
    f"{D}.ids.all(i, i > 0)",
    f"size({D}.ids) == 3",
    f"{D}.models.size() == 2",
    f"{D}.ids[2] == 3",
    f"{D}.ids[5] == 3",  # out of range: an error
    f"{D}.drivers[0].major() == 1",
    f'{D}.drivers.exists(v, v.isGreaterThan(semver("1.5.0")))',
    f'{D}.drivers[1].isLessThan(semver("2.0.0"))',
    f'{D}.model.includes("h100")',
    f"{D}.numa.includes(1)",
    f"{D}.missing.includes(1)",  # no such attribute: an error (use has())
]


def _device(raw: dict) -> Device:
    return msgspec.convert(raw, Device)


# `in`, comprehensions and indexing on a scalar string are cel-go errors, but celpy treats a
# string as a sequence: these are compared on the list device only
ON_LISTS = [f'"h100" in {D}.models', f"3 in {D}.ids", f'!("v100" in {D}.models)', f'{D}.models.exists(m, m.startsWith("h"))', f'{D}.models[0] == "a100"']


@pytest.mark.parametrize("expression", EXPRESSIONS + ON_LISTS)
def test_list_selectors_agree_with_the_oracle(expression: str) -> None:
    selector = cel.compile_selector(expression)
    for raw in DEVICES[:1] if expression in ON_LISTS else DEVICES:
        env = cel.device_env(DRIVER, _device(raw))
        got: dict[str, Any] = {}
        for how, run in (("fast", selector.matches), ("interpreter", selector.evaluate)):
            try:
                got[how] = run(env)
            except cel.CelRuntimeError:
                got[how] = "error"
        expected = oracle_verdict(expression, DRIVER, raw)
        assert got["fast"] == got["interpreter"] == expected, f"{raw['name']}: {got} oracle {expected!r}"


def _verdict(expression: str, raw: dict) -> bool | str:
    try:
        return cel.compile_selector(expression).matches(cel.device_env(DRIVER, _device(raw)))
    except cel.CelRuntimeError:
        return "error"


def test_includes_semantics_that_could_break() -> None:
    lists, scalars = DEVICES[0], DEVICES[1]
    assert _verdict(f'{D}.models.includes("h100")', lists) is True
    assert _verdict(f'{D}.models.includes("h100")', scalars) is False
    assert _verdict(f'{D}.models.includes("a100")', scalars) is True  # a scalar: equality
    assert _verdict(f'{D}.ids.includes("2")', lists) is False  # type mismatch: false, not an error
    assert _verdict(f"{D}.ids.includes(2.0)", lists) is True  # cel-go compares numbers across types
    assert _verdict(f'{D}.drivers.includes(semver("2.0.0-rc.1"))', lists) is True
    assert _verdict(f"{D}.ids[7] == 1", lists) == "error"
    assert _verdict(f'{D}.models[0] == "a100"', scalars) == "error"  # a string is not a list
    assert _verdict(f"{D}.?models.orValue([]).size() == 2", lists) is True
    assert _verdict(f'"h100" in {D}.models', lists) is True


def test_includes_refuses_lists_over_48_values_only_when_it_must_look_further() -> None:
    # the API server refuses such a device (48 values per device); built directly, the
    # function still bounds its cost as Kubernetes' does
    raw = {"name": "long", "attributes": {"ids": {"ints": list(range(60))}}}
    assert _verdict(f"{D}.ids.includes(5)", raw) is True
    assert _verdict(f"{D}.ids.includes(59)", raw) == "error"


def test_includes_compiles_on_any_value_and_is_costed() -> None:
    assert cel.compile_selector(f'{D}.models.includes("x")').cost > cel.compile_selector(f'{D}.models == "x"').cost
    with pytest.raises(cel.CelCompileError):
        cel.compile_selector(f"{D}.models.includes()")


def test_a_device_with_list_attributes_does_not_fail_other_selectors() -> None:
    # before list attributes were modelled, such a device failed every selector at run time
    assert _verdict(f'device.driver == "{DRIVER}"', DEVICES[0]) is True
    assert _verdict(f'{D}.model == "h100"', DEVICES[0]) is True


def test_runtime_error_on_a_list_names_the_device() -> None:
    with pytest.raises(cel.CelRuntimeError, match=r"device gpu\.example\.com/lists"):
        cel.compile_selector(f"{D}.ids[9] == 1").matches(cel.device_env(DRIVER, _device(DEVICES[0])))


# --- validation -------------------------------------------------------------------------


def _slice(attributes: dict) -> ResourceSlice:
    return msgspec.convert(
        {
            "metadata": {"name": "s"},
            "spec": {
                "driver": DRIVER,
                "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1},
                "nodeName": "node-1",
                "devices": [{"name": "d", "attributes": attributes}],
            },
        },
        ResourceSlice,
    )


@pytest.mark.parametrize(
    ("attributes", "problem"),
    [
        ({"a": {"strings": []}}, "must not be empty"),
        ({"a": {"strings": ["x" * 65]}}, "at most 64 bytes"),
        ({"a": {"strings": ["é" * 33]}}, "at most 64 bytes"),  # bytes, not characters
        ({"a": {"string": "x" * 65}}, "at most 64 bytes"),
        ({"a": {"ints": [1], "int": 1}}, "exactly one of"),
        ({f"a{i}": {"ints": list(range(7))} for i in range(7)}, "at most 48 attribute values"),
    ],
)
def test_validation_of_list_attributes(attributes: dict, problem: str) -> None:
    errors = [str(e) for e in validate(_slice(attributes))]
    assert any(problem in e for e in errors), errors


def test_valid_list_attributes_pass_validation() -> None:
    ok = {"a": {"strings": ["x" * 64, "y"]}, "b": {"ints": list(range(40))}, "c": {"versions": ["1.0.0"]}, "d": {"bools": [True, False]}}
    assert validate(_slice(ok)) == []


# --- matchAttribute / distinctAttribute against brute force ------------------------------

KINDS = ["int", "string", "ints", "strings"]


@st.composite
def attribute_values(draw: Any) -> dict | None:
    kind = draw(st.sampled_from([*KINDS, None]))
    if kind is None:
        return None  # the device lacks the attribute
    element = st.integers(0, 3) if kind.startswith("int") else st.sampled_from(["0", "1", "x", "y"])
    if kind.endswith("s"):
        return {kind: draw(st.lists(element, min_size=1, max_size=3))}
    return {kind: draw(element)}


def _set(value: dict | None) -> frozenset | None:
    if value is None:
        return None
    ((kind, v),) = value.items()
    kind = kind.rstrip("s")
    return frozenset((kind, x) for x in (v if isinstance(v, list) else [v]))


def _engine(values: list[dict | None]) -> Engine:
    engine = Engine(scoring=False)
    engine.apply(msgspec.convert({"metadata": {"name": "gpu"}, "spec": {"selectors": [{"cel": {"expression": f'device.driver == "{DRIVER}"'}}]}}, DeviceClass))
    devices = [{"name": f"d{i}", "attributes": {"topo": v} if v is not None else {}} for i, v in enumerate(values)]
    engine.apply(
        msgspec.convert(
            {
                "metadata": {"name": "s"},
                "spec": {"driver": DRIVER, "pool": {"name": "p", "generation": 1, "resourceSliceCount": 1}, "nodeName": "node-1", "devices": devices},
            },
            ResourceSlice,
        )
    )
    return engine


def _claim(counts: list[int], constraint: str) -> ResourceClaim:
    return msgspec.convert(
        {
            "metadata": {"name": "c", "namespace": "default"},
            "spec": {
                "devices": {
                    "requests": [{"name": f"r{i}", "exactly": {"deviceClassName": "gpu", "count": n}} for i, n in enumerate(counts)],
                    "constraints": [{constraint: f"{DRIVER}/topo"}],
                }
            },
        },
        ResourceClaim,
    )


def _holds(sets: list[frozenset | None], match: bool) -> bool:
    if any(s is None for s in sets):
        return False
    if match:
        return bool(frozenset.intersection(*sets))
    return all(not (a & b) for a, b in itertools.combinations(sets, 2))


def _brute_force(sets: list[frozenset | None], need: int, match: bool) -> bool:
    return any(_holds([sets[i] for i in pick], match) for pick in itertools.combinations(range(len(sets)), need))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(attribute_values(), min_size=1, max_size=7), counts=st.lists(st.integers(1, 2), min_size=1, max_size=2), match=st.booleans())
def test_constraints_over_list_values_agree_with_brute_force(values: list[dict | None], counts: list[int], match: bool) -> None:
    engine = _engine(values)
    [outcome] = engine.allocate([_claim(counts, "matchAttribute" if match else "distinctAttribute")], node="node-1")
    sets = [_set(v) for v in values]
    possible = _brute_force(sets, sum(counts), match)
    assert outcome.status == ("allocated" if possible else "unsatisfiable"), (outcome.status, outcome.message, sets, counts)
    if outcome.status == "allocated":
        chosen = [sets[int(r.device[1:])] for r in outcome.allocation.devices.results]
        assert len(chosen) == sum(counts)
        assert len({r.device for r in outcome.allocation.devices.results}) == len(chosen)
        assert _holds(chosen, match), chosen


def test_int_list_never_matches_string_list() -> None:
    engine = _engine([{"ints": [1, 2]}, {"strings": ["1", "2"]}])
    [outcome] = engine.allocate([_claim([2], "matchAttribute")], node="node-1")
    assert outcome.status == "unsatisfiable"
    engine = _engine([{"ints": [1, 2]}, {"strings": ["1", "2"]}])
    [outcome] = engine.allocate([_claim([2], "distinctAttribute")], node="node-1")
    assert outcome.status == "allocated"  # different types share no value


def test_match_backtracks_over_common_values() -> None:
    # d0 and d1 share "x" and "y", but only "y" is on d2 too: the first common value of the
    # first device ("x") must be abandoned for "y"
    engine = _engine([{"strings": ["x", "y"]}, {"strings": ["x", "y"]}, {"strings": ["y", "z"]}])
    [outcome] = engine.allocate([_claim([3], "matchAttribute")], node="node-1")
    assert outcome.status == "allocated"


def test_distinct_backtracks_over_overlapping_sets() -> None:
    # first-fit d0 ({a,b}) leaves nothing disjoint for two more; {a},{b},{c} is the answer
    engine = _engine([{"strings": ["a", "b"]}, {"string": "a"}, {"string": "b"}, {"strings": ["c"]}])
    [outcome] = engine.allocate([_claim([3], "distinctAttribute")], node="node-1")
    assert outcome.status == "allocated"
    assert sorted(r.device for r in outcome.allocation.devices.results) == ["d1", "d2", "d3"]
