"""Reference interpreter: evaluates a checked AST with cel-go's runtime semantics.

The fast evaluator stops at the first error it meets; cel-go does not: ``&&``
and ``||`` absorb an error when the other side decides the result, and so do
``all``/``exists`` across iterations (``[a, b].exists(x, ...)`` is true if any
element is true, even if another one errs). dralloc runs this interpreter
whenever the fast path reports an error, so the verdict is always cel-go's,
while the common (error-free) case stays fast. It is also the evaluator for
the few expressions the fast path cannot express.

Errors are ``EvalError`` exceptions; ``_absorb`` turns them into values where
cel-go treats errors as values.

Cost: like cel-go's ``CostTracker`` (interpreter/runtimecost.go), the
interpreter counts what it does in cel-go's units (1 per variable, selection,
index and O(1) call; 10 per list and 30 per map built; 0.1 per character a
string operation traverses; the loop condition and accumulator steps of the
macros per iteration) and, past ``limit``, stops with ``CostLimitExceeded``,
which no ``&&``/``||``/``exists`` absorbs: Kubernetes runs every selector with
``CELSelectorExpressionMaxCost`` as that limit.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from typing import Any

from . import cel_runtime as rt
from .cel_check import INIT_COST, RESULT_COST, STEP_COST, TYPE_NAMES, binary_cost, call_cost
from .cel_runtime import LibraryError, UInt, cel_equal, is_quantity_value, is_semver_value, type_name
from .cel_syntax import Binary, Bind, Call, Comp, Cond, Has, Ident, Index, ListLit, Lit, MapLit, Node, Select, Unary

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
UINT_MAX = 2**64 - 1


class EvalError(Exception):
    """A CEL runtime error (a value in cel-go; an exception here)."""


class OutOfTime(Exception):
    """The evaluation ran past the caller's deadline (its claim's time budget): abandoned part way."""


class CostLimitExceeded(Exception):
    """The evaluation's actual cost passed its limit: cel-go cancels the whole evaluation
    (``operation cancelled: actual cost limit exceeded``), nothing absorbs it."""


def actual_size(x: Any) -> int:
    """cel-go's actualSize: characters of a string, bytes, list or map entries; 1 otherwise."""
    if isinstance(x, (str, bytes, list)) or (isinstance(x, dict) and not is_quantity_value(x) and not is_semver_value(x)):
        return len(x)
    if isinstance(x, Optional) and x.present:
        return actual_size(x.value)
    return 1


class DefaultMap(dict[str, Any]):
    """device.attributes / device.capacity: an unknown domain reads as an empty map."""

    __slots__ = ()

    def __missing__(self, key: Any) -> dict[str, Any]:
        return {}


class Optional:
    """cel-go's optional value: optional.of(x) or optional.none()."""

    __slots__ = ("present", "value")

    def __init__(self, present: bool, value: Any = None):
        self.present = present
        self.value = value

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Optional) and self.present == other.present and (not self.present or cel_equal(self.value, other.value))

    __hash__ = None  # type: ignore[assignment]  # unhashable, as its __eq__ requires; typeshed declares object.__hash__ a method


NONE = Optional(False)


def _zero(x: Any) -> bool:
    """optional.ofNonZeroValue: the zero value of x's type."""
    if x is None:
        return True
    if isinstance(x, bool):
        return not x
    if isinstance(x, (int, float)):
        return x == 0
    if isinstance(x, (str, bytes, list, dict)):
        return len(x) == 0
    return False


def _optional_call(name: str, args: list[Any]) -> Any:
    if name == "optional.of" and len(args) == 1:
        return Optional(True, args[0])
    if name == "optional.ofNonZeroValue" and len(args) == 1:
        return NONE if _zero(args[0]) else Optional(True, args[0])
    if name == "optional.none" and not args:
        return NONE
    opt = args[0] if args else None
    if not isinstance(opt, Optional):
        raise _no_overload(name, *args)
    if name == "hasValue" and len(args) == 1:
        return opt.present
    if name == "value" and len(args) == 1:
        if not opt.present:
            raise EvalError("optional.none() dereference")
        return opt.value
    if name == "orValue" and len(args) == 2:
        return opt.value if opt.present else args[1]
    if name == "or" and len(args) == 2 and isinstance(args[1], Optional):
        return opt if opt.present else args[1]
    raise _no_overload(name, *args)


_OPTIONAL_FUNCTIONS = {"optional.of", "optional.ofNonZeroValue", "optional.none", "hasValue", "value", "orValue", "or"}


class CelType(str):
    """A CEL type value, as returned by type(x)."""

    __slots__ = ()


def _no_overload(op: str, *args: Any) -> EvalError:
    return EvalError(f"no such overload: {op} applied to ({', '.join(type_name(a) for a in args)})")


def _is_int(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _check_int(v: int, uint: bool) -> int:
    if uint:
        if not 0 <= v <= UINT_MAX:
            raise EvalError("unsigned integer overflow")
        return UInt(v)
    if not INT_MIN <= v <= INT_MAX:
        raise EvalError("integer overflow")
    return v


def _numeric_kind(x: Any) -> str | None:
    kind = type_name(x)
    return kind if kind in ("int", "uint", "double") else None


def equal(a: Any, b: Any) -> bool:
    """cel-go ``==``: null equals only null; a Quantity or Semver on the left rejects
    other types (their Equal has no such overload), anything else compares unequal."""
    if a is None or b is None:
        return a is None and b is None
    if (is_quantity_value(a) and not is_quantity_value(b)) or (is_semver_value(a) and not is_semver_value(b)):
        raise _no_overload("_==_", a, b)
    return cel_equal(a, b)


def _compare(op: str, a: Any, b: Any) -> bool:
    ka, kb = _numeric_kind(a), _numeric_kind(b)
    ok = (ka and kb) or (type(a) is type(b) and isinstance(a, (str, bytes, bool)))
    if not ok:
        raise _no_overload(f"_{op}_", a, b)
    if isinstance(a, float) and math.isnan(a) or isinstance(b, float) and math.isnan(b):
        return False
    result: bool = {"<": a < b, "<=": a <= b, ">": a > b, ">=": a >= b}[op]
    return result


def _arith(op: str, a: Any, b: Any) -> Any:
    ka, kb = _numeric_kind(a), _numeric_kind(b)
    if op == "+" and not ka:
        if type(a) is type(b) and isinstance(a, (str, bytes, list)):
            return a + b
        raise _no_overload("_+_", a, b)
    if not ka or ka != kb:
        raise _no_overload(f"_{op}_", a, b)
    if ka == "double":
        if op == "%":
            raise _no_overload("_%_", a, b)
        if op == "/":
            if b == 0:
                return math.copysign(math.inf, a) * math.copysign(1, b) if a != 0 and not math.isnan(a) else math.nan
            return a / b
        return {"+": a + b, "-": a - b, "*": a * b}[op]
    if op in ("/", "%"):
        if b == 0:
            raise EvalError("division by zero" if op == "/" else "modulus by zero")
        q = abs(a) // abs(b) * (1 if (a >= 0) == (b >= 0) else -1)  # Go truncates toward zero
        v = q if op == "/" else a - b * q
    else:
        v = {"+": a + b, "-": a - b, "*": a * b}[op]
    return _check_int(v, ka == "uint")


def _convert(name: str, x: Any) -> Any:
    try:
        if name == "int":
            if isinstance(x, str):
                return _check_int(int(x, 10), False)
            if isinstance(x, float):
                if math.isnan(x) or math.isinf(x) or not INT_MIN <= x < 2.0**63:
                    raise EvalError("integer overflow")
                return int(x)
            if _is_int(x):
                return _check_int(int(x), False)
        elif name == "uint":
            if isinstance(x, str):
                return _check_int(int(x, 10), True)
            if isinstance(x, float):
                if math.isnan(x) or not 0 <= x < 2.0**64:
                    raise EvalError("unsigned integer overflow")
                return UInt(int(x))
            if _is_int(x):
                return _check_int(int(x), True)
        elif name == "double":
            if isinstance(x, str):
                return float(x)
            if _is_int(x) or isinstance(x, float):
                return float(x)
        elif name == "string":
            if isinstance(x, bool):
                return "true" if x else "false"
            if isinstance(x, (str, int)):
                return str(int(x)) if _is_int(x) else x
            if isinstance(x, float):
                return repr(x)
            if isinstance(x, bytes):
                return x.decode("utf-8")
        elif name == "bytes":
            if isinstance(x, str):
                return x.encode("utf-8")
            if isinstance(x, bytes):
                return x
        elif name == "bool":
            if isinstance(x, bool):
                return x
            if isinstance(x, str):
                table = {
                    "1": True,
                    "t": True,
                    "T": True,
                    "TRUE": True,
                    "true": True,
                    "True": True,
                    "0": False,
                    "f": False,
                    "F": False,
                    "FALSE": False,
                    "false": False,
                    "False": False,
                }
                if x in table:
                    return table[x]
                raise EvalError(f"type conversion error from 'string' to 'bool': {x!r}")
    except (ValueError, UnicodeDecodeError) as e:
        raise EvalError(f"type conversion error to {name}: {e}") from None
    raise _no_overload(name, x)


def _size(x: Any) -> int:
    if isinstance(x, (str, bytes, list)) or (isinstance(x, dict) and not is_quantity_value(x) and not is_semver_value(x)):
        return len(x)
    raise _no_overload("size", x)


def _string_pred(name: str, s: Any, arg: Any) -> bool:
    if not isinstance(s, str) or not isinstance(arg, str):
        raise _no_overload(name, s, arg)
    return {"contains": arg in s, "startsWith": s.startswith(arg), "endsWith": s.endswith(arg)}[name]


def _type_of(x: Any) -> CelType:
    return CelType(type_name(x))


def _call(name: str, args: list[Any]) -> Any:
    if name in _OPTIONAL_FUNCTIONS:
        return _optional_call(name, args)
    if name in ("contains", "startsWith", "endsWith") and len(args) == 2:
        return _string_pred(name, *args)
    if name == "size" and len(args) == 1:
        return _size(args[0])
    if name in ("int", "uint", "double", "string", "bytes", "bool") and len(args) == 1:
        return _convert(name, args[0])
    if name == "dyn" and len(args) == 1:
        return args[0]
    if name == "type" and len(args) == 1:
        return _type_of(args[0])
    fn: Callable[..., Any] | None
    if name == "matches" and len(args) == 2:
        fn = rt.matches
    else:
        fn = rt.FUNCTIONS.get(name)
    if fn is None:
        raise EvalError(f"no such function: {name}")
    try:
        return fn(*args)
    except LibraryError as e:
        raise EvalError(str(e)) from None
    except TypeError:
        raise _no_overload(name, *args) from None


def _traverses(op: str, lv: Any, rv: Any) -> bool:
    """Does the operator walk its operands: `in` a list, + of strings or bytes (see `binary_cost`)."""
    if op == "in":
        return isinstance(rv, list)
    return op == "+" and isinstance(lv, (str, bytes))


def _truth(v: Any) -> bool | EvalError:
    return v if isinstance(v, (bool, EvalError)) else _no_overload("logical operator", v)


class Interpreter:
    """Evaluates one AST against a device value (a dict built by the environment), counting its
    cost (``cost``) in cel-go's units; past ``limit`` (None: no limit) raises ``CostLimitExceeded``.
    ``deadline``: (clock, time) the evaluation must end by, looked at every ~1,000 cost units,
    else ``OutOfTime`` (this interpreter is ~20x slower than the fast core: a claim's time budget
    must be able to stop it part way)."""

    def __init__(self, limit: int | None = None, deadline: tuple[Callable[[], float], float] | None = None) -> None:
        self.cost = 0
        self.limit = limit
        self.deadline = deadline
        self._next_look = 1024

    def run(self, node: Node, device: dict[str, Any]) -> Any:
        result = self.ev(node, {"device": device})
        self._check()
        return result

    def _charge(self, cost: int) -> None:
        """Cost that grows with the data (loops, string traversals): checked at once; the
        constant cost of each node is checked at the next loop step and at the end."""
        self.cost += cost
        self._check()

    def _check(self) -> None:
        if self.limit is not None and self.cost > self.limit:
            raise CostLimitExceeded(f"operation cancelled: actual cost limit exceeded ({self.cost:,} > {self.limit:,})")
        if self.deadline is not None and self.cost >= self._next_look:
            self._next_look = self.cost + 1024
            clock, end = self.deadline
            if clock() > end:
                raise OutOfTime("evaluation ran out of time")

    def _absorb(self, node: Node, scope: dict[str, Any]) -> Any:
        try:
            return self.ev(node, scope)
        except EvalError as e:
            return e

    def ev(self, node: Node, scope: dict[str, Any]) -> Any:
        match node:
            case Lit(value, kind):
                return UInt(value) if kind == "uint" else value
            case Ident(name):
                self.cost += 1
                if name in scope:
                    return scope[name]
                if name in TYPE_NAMES:
                    return CelType(name)
                raise EvalError(f"undeclared reference to '{name}'")
            case Select(operand, field, optional):
                m = self.ev(operand, scope)
                self.cost += 1
                if isinstance(m, Optional):  # selecting on an optional stays optional
                    return self._optional_field(m.value, field) if m.present else NONE
                return self._optional_field(m, field) if optional else self._field(m, field)
            case Has(operand, field):
                m = self.ev(operand, scope)
                self.cost += 1
                if isinstance(m, Optional):
                    raise EvalError("has() cannot test an optional value")
                if isinstance(m, DefaultMap):
                    return True  # Kubernetes' map with a default finds every key
                if isinstance(m, dict):
                    return field in m
                raise EvalError(f"invalid type for field selection: {type_name(m)}")
            case Index(operand, index, optional):
                m, k = self.ev(operand, scope), self.ev(index, scope)
                self.cost += 1
                if isinstance(m, Optional):
                    return self._optional_index(m.value, k) if m.present else NONE
                return self._optional_index(m, k) if optional else self._index(m, k)
            case Call(name, args, target):
                if isinstance(target, Ident) and target.name in ("sets", "optional") and target.name not in scope:
                    name = f"{target.name}.{name}"
                    values = [self.ev(a, scope) for a in args]
                else:
                    values = ([self.ev(target, scope)] if target is not None else []) + [self.ev(a, scope) for a in args]
                self._charge(call_cost(name, [actual_size(v) for v in values], bool(values) and isinstance(values[0], list)))
                return _call(name, values)
            case Unary(op, operand):
                v = self.ev(operand, scope)
                self.cost += 1
                if op == "!":
                    if isinstance(v, bool):
                        return not v
                    raise _no_overload("!_", v)
                numeric = _numeric_kind(v)
                if numeric == "int":
                    return _check_int(-v, False)
                if numeric == "double":
                    return -v
                raise _no_overload("-_", v)
            case Binary("&&" | "||" as op, left, right):
                decisive = op == "||"  # the value that decides: true for ||, false for &&
                lv = _truth(self._absorb(left, scope))
                if lv is decisive:
                    return decisive
                rv = _truth(self._absorb(right, scope))
                if rv is decisive:
                    return decisive
                for v in (lv, rv):
                    if isinstance(v, EvalError):
                        raise v
                return not decisive
            case Binary(op, left, right):
                lv, rv = self.ev(left, scope), self.ev(right, scope)
                self._charge(binary_cost(op, actual_size(lv), actual_size(rv), _traverses(op, lv, rv)))
                if op == "==":
                    return equal(lv, rv)
                if op == "!=":
                    return not equal(lv, rv)
                if op in ("<", "<=", ">", ">="):
                    return _compare(op, lv, rv)
                if op == "in":
                    if isinstance(rv, list):
                        return any(cel_equal(lv, x) for x in rv)
                    if isinstance(rv, dict):
                        return lv in rv if isinstance(lv, str) else any(cel_equal(lv, k) for k in rv)
                    raise _no_overload("@in", lv, rv)
                return _arith(op, lv, rv)
            case Cond(c, t, o):
                cv = self.ev(c, scope)
                if not isinstance(cv, bool):
                    raise _no_overload("_?_:_", cv)
                return self.ev(t if cv else o, scope)
            case ListLit(items):
                self.cost += 10
                return [self.ev(i, scope) for i in items]
            case MapLit(entries):
                self.cost += 30
                out: dict[Any, Any] = {}
                for k, v in entries:
                    key = self.ev(k, scope)
                    if not isinstance(key, (str, int)):
                        raise EvalError(f"unsupported key type: {type_name(key)}")
                    if key in out:
                        raise EvalError(f"Failed with repeated key: {key!r}")
                    out[key] = self.ev(v, scope)
                return out
            case Comp():
                return self._comprehension(node, scope)
            case Bind(var, init, body):
                self.cost += 10  # cel.bind is a comprehension over an empty list
                return self.ev(body, {**scope, var: self.ev(init, scope)})
        raise EvalError(f"unsupported expression {node!r}")

    @staticmethod
    def _field(m: Any, field: str) -> Any:
        if isinstance(m, dict) and not is_quantity_value(m) and not is_semver_value(m):
            try:
                return m[field]
            except KeyError:
                raise EvalError(f"no such key: {field}") from None
        raise EvalError(f"invalid type for field selection: {type_name(m)}")

    @classmethod
    def _optional_field(cls, m: Any, field: str) -> Optional:
        if isinstance(m, DefaultMap):
            return Optional(True, m[field])  # Kubernetes' map with a default finds every key
        if isinstance(m, dict) and field not in m and not is_quantity_value(m) and not is_semver_value(m):
            return NONE
        return Optional(True, cls._field(m, field))

    @classmethod
    def _optional_index(cls, m: Any, k: Any) -> Optional:
        if isinstance(m, DefaultMap):
            return Optional(True, m[k])
        try:
            return Optional(True, cls._index(m, k))
        except EvalError:
            if isinstance(m, list) and _numeric_kind(k) in ("int", "uint") or (isinstance(m, dict) and not is_quantity_value(m) and not is_semver_value(m)):
                return NONE  # absent key or index: none; a wrong type stays an error
            raise

    @staticmethod
    def _index(m: Any, k: Any) -> Any:
        if isinstance(m, list):
            kind = _numeric_kind(k)
            if kind == "double" and k == int(k):
                k = int(k)
            elif kind not in ("int", "uint"):
                raise _no_overload("_[_]", m, k)
            if not 0 <= k < len(m):
                raise EvalError(f"index out of range: {k}")
            return m[k]
        if isinstance(m, dict) and not is_quantity_value(m) and not is_semver_value(m):
            if isinstance(k, float) and k == int(k):
                k = int(k)
            try:
                return m[k]
            except (KeyError, TypeError):
                raise EvalError(f"no such key: {k}") from None
        raise _no_overload("_[_]", m, k)

    def _two_variables(self, node: Comp, rng: Any, scope: dict[str, Any]) -> Any:
        if isinstance(rng, list):
            pairs = list(enumerate(rng))
        elif isinstance(rng, dict) and not is_quantity_value(rng) and not is_semver_value(rng):
            pairs = list(rng.items())
        else:
            raise EvalError(f"expression of type '{type_name(rng)}' cannot be the range of a comprehension")
        kind = node.kind
        self.cost += INIT_COST.get(kind, 0) + RESULT_COST.get(kind, 1)
        step = STEP_COST[kind]
        scopes = [{**scope, node.var: k, node.var2: v} for k, v in pairs]
        if kind in ("all", "exists"):
            return self._quantify(node.pred, scopes, kind == "exists", step)
        if kind == "existsOne":
            count = 0
            for inner in scopes:
                self._charge(step)
                v = self.ev(node.pred, inner)
                if not isinstance(v, bool):
                    raise _no_overload(kind, v)
                count += v
            return count == 1
        kept = []
        for inner in scopes:
            if node.transform is not None:
                keep = self.ev(node.pred, inner)
                if not isinstance(keep, bool):
                    raise _no_overload(kind, keep)
                if not keep:
                    self._charge(1)  # the step keeps the accumulator
                    continue
            self._charge(step)
            kept.append((inner, self.ev(node.transform if node.transform is not None else node.pred, inner)))
        if kind == "transformList":
            return [value for _, value in kept]
        out: dict[Any, Any] = {}
        for inner, value in kept:
            entries = {inner[node.var]: value} if kind == "transformMap" else value
            if not isinstance(entries, dict):
                raise _no_overload(kind, entries)
            for k, v in entries.items():
                if k in out:
                    raise EvalError(f"insert failed: key {k!r} already exists")
                out[k] = v
        return out

    def _quantify(self, pred: Node, scopes: Iterable[dict[str, Any]], decisive: bool, step: int) -> bool:
        """``all`` (decisive False) or ``exists`` (decisive True) with cel-go's error absorption:
        a decisive element wins over errors on others; otherwise the first error is raised.
        `step`: the cost of each iteration besides the predicate's."""
        error: EvalError | None = None
        for inner in scopes:
            self._charge(step)
            v = _truth(self._absorb(pred, inner))
            if v is decisive:
                return decisive
            if isinstance(v, EvalError) and error is None:
                error = v
        if error is not None:
            raise error
        return not decisive

    def _comprehension(self, node: Comp, scope: dict[str, Any]) -> Any:
        rng = self.ev(node.range, scope)
        if node.var2 is not None:
            return self._two_variables(node, rng, scope)
        if isinstance(rng, dict) and not is_quantity_value(rng) and not is_semver_value(rng):
            items = list(rng.keys())
        elif isinstance(rng, list):
            items = rng
        else:
            raise EvalError(f"expression of type '{type_name(rng)}' cannot be the range of a comprehension")
        kind = node.kind
        self.cost += INIT_COST.get(kind, 0) + RESULT_COST.get(kind, 1)
        step = STEP_COST[kind]
        if kind in ("all", "exists"):
            return self._quantify(node.pred, ({**scope, node.var: item} for item in items), kind == "exists", step)
        if kind == "exists_one":
            count = 0
            for item in items:
                self._charge(step)
                v = self.ev(node.pred, {**scope, node.var: item})
                if not isinstance(v, bool):
                    raise _no_overload("exists_one", v)
                count += v
            return count == 1
        out = []
        for item in items:
            inner = {**scope, node.var: item}
            if kind == "filter" or node.transform is not None:
                keep = self.ev(node.pred, inner)
                if not isinstance(keep, bool):
                    raise _no_overload(kind, keep)
                self._charge(step if keep else 1)  # a step that drops the element keeps the accumulator
                if keep:
                    out.append(item if node.transform is None else self.ev(node.transform, inner))
            else:
                self._charge(step)
                out.append(self.ev(node.pred, inner))
        return out
