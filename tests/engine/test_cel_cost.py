"""CEL cost (issue #11 item 6): the estimate follows cel-go's, the runtime limit Kubernetes applies to
each evaluation holds in both interpreters, and an allocation unit's evaluations have a budget."""

from __future__ import annotations

import msgspec
import pytest
from one_node import claim, engine_with
from test_cel import DEVICES, RUNTIME, _env

from dralloc.allocator.engine import Engine
from dralloc.allocator.engine.cel import MAX_COST, CelCompileError, CelRuntimeError, check_expression, compile_selector, device_env
from dralloc.allocator.engine.cel_eval import Interpreter
from dralloc.schemas.resource import Device


def _nested(n: int, tail: str = "") -> str:
    """Three nested comprehensions over an n-element list (issue #11's shape), and `tail`."""
    items = ", ".join(str(i) for i in range(n))
    return f"cel.bind(l, [{items}], l.all(a, l.all(b, l.all(c, true)))){tail}"


FAILING_LOOKUP = ' && device.attributes["gpu.example.com"].missing == 1'
"""A lookup that fails on every device: the fast path errs and the reference interpreter re-decides."""


@pytest.mark.parametrize(
    ("expression", "cel_go"),
    [
        # the wanted costs of cel-go's checker/cost_test.go (a literal list of 3 or 5)
        ("[1, 2, 3].all(x, true)", 20),
        ("[1,2,3,4,5].map(x, x).exists(x, x == 5) == true", 118),
        # the same cases, wrapped so that they are selectors: size() 1, > 1
        ("[1,2,3,4,5].filter(x, x % 2 == 0).size() > 0", 101 + 2),
        ("[1,2,3,4,5].map(x, x).size() > 0", 86 + 2),
        ("[1,2,3,4,5].map(x, x).filter(x, x % 2 == 0).size() > 0", 177 + 2),
        # device fields: driver names are at most 63 characters, so == traverses at most 14 (ceil(1.4))
        ('device.driver == "gpu.nvidia.com"', 4),
        # a literal list's items are as long as they are (cel-go's entry sizes): == traverses 1 character
        ('["a", "b"].exists(x, x == device.attributes["d"].s)', 31),
        # cel.bind: an empty list (10) and its value (a list: 10) once, then the body
        ("cel.bind(x, [1, 2], x.all(y, y > 0))", 32),
        # the issue's expression: 3 per iteration of `all` (loop condition 2, accumulator 1) makes it 2.2M
        (_nested(90, FAILING_LOOKUP), 2_227_977),
    ],
)
def test_the_estimate_is_cel_gos(expression: str, cel_go: int) -> None:
    assert check_expression(expression)[2].cost == cel_go


def test_the_issues_expression_is_refused_at_compile_time() -> None:
    """Three nested comprehensions over 90-element lists and a lookup that always fails: ~1 s per
    device in the reference interpreter. Kubernetes refuses it (2,227,977 > 1,000,000); so does dralloc."""
    with pytest.raises(CelCompileError, match="estimated cost 2,227,977 is over the limit of 1,000,000"):
        compile_selector(_nested(90, FAILING_LOOKUP))


def test_the_largest_such_expression_kubernetes_accepts_compiles() -> None:
    """64 elements: 807,259 (under the limit): it compiles, and evaluates within the runtime limit."""
    selector = compile_selector(_nested(64, FAILING_LOOKUP))
    assert selector.cost == 807_259
    env = _gpu_env()
    with pytest.raises(CelRuntimeError, match="no such key: missing"):
        selector.matches(env)
    interpreter = Interpreter(MAX_COST)
    with pytest.raises(Exception, match="no such key"):
        interpreter.run(selector.ast, env.value)
    assert 0 < interpreter.cost <= selector.cost


@pytest.mark.parametrize(
    ("expression", "cel_go"),
    [
        ("[1, 2, 3].all(x, true)", 20),
        ("[1,2,3,4,5].map(x, x).size() > 0", 88),
        ('device.driver == "gpu.example.com"', 4),
    ],
)
def test_the_runtime_cost_is_cel_gos(expression: str, cel_go: int) -> None:
    """Where nothing short-circuits, cel-go's actual cost equals its estimate."""
    interpreter = Interpreter()
    assert interpreter.run(compile_selector(expression).ast, _gpu_env().value) is True
    assert interpreter.cost == cel_go


def test_no_evaluation_costs_more_than_its_estimate() -> None:
    """Over the selector corpus and its devices: the fast core runs unguarded only because the
    estimate bounds what any evaluation costs."""
    checked = 0
    for case in RUNTIME:
        selector = compile_selector(case["expression"])
        for driver, device in DEVICES:
            env = _env(driver, device)
            if env.error is not None:
                continue
            interpreter = Interpreter()
            try:
                interpreter.run(selector.ast, env.value)
            except Exception:  # noqa: BLE001 - errors are verdicts too; the cost so far counts
                pass
            assert interpreter.cost <= selector.cost, case["expression"]
            checked += 1
    assert checked > 100


def test_the_runtime_limit_stops_both_interpreters() -> None:
    """Kubernetes evaluates with cel.CostLimit: past it, the device gets a CEL runtime error. A lower
    limit (Kubernetes' Options.CostLimit) shows it: the fast path, which counts nothing, defers to the
    counting interpreter; without the limit both answer true."""
    selector = compile_selector("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].all(y, x + y > 0))")
    env = _gpu_env()
    assert selector.matches(env) is True and selector.evaluate(env) is True
    assert selector.cost > 500
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        selector.matches(env, cost_limit=500)
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        selector.evaluate(env, cost_limit=500)


def test_the_cost_limit_is_not_absorbed_by_or() -> None:
    """cel-go cancels the evaluation: `|| true` does not turn the cancellation into true."""
    selector = compile_selector("[1, 2, 3, 4, 5, 6, 7, 8, 9, 10].exists(x, [1, 2, 3, 4, 5, 6, 7, 8, 9, 10].exists(y, x + y < 0)) || true")
    env = _gpu_env()
    assert selector.matches(env) is True
    with pytest.raises(CelRuntimeError, match="actual cost limit exceeded"):
        selector.matches(env, cost_limit=300)


# --- the budget of an allocation unit -----------------------------------------------------------


def _gpu_env():
    device = msgspec.convert({"name": "gpu-0", "attributes": {"index": {"int": 0}}}, Device)
    return device_env("gpu.example.com", device)


def _engine(budget: int | None, devices: int = 16) -> Engine:
    return engine_with((f"{{name: gpu-{i}, attributes: {{index: {{int: {i}}}}}}}" for i in range(devices)), cel_budget=budget)


# ~1,000 per device: 16 devices cost ~16,000 to evaluate, every one failing (a missing attribute);
# it reads `index`, different on every device, so no device shares another's verdict (verdicts.py)
COSTLY = "[" + ", ".join(str(i) for i in range(60)) + '].all(x, x >= 0) && device.attributes["gpu.example.com"].index >= 0' + FAILING_LOOKUP


def test_a_claim_that_spends_its_budget_ends_as_an_error() -> None:
    cost = compile_selector(COSTLY).cost
    engine = _engine(budget=cost * 3)
    (outcome,) = engine.allocate([claim("costly", COSTLY)])
    assert outcome.status == "error"
    assert "evaluation budget" in outcome.message and f"may cost up to {cost:,} per device" in outcome.message
    verdict = next(iter(engine.verdicts._cache.values()), None)
    assert verdict is not None
    # three evaluations were paid for: what they found is kept, the rest was never evaluated
    assert max(v.evaluated.bit_count() for v in engine.verdicts._cache.values() if v.errors) == 3
    # the next claim has a budget of its own and a cheap selector: it is allocated
    (cheap,) = engine.allocate([claim("cheap", 'device.attributes["gpu.example.com"].index >= 0')])
    assert cheap.status == "allocated"


def test_without_a_budget_the_same_claim_evaluates_every_device() -> None:
    """The budget is what ends it: unlimited, every device is evaluated, and the error is the CEL one."""
    engine = _engine(budget=None)
    (outcome,) = engine.allocate([claim("costly", COSTLY)])
    assert outcome.status == "error" and "evaluation budget" not in outcome.message
    assert "no such key: missing" in outcome.message


def test_the_default_budget_is_far_above_what_the_example_claims_spend() -> None:
    """A claim with an everyday selector over many devices is not near the default budget."""
    engine = Engine()
    assert engine.cel_budget == 5_000_000
    engine = _engine(budget=Engine().cel_budget, devices=128)
    (outcome,) = engine.allocate([claim("everyday", 'device.attributes["gpu.example.com"].index >= 100')])
    assert outcome.status == "allocated"


def test_a_claim_out_of_evaluation_time_ends_as_an_error() -> None:
    """The allocator's time budget (a clock and seconds): each device looked at takes one tick of this
    clock, so five seconds end the claim after a few devices, whatever the cost units left."""
    ticks = iter(range(10**6))
    engine = _engine(budget=None)
    engine.cel_seconds = (lambda: float(next(ticks)), 5.0)
    (outcome,) = engine.allocate([claim("costly", COSTLY)])
    assert outcome.status == "error" and "ran out of its time budget" in outcome.message
    engine.cel_seconds = None
    (outcome,) = engine.allocate([claim("costly-again", COSTLY + " || false")])
    assert outcome.status == "error" and "no such key: missing" in outcome.message


def test_the_interpreter_stops_part_way_at_its_deadline() -> None:
    """One evaluation of the reference interpreter can take seconds: the deadline stops it inside."""
    from dralloc.allocator.engine.cel_eval import OutOfTime

    selector = compile_selector(_nested(64, FAILING_LOOKUP))
    calls = []

    def clock() -> float:
        calls.append(1)
        return float(len(calls))

    interpreter = Interpreter(MAX_COST, (clock, 3.0))
    with pytest.raises(OutOfTime):
        interpreter.run(selector.ast, _gpu_env().value)
    assert interpreter.cost < 10_000  # a few looks at the clock, ~1,000 cost units apart
