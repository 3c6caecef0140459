"""CEL device selectors: the Kubernetes DRA environment (resource.k8s.io/v1).

``compile_selector(expression)`` parses, type-checks and cost-checks an
expression once (cached), then generates source for the fast evaluator
(``cel``, a Rust core, ~0.3-5 µs per evaluation). What that evaluator lacks is
closed here, once per expression, never per claim:

- Kubernetes types (Quantity, Semver) are encoded as one-entry maps
  (``cel_runtime``), their methods are registered functions, and literal
  ``quantity("40Gi")``/``semver("1.2.3")`` are folded at compile time;
  comparisons of two statically typed quantities become native string
  comparisons of an order-preserving key.
- ``cel.bind(x, init, body)``: a cheap value that cannot fail (a device field, a
  domain lookup, a name) is substituted into the body; otherwise the bind
  becomes ``[init].map(x, body)[0]``.
- ``device.attributes["d"].name`` with literal domain and name (the common
  case, also through ``cel.bind``) reads a flat per-device map keyed
  ``"d/name"``: the core copies nested maps on every selection, so this is
  ~5x faster on a GPU with a dozen attributes. ``has()`` becomes ``in``.
- ``device.attributes[d]`` for an unknown domain ``d`` is an empty map:
  where the result is used as a map (``has()``, ``in``, ``size``, macros) the
  lookup is guarded (``d in m ? m[d] : {}``); where a name is read from it, an
  unknown domain fails in both worlds and the error path below decides.
  ``has()`` on the outer map is true, as Kubernetes' map with a default answers.
- ``==`` with a Kubernetes type on the left and another type on the right is
  an error in cel-go, false in the Rust core: such comparisons (a dyn left side,
  on devices where the compared attribute is a version) go through a checked
  function.
- ``size()`` of a string counts code points (the Rust core counts bytes);
  ``matches`` runs RE2, Kubernetes' regular expression engine (the core's Rust
  regex differs on Unicode classes), in linear time.
- Optional types (``x.?f``, ``m[?k]``, ``optional.of``, ``orValue``...): map
  lookups become ``has(x.f) ? optional.of(x.f) : optional.none()``; selections
  on an optional value, which the core cannot parse, run in the interpreter,
  as do two-variable comprehensions (``m.all(k, v, ...)``, ``transformMap``...).
- Errors: whenever the fast path reports one, the reference interpreter
  (``cel_eval``) re-evaluates with cel-go's semantics (``&&``/``||``/``exists``
  absorb errors that the other operands decide), so the verdict, error or not,
  is Kubernetes'. The error path is rare and costs ~10-40 µs.

Limits are Kubernetes': at most 10Ki characters (CELSelectorExpressionMaxLength)
and an estimated cost of at most 1,000,000 (CELSelectorExpressionMaxCost, the
estimate computed as cel-go's ``EstimateCost`` does with the DRA environment's
size limits: ``cel_check``); an expression over either is refused at compile
time. Each evaluation is also limited to that cost at run time, as Kubernetes
runs selectors with ``cel.CostLimit``: the reference interpreter counts cel-go's
runtime cost and stops past it ("actual cost limit exceeded", a CEL runtime
error for that device); the fast core, which counts nothing, runs only a
selector whose estimate bounds every evaluation within the limit.
"""

from __future__ import annotations

import functools
import re
import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, NamedTuple, TypeAlias, TypeGuard, TypeVar

import cel as _fast

from dralloc.schemas.quantity import parse_quantity

from . import cel_runtime as rt
from .cel_check import ATTRIBUTES_TYPE, CAPACITY_TYPE, Checker, CheckError, Info, Type, type_str
from .cel_eval import CostLimitExceeded, DefaultMap, EvalError, Interpreter, equal
from .cel_syntax import (
    Binary,
    Bind,
    Call,
    CelSyntaxError,
    Comp,
    Cond,
    Has,
    Ident,
    Index,
    ListLit,
    Lit,
    MapLit,
    Node,
    Select,
    Unary,
    parse,
    unparse,
)
from .semver import parse_semver

if TYPE_CHECKING:
    from dralloc.schemas.resource import Device, DeviceAttribute

Deadline = tuple[Callable[[], float], float]
"""(clock, time on it) an evaluation must end by."""

MAX_EXPRESSION_LENGTH = 10 * 1024  # resource.k8s.io CELSelectorExpressionMaxLength
MAX_COST = 1_000_000  # resource.k8s.io CELSelectorExpressionMaxCost
_CACHE_SIZE = 4096


SHOWN_MAX = 200
"""Error messages show at most this much of an expression (a 10 KB selector is never repeated whole)."""


def shown(expression: str) -> str:
    """An expression as an error message shows it: whole when short, else its start and its length."""
    if len(expression) <= SHOWN_MAX:
        return expression
    return f"{expression[:SHOWN_MAX]}... ({len(expression)} characters)"


class CelError(Exception):
    """A problem with a CEL selector; ``str(e)`` is a message a person can act on."""


class CelCompileError(CelError):
    """Syntax or type error, or the expression is over the length or cost limit."""


class CelRuntimeError(CelError):
    """The expression failed on a device (missing key, non-bool result, overflow, ...)."""


# --- device environment ------------------------------------------------------------------


class DeviceEnv:
    """One device as selectors see it. Built once per device (per slice generation)."""

    __slots__ = ("driver", "name", "value", "error", "_ctxs", "_version_paths")

    def __init__(self, driver: str, name: str, value: dict[str, Any], error: str | None):
        self.driver = driver
        self.name = name
        self.value = value  # for the reference interpreter (outer maps are DefaultMaps)
        self.error = error  # Kubernetes fails every selector on a device it cannot represent
        # Fast-evaluator contexts by what a selector reads (`Needs`), built on first use: they
        # are most of a device's cost, and the usual class selectors (literal tests, see
        # `Selector.matches`) never need one.
        self._ctxs: dict[Needs, Any] = {}
        self._version_paths: frozenset[tuple[str, str]] | None = None

    @property
    def version_paths(self) -> frozenset[tuple[str, str]]:
        # version attributes are the only Kubernetes-typed values behind a dyn type: a selector
        # that compares one of these (domain, name) with == runs its checked variant
        if self._version_paths is None:
            self._version_paths = frozenset(
                (domain, name) for domain, names in self.value["attributes"].items() for name, v in names.items() if rt.is_semver_value(v)
            )
        return self._version_paths

    def ctx(self, needs: Needs) -> Any:
        """The fast evaluator's context with only the variables (and functions) `needs` names:
        the core converts every value it is given, ~2 µs per attribute, so a selector that
        reads one flat map does not pay for the nested `device` map too."""
        ctx = self._ctxs.get(needs)
        if ctx is None:
            ctx = self._ctxs[needs] = self._build_ctx(needs)
        return ctx

    def _build_ctx(self, needs: Needs) -> Any:
        value = self.value
        variables: dict[str, Any] = {}
        if "device" in needs.variables:
            variables["device"] = {**value, "attributes": dict(value["attributes"]), "capacity": dict(value["capacity"])}
        # The core copies a nested map each time it selects into it, so device.attributes[d].x
        # costs ~0.2 µs per attribute of the device; literal lookups read these flat maps instead.
        for outer, flat in _FLAT.items():
            if flat in needs.variables:
                variables[flat] = {f"{domain}/{name}": v for domain, names in value[outer].items() for name, v in names.items()}
        if needs.functions:
            return _fast.Context(variables=variables, functions=_FAST_FUNCTIONS)
        return _fast.Context(variables=variables)


class Needs(NamedTuple):
    """What a compiled selector's fast source reads: its variables and whether it calls functions."""

    variables: frozenset[str]
    functions: bool


_NO_NEEDS = Needs(frozenset(), False)


def _needs(*sources: str) -> Needs:
    """From the generated sources' identifiers. Over-counting (a name inside a string literal)
    only costs time; a variable left out would fail the fast path into the interpreter."""
    names = {name for source in sources for name in _IDENTIFIER.findall(_STRING.sub('""', source))}
    return Needs(frozenset(names & {"device", *_FLAT.values()}), not names.isdisjoint(_FAST_FUNCTIONS))


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_STRING = re.compile(r'"(?:[^"\\]|\\.)*"|\'(?:[^\'\\]|\\.)*\'')


def _split_name(name: str, driver: str) -> tuple[str, str]:
    """A qualified name "domain/id"; an unqualified one belongs to the driver's domain."""
    domain, sep, ident = name.partition("/")
    return (domain, ident) if sep else (driver, name)


_device_version = functools.lru_cache(maxsize=4096)(parse_semver)
"""A version attribute's parse: a fleet repeats a few versions on every device (always a string here)."""


def _attribute_value(attr: DeviceAttribute) -> Any:
    """An attribute as CEL sees it: a scalar, or a list of them (KEP-5491: `ints`, `bools`,
    `strings`, `versions`; each version a Semver). Raises ValueError for a value Kubernetes
    cannot represent (no value set, an int outside int64, a version that does not parse)."""
    if attr.int is not None:
        return _int64(attr.int)
    if attr.bool is not None:
        return attr.bool
    if attr.string is not None:
        return attr.string
    if attr.version is not None:
        return rt.semver_value(_device_version(attr.version))
    if attr.ints is not None:
        return [_int64(v) for v in attr.ints]
    if attr.bools is not None:
        return list(attr.bools)
    if attr.strings is not None:
        return list(attr.strings)
    if attr.versions is not None:
        return [rt.semver_value(_device_version(v)) for v in attr.versions]
    raise ValueError("has no value (set one of int, bool, string, version, ints, bools, strings, versions)")


def _int64(value: int) -> int:
    if not -(2**63) <= value < 2**63:
        raise ValueError(f"integer {value} is out of the int64 range")
    return value


def device_env(driver: str, device: Device) -> DeviceEnv:
    """The CEL view of a ResourceSlice device: driver, attributes and capacity by domain."""
    attributes: DefaultMap = DefaultMap()
    capacity: DefaultMap = DefaultMap()
    error: str | None = None
    for name, attr in device.attributes.items():
        domain, ident = _split_name(name, driver)
        try:
            value = _attribute_value(attr)
        except ValueError as e:
            error = error or f"device {device.name}: attribute {name}: {e}"
            continue
        attributes.setdefault(domain, {})[ident] = value
    for name, cap in device.capacity.items():
        domain, ident = _split_name(name, driver)
        try:
            capacity.setdefault(domain, {})[ident] = rt.quantity_value(parse_quantity(cap.value))
        except ValueError as e:
            error = error or f"device {device.name}: capacity {name}: {e}"
    value = {
        "driver": driver,
        "attributes": attributes,
        "capacity": capacity,
        "allowMultipleAllocations": bool(device.allow_multiple_allocations),
    }
    return DeviceEnv(driver, device.name, value, error)


# --- compiled selectors ------------------------------------------------------------------


class Selector:
    """A compiled selector. ``matches`` is safe to call from several threads."""

    __slots__ = ("expression", "ast", "cost", "fast_source", "driver", "_program", "_program_versions", "_compared", "_tests", "_needs")

    def __init__(self, expression: str, ast: Node, cost: int, sources: tuple[str, str] | None, compared: frozenset[tuple[str, str]] | None = frozenset()):
        self.expression = expression
        self.ast = ast
        self.cost = cost  # estimated worst-case cost, <= MAX_COST
        self.fast_source = sources[0] if sources else None
        self._program = self._program_versions = None
        self._needs = _NO_NEEDS  # read only where there is a program
        # attributes (domain, name) this selector compares with ==; None: not known statically
        self._compared = compared
        self._tests = _literal_tests(ast)
        self.driver = driver_literal(self._tests)
        """The driver when the selector is exactly `device.driver == "x"` (the usual class selector),
        else None: verdicts.py decides it by the driver alone, before any CEL environment."""
        if sources is not None:
            self._program = _fast.compile(sources[0])
            # the variant whose == on dynamic values is checked, for devices where one of
            # the compared attributes is a version
            self._program_versions = self._program if sources[1] == sources[0] else _fast.compile(sources[1])
            self._needs = _needs(*sources)

    def matches(self, device: DeviceEnv, cost_limit: int = MAX_COST, deadline: Deadline | None = None) -> bool:
        """Does the device satisfy the selector? Raises CelRuntimeError, also when the evaluation
        costs more than `cost_limit` (Kubernetes' runtime limit, CELSelectorExpressionMaxCost).
        The fast core counts nothing: it runs only when the estimate (an upper bound of every
        evaluation's cost) is within the limit; otherwise the counting interpreter decides.
        `deadline` (clock, time): the interpreter stops past it with `OutOfTime` (not a verdict)."""
        if device.error is not None:
            raise CelRuntimeError(device.error)
        if self._tests is not None and (settled := _settle(self._tests, device.value)) is not None:
            return settled
        if self.cost > cost_limit:
            return self.evaluate(device, cost_limit, deadline)
        program = self._program
        if device.version_paths and (self._compared is None or not self._compared.isdisjoint(device.version_paths)):
            program = self._program_versions
        if program is not None:
            try:
                result = program.execute(device.ctx(self._needs))
            except Exception:  # noqa: BLE001 - any fast-path error is re-decided below
                pass
            else:
                if result is True or result is False:
                    return result
        return self.evaluate(device, cost_limit, deadline)

    def evaluate(self, device: DeviceEnv, cost_limit: int | None = MAX_COST, deadline: Deadline | None = None) -> bool:
        """The reference interpreter alone (cel-go semantics, cost counted and limited to
        `cost_limit`; None: no limit); what ``matches`` falls back to."""
        if device.error is not None:
            raise CelRuntimeError(device.error)
        try:
            result = Interpreter(cost_limit, deadline).run(self.ast, device.value)
        except CostLimitExceeded as e:
            raise CelRuntimeError(f"{shown(self.expression)}: {e} (device {device.driver}/{device.name})") from None
        except EvalError as e:
            raise CelRuntimeError(f"{shown(self.expression)}: {e} (device {device.driver}/{device.name}){_hint(e)}") from None
        except RecursionError:
            raise CelRuntimeError(f"{shown(self.expression)}: evaluation nested too deeply") from None
        if result is True or result is False:
            return result
        raise CelRuntimeError(f"{shown(self.expression)}: must evaluate to bool, got {rt.type_name(result)} (device {device.driver}/{device.name})")

    def __repr__(self) -> str:
        return f"Selector({self.expression!r})"


_MISSING_KEY_HINT = (
    "; not every device has every attribute or capacity: test for it with has() "
    '(has(device.attributes["dra.example.com"].model) && ...) or use optional chaining '
    '(device.attributes["dra.example.com"].?model.orValue("") == ...)'
)


def _hint(error: EvalError) -> str:
    """What to do about a runtime error, where something is known (Kubernetes' own hint for a missing key)."""
    return _MISSING_KEY_HINT if str(error).startswith("no such key") else ""


LiteralTest = tuple[str | None, str, str | bool]
"""(attribute domain, or None for the driver; attribute name; the literal it must equal)."""


def _literal_tests(ast: Node) -> tuple[LiteralTest, ...] | None:
    """The selector as a conjunction of ``==`` tests of a device field against a string or bool
    literal (``device.driver == "x"``, ``device.attributes["d"].name == "v"``; the usual class
    selectors), or None. Such a selector is settled on the device's values without an evaluator."""
    if isinstance(ast, Binary) and ast.op == "&&":
        left, right = _literal_tests(ast.left), _literal_tests(ast.right)
        return None if left is None or right is None else left + right
    if not (isinstance(ast, Binary) and ast.op == "==" and isinstance(ast.right, Lit) and ast.right.kind in ("string", "bool")):
        return None
    target, literal = ast.left, ast.right.value

    def is_device_field(node: Node, name: str) -> bool:
        return isinstance(node, Select) and not node.optional and node.field == name and isinstance(node.operand, Ident) and node.operand.name == "device"

    if is_device_field(target, "driver"):
        return ((None, "driver", literal),)
    if isinstance(target, Select) and not target.optional:
        name, domain_node = target.field, target.operand
    elif isinstance(target, Index) and not target.optional and isinstance(target.index, Lit) and target.index.kind == "string":
        name, domain_node = target.index.value, target.operand
    else:
        return None
    if (
        isinstance(domain_node, Index)
        and not domain_node.optional
        and is_device_field(domain_node.operand, "attributes")
        and isinstance(domain_node.index, Lit)
        and domain_node.index.kind == "string"
    ):
        return ((domain_node.index.value, name, literal),)
    return None


def driver_literal(tests: tuple[LiteralTest, ...] | None) -> str | None:
    """The driver a selector whose literal tests (`_literal_tests`) are one driver test compares
    with; None for any other selector. The one place that recognises the driver shortcut."""
    if tests is not None and len(tests) == 1 and tests[0][0] is None and isinstance(tests[0][2], str):
        return tests[0][2]
    return None


def _settle(tests: tuple[LiteralTest, ...], value: dict[str, Any]) -> bool | None:
    """False if a test fails (CEL's ``&&`` is false whatever its other operands, errors included),
    True if all pass, None (the evaluators decide) if a value is missing or not of the literal's type."""
    settled: bool | None = True
    for domain, name, literal in tests:
        if domain is None:
            found = value["driver"]
        else:
            names = value["attributes"].get(domain)
            found = None if names is None else names.get(name)
        if found is None or type(found) is not type(literal):
            settled = None
        elif found != literal:
            return False
    return settled


_cache: OrderedDict[str, Selector | CelCompileError] = OrderedDict()
_cache_lock = threading.Lock()


def compile_selector(expression: str) -> Selector:
    """Compile (once; cached per expression string). Raises CelCompileError."""
    with _cache_lock:
        hit = _cache.get(expression)
        if hit is not None:
            _cache.move_to_end(expression)
    if hit is None:
        try:
            hit = _compile(expression)
        except CelCompileError as e:
            hit = e
        with _cache_lock:
            _cache[expression] = hit
            if len(_cache) > _CACHE_SIZE:
                _cache.popitem(last=False)
    if isinstance(hit, CelCompileError):
        raise hit
    return hit


def _compile(expression: str) -> Selector:
    if not isinstance(expression, str):
        raise CelCompileError(f"a CEL expression must be a string, not {type(expression).__name__}")
    if len(expression) > MAX_EXPRESSION_LENGTH:
        raise CelCompileError(f"expression is {len(expression)} characters long, over the limit of {MAX_EXPRESSION_LENGTH}")
    if not expression.strip():
        raise CelCompileError("expression is empty")
    ast, checker, info = check_expression(expression)
    if info.type not in ("bool", "dyn"):
        raise CelCompileError(f"{shown(expression)}: must evaluate to bool or the unknown type, not {type_str(info.type)}")
    if info.cost > MAX_COST:
        raise CelCompileError(
            f"{shown(expression)}: estimated cost {info.cost:,} is over the limit of {MAX_COST:,} "
            "(the expression is too complex: shrink the lists it iterates or nest fewer comprehensions)"
        )
    checked = _Emitter(checker.types, True)
    try:
        sources = (_Emitter(checker.types, False).emit(ast), checked.emit(ast))
        compared = None if checked.compared is None else frozenset(checked.compared)
        return Selector(expression, ast, info.cost, sources, compared)
    except Exception:  # noqa: BLE001 - not expressible for (or rejected by) the fast core: the interpreter runs it
        return Selector(expression, ast, info.cost, None)


def check_expression(expression: str) -> tuple[Node, Checker, Info]:
    """Parse and check; raises CelCompileError naming the problem and where it is."""
    try:
        ast = parse(expression)
    except CelSyntaxError as e:
        raise CelCompileError(f"{shown(expression)}: syntax error at column {e.pos + 1}: {e}") from None
    except RecursionError:
        raise CelCompileError(f"{shown(expression)}: expression nested too deeply") from None
    checker = Checker()
    try:
        info = checker.check(ast, {})
    except CheckError as e:
        raise CelCompileError(f"{shown(expression)}: {e}") from None
    except RecursionError:
        raise CelCompileError(f"{shown(expression)}: expression nested too deeply") from None
    return ast, checker, info


# --- code generation for the fast evaluator ------------------------------------------------


def _q_literal(nano: int) -> str:
    return f'{{"{rt.Q_KEY}": "{rt.quantity_key(nano)}"}}'


Bindings: TypeAlias = dict[str, tuple[Node, "Bindings"]]
"""cel.bind names replaced by their value's expression: name -> (node, bindings in force there)."""

_T = TypeVar("_T")


class _Emitter:
    """AST -> source for the fast evaluator, with the rewrites described above."""

    def __init__(self, types: dict[int, Type], check_versions: bool):
        self.types = types
        self.check_versions = check_versions
        self.subst: Bindings = {}
        # attributes compared with a checked ==, or None when one is not a literal attribute path
        self.compared: set[tuple[str, str]] | None = set()

    def _under(self, subst: Bindings, fn: Callable[..., _T], *args: Any) -> _T:
        """``fn(*args)`` with `subst` as the bindings in force."""
        saved, self.subst = self.subst, subst
        try:
            return fn(*args)
        finally:
            self.subst = saved

    def _without(self, var: str) -> Bindings:
        return {k: v for k, v in self.subst.items() if k != var}

    def _inlinable(self, node: Node) -> bool:
        """A bind value that is cheap and cannot fail: a name, a literal, a device field or a
        domain lookup. cel.bind of such a value is replaced by the value itself (CEL is pure),
        which the core evaluates several times faster than the [value].map(x, body)[0] form."""
        if isinstance(node, (Ident, Lit)):
            return True
        if isinstance(node, Select) and isinstance(node.operand, Ident) and node.operand.name == "device":
            return "device" not in self.subst
        return self._domain_lookup(node) and self._inlinable(node.operand) and (isinstance(node, Select) or isinstance(node.index, Lit))

    def t(self, node: Node) -> Type | None:
        """The checker's static type of `node` (None for a node it did not type)."""
        return self.types.get(id(node))

    def _optional(self, node: Node) -> bool:
        t = self.t(node)
        return isinstance(t, tuple) and t[0] == "optional"

    def _domain_lookup(self, node: Node) -> TypeGuard[Index | Select]:
        """device.attributes[d] / device.capacity[d] (or .d): a domain lookup."""
        return isinstance(node, (Index, Select)) and self.t(node.operand) in (ATTRIBUTES_TYPE, CAPACITY_TYPE)

    def _resolve(self, node: Node) -> tuple[Node, Bindings]:
        subst = self.subst
        while isinstance(node, Ident) and node.name in subst:
            node, subst = subst[node.name]
        return node, subst

    def _flat_key(self, domain_node: Node, name: str) -> tuple[str, str] | None:
        """(flat variable, "domain/name") when ``domain_node`` is ``device.attributes["d"]``
        or ``device.capacity["d"]`` (through cel.bind names) with a literal domain."""
        domain_node, subst = self._resolve(domain_node)
        if not self._domain_lookup(domain_node):
            return None
        if isinstance(domain_node, Select):
            domain = domain_node.field
        elif isinstance(domain_node.index, Lit) and domain_node.index.kind == "string":
            domain = domain_node.index.value
        else:
            return None
        outer, _ = self._under(subst, self._resolve, domain_node.operand)
        if not (_is_device_field(outer, "attributes", "capacity") and "device" not in subst):
            return None
        return _FLAT[outer.field], f"{domain}/{name}"

    def _flat(self, node: Select | Index) -> str | None:
        if isinstance(node, Select):
            name = node.field
        elif isinstance(node.index, Lit):
            name = node.index.value
        else:
            return None
        found = self._flat_key(node.operand, name)
        return None if found is None else f"{found[0]}[{_string(found[1])}]"

    def inner(self, node: Node) -> str:
        """A domain lookup whose result is read further (``.name``, ``[name]``): an unknown
        domain fails there anyway, so the fast path skips the empty-map guard and the
        interpreter (on the error) decides; everything else is emitted normally."""
        if isinstance(node, Ident) and node.name in self.subst:
            value, scope = self.subst[node.name]
            return self._under(scope, self.inner, value)
        if self._domain_lookup(node):
            if isinstance(node, Index):
                return f"{self.emit(node.operand)}[{self.emit(node.index)}]"
            return f"{self.emit(node.operand)}.{node.field}"
        return self.emit(node)

    def emit(self, node: Node) -> str:
        e = self.emit
        match node:
            case Ident(name) if name in self.subst:
                value, scope = self.subst[name]
                return f"({self._under(scope, self.emit, value)})"
            case Lit() | Ident():
                return unparse(node)
            case Select(operand, _) | Index(operand, _) if self._optional(operand):
                raise _NoFastPath  # selection on an optional value: the interpreter runs these
            case Select(operand, field, True) if self._domain_lookup(node):
                m = e(operand)
                return f'optional.of(("{field}" in {m} ? {m}.{field} : {{}}))'
            case Select(operand, field, True):
                x = self.inner(operand)
                return f"(has({x}.{field}) ? optional.of({x}.{field}) : optional.none())"
            case Index(operand, index, True) if self._domain_lookup(node):
                m, k = e(operand), e(index)
                return f"optional.of(({k} in {m} ? {m}[{k}] : {{}}))"
            case Index(operand, index, True) if isinstance(operand_type := self.t(operand), tuple) and operand_type[0] == "map":
                x, k = self.inner(operand), e(index)
                return f"({k} in {x} ? optional.of({x}[{k}]) : optional.none())"
            case Index(operand, index, True):
                raise _NoFastPath  # a list or a dynamic value: `in` would mean membership
            case Select(_, _, False) | Index(_, Lit(_, "string"), False) if (flat := self._flat(node)) is not None:
                return flat
            case Select(operand, field) if self._domain_lookup(node):
                m = e(operand)
                return f'("{field}" in {m} ? {m}.{field} : {{}})'
            case Select(operand, field):
                return f"{self.inner(operand)}.{field}"
            case Has(operand, field) if self.t(operand) in (ATTRIBUTES_TYPE, CAPACITY_TYPE):
                return "true"
            case Has(operand, field) if (found := self._flat_key(operand, field)) is not None:
                variable, key = found
                return f"({_string(key)} in {variable})"
            case Has(operand, field):
                return f"has({e(operand)}.{field})"
            case Index(operand, index) if self._domain_lookup(node):
                m, k = e(operand), e(index)
                return f"({k} in {m} ? {m}[{k}] : {{}})"
            case Index(operand, index):
                return f"{self.inner(operand)}[{e(index)}]"
            case Call():
                return self.call(node)
            case Unary(op, operand):
                return f"{op}({e(operand)})"
            case Binary(op, Call("compareTo", (other,), target), Lit(0, "int")) if (
                op in ("==", "!=", "<", "<=", ">", ">=") and target is not None and self._quantities(target, other)
            ):
                return f"({self._key(target)} {op} {self._key(other)})"
            case Binary("==" | "!=" as op, left, right) if self._checked_equality(left, right):
                call = f"{_EQ}({e(left)}, {e(right)})"
                return call if op == "==" else f"!{call}"
            case Binary(op, left, right):
                return f"({e(left)} {op} {e(right)})"
            case Cond(c, t, o):
                return f"({e(c)} ? {e(t)} : {e(o)})"
            case ListLit(items):
                return "[" + ", ".join(e(i) for i in items) + "]"
            case MapLit(entries):
                return "{" + ", ".join(f"{e(k)}: {e(v)}" for k, v in entries) + "}"
            case Comp(var2=str()):
                raise _NoFastPath  # two-variable comprehensions: the core has none
            case Comp(kind, rng, var, pred, transform):
                inner = self._without(var)
                extra = f", {self._under(inner, e, transform)}" if transform is not None else ""
                return f"{e(rng)}.{kind}({var}, {self._under(inner, e, pred)}{extra})"
            case Bind(var, init, body) if self._inlinable(init):
                return self._under({**self.subst, var: (init, self.subst)}, e, body)
            case Bind(var, init, body):
                return f"[{e(init)}].map({var}, {self._under(self._without(var), e, body)})[0]"
        raise TypeError(f"cannot emit {node!r}")

    def _checked_equality(self, left: Node, right: Node) -> bool:
        """cel-go: a Quantity or Semver on the left of == rejects other types (an error);
        the fast core would answer false. Such comparisons go through a checked function:
        always for a typed Quantity/Semver against dyn, and for a dyn left side only in
        the program for devices that have version attributes."""
        lt, rt_ = self.t(left), self.t(right)
        if lt in ("Quantity", "Semver"):
            return rt_ == "dyn"
        if lt == "dyn" and self.check_versions and rt_ not in ("Quantity", "Semver"):
            path = self._attribute_path(left)
            if path is None:
                self.compared = None
            elif self.compared is not None:
                self.compared.add(path)
            return True
        return False

    def _attribute_path(self, node: Node) -> tuple[str, str] | None:
        """(domain, name) of ``device.attributes["domain"].name`` (or ``["name"]``, or through
        an inlined cel.bind name), else None."""
        if isinstance(node, Select):
            name: Any = node.field
        elif isinstance(node, Index) and isinstance(node.index, Lit) and node.index.kind == "string":
            name = node.index.value
        else:
            return None
        domain_node = node.operand
        subst = self.subst
        while isinstance(domain_node, Ident) and domain_node.name in subst:
            domain_node, subst = subst[domain_node.name]
        if not (self._domain_lookup(domain_node) and self.t(domain_node.operand) == ATTRIBUTES_TYPE):
            return None
        if isinstance(domain_node, Select):
            return domain_node.field, name
        index = domain_node.index
        return (index.value, name) if isinstance(index, Lit) and index.kind == "string" else None

    def _quantities(self, a: Node, b: Node) -> bool:
        return self.t(a) == "Quantity" and self.t(b) == "Quantity"

    def _key(self, node: Node) -> str:
        if isinstance(node, Call) and node.name == "quantity" and node.target is None:
            folded = self._fold_quantity(node)
            if folded is not None:
                return f'"{rt.quantity_key(folded)}"'
        return f'{self.emit(node)}["{rt.Q_KEY}"]'

    @staticmethod
    def _fold_quantity(node: Call) -> int | None:
        if len(node.args) == 1 and isinstance(node.args[0], Lit) and node.args[0].kind == "string":
            try:
                return parse_quantity(node.args[0].value)
            except ValueError:
                return None  # stays a call: Kubernetes reports it at runtime, so do we
        return None

    def call(self, node: Call) -> str:
        name, args, target = node.name, node.args, node.target
        e = self.emit
        if target is None and name == "quantity":
            folded = self._fold_quantity(node)
            if folded is not None:
                return _q_literal(folded)
        literals = [a for a in args if isinstance(a, Lit)]
        if target is None and name == "semver" and args and len(literals) == len(args):
            try:
                normalize = len(literals) == 2 and literals[1].value is True
                v = rt.semver_value(parse_semver(literals[0].value, normalize)) if literals[0].kind == "string" else None
            except ValueError:
                v = None
            if v is not None and (len(literals) == 1 or literals[1].kind == "bool"):
                return f'{{"{rt.V_KEY}": "{v[rt.V_KEY]}"}}'
        if name in ("isGreaterThan", "isLessThan") and target is not None and len(args) == 1 and (self._quantities(target, args[0])):
            op = ">" if name == "isGreaterThan" else "<"
            return f"({self._key(target)} {op} {self._key(args[0])})"
        if name == "matches":  # RE2 (Kubernetes' engine) rather than the core's Rust regex
            subject = target if target is not None else args[0]
            pattern = args[0] if target is not None else args[1]
            return f"{_MATCHES}({e(subject)}, {e(pattern)})"
        if name == "size":
            sized = target if target is not None else (args[0] if args else None)
            if sized is not None and self.t(sized) in ("string", "dyn"):
                return f"{_SIZE}({e(sized)})"
        inner = ", ".join(e(a) for a in args)
        return f"{e(target)}.{name}({inner})" if target is not None else f"{name}({inner})"


_FLAT = {"attributes": "__dra_attributes", "capacity": "__dra_capacity"}  # "domain/name" -> value


def _string(text: str) -> str:
    return unparse(Lit(text, "string"))


def _is_device_field(node: Node, *fields: str) -> TypeGuard[Select]:
    return isinstance(node, Select) and not node.optional and isinstance(node.operand, Ident) and (node.operand.name == "device") and node.field in fields


class _NoFastPath(Exception):
    """The expression uses something the fast core cannot express; the interpreter runs it."""


_SIZE = "dralloc_size"  # code-point size; the Rust core's size() counts UTF-8 bytes


def _size(x: Any) -> int:
    if isinstance(x, (str, list, bytes)) or (isinstance(x, dict) and not rt.is_quantity_value(x) and not rt.is_semver_value(x)):
        return len(x)
    raise rt.LibraryError(f"no such overload: size({rt.type_name(x)})")


_EQ = "dralloc_equal"
_MATCHES = "dralloc_matches"


def _equal(a: Any, b: Any) -> bool:
    return equal(a, b)  # raises EvalError where cel-go's == has no such overload


class _Failed:
    """What a library function returns to the fast core when it fails. The core cannot
    convert it, so it reports an error quietly (an exception raised in a callback is
    also printed to stderr by the binding), and the interpreter re-decides with the
    real message."""


_FAILED = _Failed()


def _quiet(fn: Any) -> Any:
    def call(*args: Any) -> Any:
        try:
            return fn(*args)
        except Exception:  # noqa: BLE001 - any failure becomes a CEL error, re-decided by the interpreter
            return _FAILED

    return call


_FAST_FUNCTIONS = {name: _quiet(fn) for name, fn in {**rt.FUNCTIONS, _SIZE: _size, _EQ: _equal, _MATCHES: rt.matches}.items()}


def diagnose(expression: str) -> list[str]:
    """Human-readable problems of a selector that fails to compile or misuses the
    environment, each with a fix where one is known; the last entry is
    ``suggested expression: ...`` when a corrected expression compiles. Empty
    for a valid selector that shows no known misuse."""
    from .cel_diagnose import diagnose as _diagnose

    return _diagnose(expression, compile_selector)
