"""dralloc's own conformance table: cases/*.yaml, manifests in, verdicts and devices out.

Each case lists the fixture sets it uses (cases/_fixtures.yaml), its own
manifests, the allocate arguments (node, together) and, per pending claim, the
expected status and, for first-fit order (Kubernetes' order: driver, pool,
slice, device name), the exact devices. Optional: a message substring, a
subset the allocation must contain, problems reported while loading.
The same case then runs with placement scoring on: same verdicts, and every
allocation must pass the independent validity check.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml
from allocation_validity import check

from dralloc.allocator.offline import allocate_objects
from dralloc.manifests import Loaded, Source, decode_object

CASES_DIR = Path(__file__).parent / "cases"
FIXTURES = yaml.safe_load((CASES_DIR / "_fixtures.yaml").read_text())


def _cases() -> list[tuple[str, dict]]:
    out = []
    for path in sorted(CASES_DIR.glob("[!_]*.yaml")):
        for case in yaml.safe_load(path.read_text()):
            out.append((f"{path.stem}/{case['name']}", case))
    return out


CASES = _cases()


def _objects(case: dict) -> list[tuple[Source, Any]]:
    docs = [doc for name in case.get("use", ["base"]) for doc in FIXTURES[name]] + case.get("objects", [])
    objects = []
    for i, doc in enumerate(docs):
        source = Source(case["name"], i + 1)
        decoded = decode_object(doc, source)
        assert isinstance(decoded, Loaded), str(decoded)
        objects.append((source, decoded.obj))
    return objects


def run_case(case: dict, *, scoring: bool) -> tuple[list, list[str], list[Any]]:
    """The case as `dralloc allocate` runs it once its files are read (offline.allocate_objects)."""
    objects = _objects(case)
    run = allocate_objects(objects, node=case.get("node", "node-1"), together=case.get("together", False), scoring=scoring)
    return run.outcomes, run.warnings, [obj for _, obj in objects]


def _subset(expected: Any, actual: Any, where: str = "allocation") -> None:
    if isinstance(expected, dict):
        assert isinstance(actual, dict), f"{where}: expected a mapping, got {actual!r}"
        for key, value in expected.items():
            if value is None:
                assert key not in actual, f"{where}.{key} should be absent, is {actual.get(key)!r}"
            else:
                assert key in actual, f"{where}.{key} missing in {actual!r}"
                _subset(value, actual[key], f"{where}.{key}")
    elif isinstance(expected, list):
        assert isinstance(actual, list) and len(actual) == len(expected), f"{where}: expected {len(expected)} items, got {actual!r}"
        for i, (e, a) in enumerate(zip(expected, actual)):
            _subset(e, a, f"{where}[{i}]")
    else:
        assert expected == actual, f"{where}: expected {expected!r}, got {actual!r}"


def test_enough_cases():
    assert len(CASES) >= 80


@pytest.mark.parametrize("name,case", CASES, ids=[n for n, _ in CASES])
def test_case(name: str, case: dict):
    outcomes, problems, objects = run_case(case, scoring=False)
    for wanted in case.get("problems", []):
        assert any(wanted in p for p in problems), f"no problem mentions {wanted!r}: {problems}"
    if "problems" not in case:
        assert problems == []
    expected = case["expect"]
    assert [o.claim for o in outcomes] == [e["claim"] for e in expected]
    for outcome, want in zip(outcomes, expected):
        assert outcome.status == want["status"], f"{outcome.claim}: {outcome.status}: {outcome.message}"
        if "message" in want:
            assert want["message"] in outcome.message, outcome.message
        if "node" in want:
            assert outcome.node == want["node"]
        if outcome.allocation is not None:
            got = [f"{r.request}: {r.driver}/{r.pool}/{r.device}" for r in outcome.allocation.devices.results]
            if "devices" in want:
                assert got == want["devices"], f"{outcome.claim}: {got}"
            if "allocation" in want:
                _subset(want["allocation"], msgspec.to_builtins(outcome.allocation))
    allocated = {o.claim: o.allocation for o in outcomes if o.allocation is not None}
    for node in {o.node for o in outcomes if o.allocation is not None}:
        mine = {o.claim: o.allocation for o in outcomes if o.allocation is not None and o.node == node}
        assert check(objects, mine, node or "node-1") == []
    # placement scoring may pick other devices, never another verdict, never an invalid answer
    scored, _, _ = run_case(case, scoring=True)
    assert [o.status for o in scored] == [o.status for o in outcomes]
    for node in {o.node for o in scored if o.allocation is not None}:
        mine = {o.claim: o.allocation for o in scored if o.allocation is not None and o.node == node}
        assert check(objects, mine, node or "node-1") == [], f"scored: {mine}"
    assert allocated.keys() == {o.claim for o in scored if o.allocation is not None}
