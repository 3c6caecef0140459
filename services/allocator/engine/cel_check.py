"""Static checks of a selector against the Kubernetes DRA CEL environment.

One pass over the AST computes, per node, its CEL type (the checker of
cel-go, as Kubernetes configures it for device selectors) and an upper bound
of its evaluation cost and size (in the spirit of ``cel.EstimateCost`` with
Kubernetes' size limits for devices: 32 domains and 32 names per map,
attribute strings of at most 64 characters). An expression whose bound
exceeds the limit is refused before it is ever run, which is what keeps a
hostile selector from hanging the allocator.

Types: "bool" "int" "uint" "double" "string" "bytes" "null_type" "dyn"
"type" "Quantity" "Semver" "device", ("list", T), ("map", K, V), ("optional", T).
"""

from __future__ import annotations

from dataclasses import dataclass

from .cel_runtime import INCLUDES_MAX, LibraryError, compile_regex
from .cel_syntax import Binary, Bind, Call, Comp, Cond, Has, Ident, Index, ListLit, Lit, MapLit, Node, Select, Unary

Type = str | tuple["Type", ...]
"""A CEL type: a name, or a parameterized type as a tuple whose first item is its name."""

MAX_ELEMENTS = 32  # ResourceSliceMaxAttributesAndCapacitiesPerDevice
ATTRIBUTE_MAX_LENGTH = 64  # DeviceAttributeMaxValueLength
DRIVER_MAX_LENGTH = 63

ATTRIBUTES_TYPE: Type = ("map", "string", ("map", "string", "dyn"))
CAPACITY_TYPE: Type = ("map", "string", ("map", "string", "Quantity"))
DEVICE_FIELDS: dict[str, tuple[Type, int]] = {
    "driver": ("string", DRIVER_MAX_LENGTH),
    "attributes": (ATTRIBUTES_TYPE, MAX_ELEMENTS),
    "capacity": (CAPACITY_TYPE, MAX_ELEMENTS),
    "allowMultipleAllocations": ("bool", 1),
}


class CheckError(Exception):
    """A type error; the message names the problem like cel-go's checker does."""


def type_str(t: Type) -> str:
    if isinstance(t, tuple):
        if t[0] == "list":
            return f"list({type_str(t[1])})"
        if t[0] == "optional":
            return f"optional_type({type_str(t[1])})"
        return f"map({type_str(t[1])}, {type_str(t[2])})"
    return {"Quantity": "kubernetes.Quantity", "Semver": "kubernetes.Semver", "device": "kubernetes.DRADevice"}.get(t, t)


def assignable(a: Type, b: Type) -> bool:
    """Could values of these static types meet at runtime (dyn matches anything)?"""
    if a == "dyn" or b == "dyn" or a == b:
        return True
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]:
        return all(assignable(x, y) for x, y in zip(a[1:], b[1:]))
    return False


def join(a: Type, b: Type) -> Type:
    return a if a == b else "dyn"


@dataclass(frozen=True, slots=True)
class Info:
    type: Type
    cost: int  # upper bound of the evaluation cost of this subtree
    size: int  # upper bound of the value's size (string length, list/map elements)
    elem: int | None = None
    """Upper bound of a list literal's items' or a map literal's keys' sizes (cel-go's entry size);
    None: what the element type allows (`_elem_size`)."""


NUMERIC = ("int", "uint", "double")
ORDERED = (*NUMERIC, "string", "bytes", "bool")

# name -> [(receiver type or None for a global, parameter types, result)]; "A": any (type parameter)
_STR, _INT, _BOOL = "string", "int", "bool"
FUNCTIONS: dict[str, list[tuple[Type | None, tuple[Type, ...], Type]]] = {
    "size": [
        (None, ("string",), _INT),
        (None, ("bytes",), _INT),
        (None, (("list", "A"),), _INT),
        (None, (("map", "A", "A"),), _INT),
        ("string", (), _INT),
        ("bytes", (), _INT),
        (("list", "A"), (), _INT),
        (("map", "A", "A"), (), _INT),
    ],
    "contains": [(_STR, (_STR,), _BOOL)],
    "startsWith": [(_STR, (_STR,), _BOOL)],
    "endsWith": [(_STR, (_STR,), _BOOL)],
    "matches": [(_STR, (_STR,), _BOOL), (None, (_STR, _STR), _BOOL)],
    "int": [(None, (t,), _INT) for t in ("int", "uint", "double", "string")],
    "uint": [(None, (t,), "uint") for t in ("int", "uint", "double", "string")],
    "double": [(None, (t,), "double") for t in ("int", "uint", "double", "string")],
    "string": [(None, (t,), _STR) for t in ("int", "uint", "double", "string", "bytes", "bool")],
    "bytes": [(None, (t,), "bytes") for t in ("string", "bytes")],
    "bool": [(None, (t,), _BOOL) for t in ("string", "bool")],
    "dyn": [(None, ("A",), "dyn")],
    "type": [(None, ("A",), "type")],
    "quantity": [(None, (_STR,), "Quantity")],
    "isQuantity": [(None, (_STR,), _BOOL)],
    "semver": [(None, (_STR,), "Semver"), (None, (_STR, _BOOL), "Semver")],
    "isSemver": [(None, (_STR,), _BOOL), (None, (_STR, _BOOL), _BOOL)],
    "isGreaterThan": [("Quantity", ("Quantity",), _BOOL), ("Semver", ("Semver",), _BOOL)],
    "isLessThan": [("Quantity", ("Quantity",), _BOOL), ("Semver", ("Semver",), _BOOL)],
    "compareTo": [("Quantity", ("Quantity",), _INT), ("Semver", ("Semver",), _INT)],
    "sign": [(None, ("Quantity",), _INT)],
    "isInteger": [("Quantity", (), _BOOL)],
    "asInteger": [("Quantity", (), _INT)],
    "asApproximateFloat": [("Quantity", (), "double")],
    "add": [("Quantity", ("Quantity",), "Quantity"), ("Quantity", (_INT,), "Quantity")],
    "sub": [("Quantity", ("Quantity",), "Quantity"), ("Quantity", (_INT,), "Quantity")],
    "major": [("Semver", (), _INT)],
    "minor": [("Semver", (), _INT)],
    "patch": [("Semver", (), _INT)],
    "charAt": [(_STR, (_INT,), _STR)],
    "indexOf": [(_STR, (_STR,), _INT), (_STR, (_STR, _INT), _INT), (("list", "A"), ("A",), _INT)],
    "lastIndexOf": [(_STR, (_STR,), _INT), (_STR, (_STR, _INT), _INT), (("list", "A"), ("A",), _INT)],
    "lowerAscii": [(_STR, (), _STR)],
    "upperAscii": [(_STR, (), _STR)],
    "replace": [(_STR, (_STR, _STR), _STR), (_STR, (_STR, _STR, _INT), _STR)],
    "split": [(_STR, (_STR,), ("list", _STR)), (_STR, (_STR, _INT), ("list", _STR))],
    "substring": [(_STR, (_INT,), _STR), (_STR, (_INT, _INT), _STR)],
    "trim": [(_STR, (), _STR)],
    "join": [(("list", _STR), (), _STR), (("list", _STR), (_STR,), _STR)],
    "find": [(_STR, (_STR,), _STR)],
    "findAll": [(_STR, (_STR,), ("list", _STR)), (_STR, (_STR, _INT), ("list", _STR))],
    "isSorted": [(("list", "A"), (), _BOOL)],
    "sum": [(("list", "A"), (), "A")],
    "min": [(("list", "A"), (), "A")],
    "max": [(("list", "A"), (), "A")],
    "optional.of": [(None, ("A",), ("optional", "A"))],
    "optional.ofNonZeroValue": [(None, ("A",), ("optional", "A"))],
    "optional.none": [(None, (), ("optional", "dyn"))],
    "hasValue": [(("optional", "A"), (), _BOOL)],
    "value": [(("optional", "A"), (), "A")],
    "orValue": [(("optional", "A"), ("A",), "A")],
    "or": [(("optional", "A"), (("optional", "A"),), ("optional", "A"))],
    "sets.contains": [(None, (("list", "A"), ("list", "A")), _BOOL)],
    "sets.equivalent": [(None, (("list", "A"), ("list", "A")), _BOOL)],
    "sets.intersects": [(None, (("list", "A"), ("list", "A")), _BOOL)],
    # KEP-5491 (list-type attributes): a member function on any value, of any argument ("*")
    "includes": [("*", ("*",), _BOOL)],
}
NAMESPACES = {"sets", "optional"}
TYPE_NAMES = ("int", "uint", "double", "bool", "string", "bytes", "list", "map", "null_type", "type")

# functions whose cost grows with the size of their receiver/first argument (cel-go: 0.1 per char)
_LINEAR = {
    "contains",
    "startsWith",
    "endsWith",
    "indexOf",
    "lastIndexOf",
    "lowerAscii",
    "upperAscii",
    "replace",
    "split",
    "substring",
    "trim",
    "join",
    "charAt",
    "isSorted",
    "sum",
    "min",
    "max",
    "string",
    "bytes",
    "int",
    "uint",
    "double",
    "bool",
    "quantity",
    "isQuantity",
    "semver",
    "isSemver",
}


def traversal(size: int) -> int:
    """ceil(0.1 * size): cel-go's StringTraversalCostFactor, per character traversed."""
    return -(-size // 10)


def call_cost(name: str, sizes: list[int], list_receiver: bool) -> int:
    """The cost of one call besides its operands', from the sizes of its receiver and arguments
    (in that order): bounds at check time, actual sizes at run time (``cel_eval``), so an
    evaluation never costs more than its estimate. cel-go's and Kubernetes' library costs
    (checker/cost.go, apiserver/pkg/cel/library/cost.go), each plus the base cost of a call."""
    first = sizes[0] if sizes else 0
    cost = 1
    if name in ("matches", "find", "findAll") and len(sizes) >= 2:
        return cost + traversal(first + 1) * max(1, -(-sizes[1] // 4))  # RegexStringLengthCostFactor 0.25
    if name == "contains" and len(sizes) == 2:
        return cost + traversal(first) * max(1, traversal(sizes[1]))
    if name.startswith("sets.") and len(sizes) == 2:
        return cost + sizes[0] * sizes[1]
    if name in ("indexOf", "lastIndexOf", "isSorted", "sum", "min", "max") and list_receiver:
        return cost + first  # one comparison per element
    if name == "includes":  # linear in the list, at most 48 values (Kubernetes' estimate)
        return cost + INCLUDES_MAX
    if name in ("replace", "split", "join"):
        return cost + traversal(2 * first)  # the traversal and the result built
    if name in _LINEAR:
        return cost + traversal(first)
    return cost


def binary_cost(op: str, left: int, right: int, traverses: bool) -> int:
    """An operator's own cost from its operands' sizes (1 for a scalar); ``traverses``: string or
    bytes ``+``, ``in`` a list (else O(1))."""
    if op in ("==", "!=", "<", "<=", ">", ">="):
        return traversal(min(left, right))
    if op == "in":
        return right if traverses else 1
    if op == "+" and traverses:
        return traversal(left + right)
    return 1


# Per-iteration cost of each comprehension besides its predicate (and transform): what cel-go's
# macro expansion (parser/macro.go) adds. all: the loop condition @not_strictly_false(__result__)
# (2) and the accumulator in `__result__ && p` (1); exists: @not_strictly_false(!__result__) (3)
# + 1; exists_one: `p ? __result__ + 1 : __result__` (2); map, filter, transformList:
# `__result__ + [x]` (accumulator 1, list 10, add 1; filter also reads x: 13);
# transformMap(Entry): cel.@mapInsert(__result__, k, v) (3; 2).
STEP_COST = {"all": 3, "exists": 4, "exists_one": 2, "existsOne": 2, "map": 12, "filter": 13, "transformList": 12, "transformMap": 3, "transformMapEntry": 2}
INIT_COST = {"map": 10, "filter": 10, "transformList": 10, "transformMap": 30, "transformMapEntry": 30}
"""The accumulator's first value: [] or {} (the others start from a literal: 0)."""
RESULT_COST = {"exists_one": 2, "existsOne": 2}
"""`__result__ == 1`; every other comprehension's result reads the accumulator (1)."""
BIND_COST = 10
"""cel.bind is a comprehension over an empty list: the list is built."""


def _bind(param: Type, arg: Type, binding: dict[str, Type]) -> bool:
    """Match an argument type against a parameter (with type parameter "A"; "*" takes any type)."""
    if param == "*":
        return True
    if param == "A":
        prior = binding.get("A")
        if prior is None or prior == "dyn":
            binding["A"] = arg
            return True
        if assignable(prior, arg):
            if arg != prior:
                binding["A"] = "dyn" if arg == "dyn" or prior != arg else prior
            return True
        return False
    if arg == "dyn":
        return True
    if isinstance(param, tuple):
        return isinstance(arg, tuple) and arg[0] == param[0] and all(_bind(p, a, binding) for p, a in zip(param[1:], arg[1:]))
    return param == arg


def _subst(t: Type, binding: dict[str, Type]) -> Type:
    if t == "A":
        return binding.get("A", "dyn")
    if isinstance(t, tuple):
        return (t[0], *(_subst(x, binding) for x in t[1:]))
    return t


class Checker:
    """Type and cost of every node; raises CheckError on the first problem."""

    def __init__(self) -> None:
        self.types: dict[int, Type] = {}  # id(node) -> static type, for the code generator

    def check(self, node: Node, scope: dict[str, Info]) -> Info:
        info = self._check(node, scope)
        self.types[id(node)] = info.type
        return info

    def _check(self, node: Node, scope: dict[str, Info]) -> Info:
        match node:
            case Lit(value, kind):
                size = len(value) if kind in ("string", "bytes") else 1
                return Info("null_type" if kind == "null" else kind, 0, size)
            case Ident(name):
                if name in scope:
                    var = scope[name]
                    return Info(var.type, 1, var.size, var.elem)
                if name == "device":
                    return Info("device", 1, 4)
                if name in TYPE_NAMES:
                    return Info("type", 1, 1)
                raise CheckError(f"undeclared reference to '{name}' (the only variable is 'device')")
            case Select(operand, field, optional):
                return _maybe_optional(self._select(operand, field, scope), optional)
            case Has(operand, field):
                inner = self._select(operand, field, scope)
                if inner.optional:
                    raise CheckError("has() cannot test an optional value: use .hasValue()")
                return Info("bool", inner.info.cost, 1)
            case Index(operand, index, optional):
                return _maybe_optional(self._index(operand, index, scope), optional)
            case Call():
                return self._call(node, scope)
            case Unary(op, operand):
                x = self.check(operand, scope)
                want = ("bool",) if op == "!" else ("int", "double")
                if x.type != "dyn" and x.type not in want:
                    raise CheckError(f"found no matching overload for '{op}_' applied to '({type_str(x.type)})'")
                return Info(x.type if x.type != "dyn" else ("bool" if op == "!" else "dyn"), x.cost + 1, 1)
            case Binary(op, left, right):
                return self._binary(op, self.check(left, scope), self.check(right, scope))
            case Cond(c, t, o):
                ci, ti, oi = self.check(c, scope), self.check(t, scope), self.check(o, scope)
                if ci.type not in ("bool", "dyn"):
                    raise CheckError(f"the condition of '_?_:_' must be bool, not {type_str(ci.type)}")
                if not assignable(ti.type, oi.type):
                    raise CheckError(f"found no matching overload for '_?_:_' applied to '(bool, {type_str(ti.type)}, {type_str(oi.type)})'")
                return Info(join(ti.type, oi.type), ci.cost + max(ti.cost, oi.cost), max(ti.size, oi.size))
            case ListLit(items):
                infos = [self.check(i, scope) for i in items]
                elem: Type | None = None
                for i in infos:
                    elem = _homogeneous(elem, i.type)
                return Info(("list", elem or "dyn"), 10 + sum(i.cost for i in infos), len(items), max((i.size for i in infos), default=0))
            case MapLit(entries):
                cost, key, val, key_size = 30, None, None, 0
                for k, v in entries:
                    ki, vi = self.check(k, scope), self.check(v, scope)
                    key_size = max(key_size, ki.size)
                    if ki.type not in ("string", "int", "uint", "bool", "dyn"):
                        raise CheckError(f"unsupported map key type: {type_str(ki.type)}")
                    key, val = _homogeneous(key, ki.type), _homogeneous(val, vi.type)
                    cost += ki.cost + vi.cost
                return Info(("map", key or "dyn", val or "dyn"), cost, len(entries), key_size)
            case Comp():
                return self._comprehension(node, scope)
            case Bind(var, init, body):
                ii = self.check(init, scope)
                bi = self.check(body, {**scope, var: ii})
                return Info(bi.type, BIND_COST + ii.cost + bi.cost, bi.size)
        raise CheckError(f"unsupported expression {node!r}")

    def _select(self, operand: Node, field: str, scope: dict[str, Info]) -> _Access:
        x = self.check(operand, scope)
        if _is_optional(x.type):  # selection on an optional value stays optional
            return _Access(self._select_on(Info(x.type[1], x.cost, x.size), field), True)
        return _Access(self._select_on(x, field), False)

    def _select_on(self, x: Info, field: str) -> Info:
        t = x.type
        if t == "device":
            if field not in DEVICE_FIELDS:
                raise CheckError(f"undefined field '{field}' (device has: {', '.join(sorted(DEVICE_FIELDS))})")
            ft, size = DEVICE_FIELDS[field]
            return Info(ft, x.cost + 1, size)
        if isinstance(t, tuple) and t[0] == "map":
            if t[1] not in ("string", "dyn"):
                raise CheckError(f"type '{type_str(t)}' does not support field selection")
            return Info(t[2], x.cost + 1, _elem_size(t[2]))
        if t == "dyn":
            return Info("dyn", x.cost + 1, ATTRIBUTE_MAX_LENGTH)
        raise CheckError(f"type '{type_str(t)}' does not support field selection")

    def _index(self, operand: Node, index: Node, scope: dict[str, Info]) -> _Access:
        x, i = self.check(operand, scope), self.check(index, scope)
        if _is_optional(x.type):
            return _Access(self._index_on(Info(x.type[1], x.cost, x.size), i), True)
        return _Access(self._index_on(x, i), False)

    def _index_on(self, x: Info, i: Info) -> Info:
        t = x.type
        cost = x.cost + i.cost + 1
        if isinstance(t, tuple) and t[0] == "list":
            if i.type not in ("int", "uint", "dyn"):
                raise CheckError(f"found no matching overload for '_[_]' applied to '({type_str(t)}, {type_str(i.type)})'")
            return Info(t[1], cost, _elem_size(t[1]))
        if isinstance(t, tuple) and t[0] == "map":
            if not assignable(t[1], i.type):
                raise CheckError(f"found no matching overload for '_[_]' applied to '({type_str(t)}, {type_str(i.type)})'")
            return Info(t[2], cost, _elem_size(t[2]))
        if t == "dyn":
            return Info("dyn", cost, ATTRIBUTE_MAX_LENGTH)
        raise CheckError(f"found no matching overload for '_[_]' applied to '({type_str(t)}, {type_str(i.type)})'")

    def _call(self, node: Call, scope: dict[str, Info]) -> Info:
        name, target = node.name, node.target
        if isinstance(target, Ident) and target.name in NAMESPACES and target.name not in scope:
            name, target = f"{target.name}.{name}", None
        overloads = FUNCTIONS.get(name)
        if overloads is None:
            raise CheckError(f"undeclared reference to '{name}'")
        recv = self.check(target, scope) if target is not None else None
        args = [self.check(a, scope) for a in node.args]
        matched: list[Type] = []
        for receiver, params, result in overloads:
            if len(params) != len(args):
                continue
            binding: dict[str, Type] = {}
            if receiver is None:
                if recv is not None:
                    continue
            elif recv is None or not _bind(receiver, recv.type, binding):
                continue
            if all(_bind(p, a.type, binding) for p, a in zip(params, args)):
                matched.append(_subst(result, binding))
        if not matched:
            shown = ", ".join(type_str(a.type) for a in ([recv] if recv else []) + args)
            kind = "member " if recv is not None else ""
            raise CheckError(f"found no matching overload for {kind}'{name}' applied to '({shown})'")
        if name in ("matches", "find", "findAll"):
            pattern_node = node.args[-1] if name == "matches" and target is None else node.args[0]
            if isinstance(pattern_node, Lit) and pattern_node.kind == "string":
                try:  # Kubernetes compiles literal patterns when it builds the program
                    compile_regex(pattern_node.value)
                except LibraryError as e:
                    raise CheckError(str(e)) from None
        result_type = matched[0] if all(m == matched[0] for m in matched) else "dyn"
        values = ([recv] if recv else []) + args
        first = values[0] if values else None
        cost = (recv.cost if recv else 0) + sum(a.cost for a in args)
        cost += call_cost(name, [v.size for v in values], first is not None and _is_list(first.type))
        size = 1
        if name in ("split", "findAll", "replace", "lowerAscii", "upperAscii", "trim", "substring", "join") and (first is not None):
            size = first.size
            if name == "replace" and len(args) >= 2:
                size = first.size * max(1, args[1].size)
        return Info(result_type, cost, size)

    def _binary(self, op: str, left: Info, right: Info) -> Info:
        lt, rt = left.type, right.type
        cost = left.cost + right.cost  # plus the operator's own (`binary_cost`, the same formula at run time)

        def fail() -> CheckError:
            return CheckError(f"found no matching overload for '_{op}_' applied to '({type_str(lt)}, {type_str(rt)})'")

        if op in ("&&", "||"):
            for t in (lt, rt):
                if t not in ("bool", "dyn"):
                    raise fail()
            return Info("bool", cost, 1)
        if op in ("==", "!="):
            if not assignable(lt, rt):
                raise fail()
            return Info("bool", cost + binary_cost(op, left.size, right.size, False), 1)
        if op in ("<", "<=", ">", ">="):
            ok = (
                (lt == "dyn" and rt in ("dyn", *ORDERED))
                or (rt == "dyn" and lt in ORDERED)
                or (lt in NUMERIC and rt in NUMERIC)
                or (lt == rt and lt in ORDERED)
            )
            if not ok:
                raise fail()
            return Info("bool", cost + binary_cost(op, left.size, right.size, False), 1)
        if op == "in":
            if rt == "dyn" or (isinstance(rt, tuple) and assignable(lt, rt[1])):
                return Info("bool", cost + binary_cost(op, left.size, right.size, rt == "dyn" or rt[0] == "list"), 1)
            raise fail()
        if op == "+":
            addable = ("dyn", *NUMERIC, "string", "bytes")
            if (lt == "dyn" and (rt in addable or _is_list(rt))) or (rt == "dyn" and (lt in addable or _is_list(lt))):
                return Info("dyn", cost + binary_cost(op, left.size, right.size, True), left.size + right.size)
            if lt == rt and lt in (*NUMERIC, "string", "bytes"):
                text = lt in ("string", "bytes")
                return Info(lt, cost + binary_cost(op, left.size, right.size, text), left.size + right.size if text else 1)
            if isinstance(lt, tuple) and isinstance(rt, tuple) and lt[0] == rt[0] == "list":
                return Info(("list", join(lt[1], rt[1])), cost + 1, left.size + right.size)  # O(1) in cel-go
            raise fail()
        cost += 1
        if op in ("-", "*", "/", "%"):
            allowed = ("int", "uint") if op == "%" else NUMERIC
            if lt in ("dyn", *allowed) and rt in ("dyn", *allowed) and (lt == rt or "dyn" in (lt, rt)):
                return Info(lt if lt != "dyn" else rt, cost, 1)
            raise fail()
        raise fail()

    def _comprehension(self, node: Comp, scope: dict[str, Info]) -> Info:
        r = self.check(node.range, scope)
        t = r.type
        if node.var2 is not None:
            return self._two_variables(node, node.var2, r, scope)
        if isinstance(t, tuple) and t[0] in ("list", "map"):
            var_type = t[1]
        elif t == "dyn":
            var_type = "dyn"
        else:
            raise CheckError(f"expression of type '{type_str(t)}' cannot be the range of a comprehension (must be a list, a map, or dynamic)")
        size = r.elem if r.elem is not None else (_elem_size(var_type) if t != "dyn" else ATTRIBUTE_MAX_LENGTH)
        inner = {**scope, node.var: Info(var_type, 1, size)}
        p = self.check(node.pred, inner)
        n = r.size
        step = p.cost + STEP_COST[node.kind]
        if node.kind == "map" and node.transform is None:
            result: Type = ("list", p.type)
        else:
            if p.type not in ("bool", "dyn"):
                what = "filter" if node.kind == "map" else node.kind
                raise CheckError(f"the predicate of {what}() must be bool, not {type_str(p.type)}")
            result = "bool"
            if node.kind == "filter":
                result = ("list", var_type)
            if node.transform is not None:
                ti = self.check(node.transform, inner)
                step += ti.cost
                result = ("list", ti.type)
        return Info(result, _loop_cost(node.kind, r.cost, n, step), n if isinstance(result, tuple) else 1)

    def _two_variables(self, node: Comp, var2: str, r: Info, scope: dict[str, Info]) -> Info:
        t = r.type
        key_type: Type
        value_type: Type
        if isinstance(t, tuple) and t[0] == "list":
            key_type, value_type = "int", t[1]
        elif isinstance(t, tuple) and t[0] == "map":
            key_type, value_type = t[1], t[2]
        elif t == "dyn":
            key_type = value_type = "dyn"
        else:
            raise CheckError(f"expression of type '{type_str(t)}' cannot be the range of a comprehension (must be a list, a map, or dynamic)")
        list_range = isinstance(t, tuple) and t[0] == "list"
        key_size = r.elem if r.elem is not None and not list_range else _elem_size(key_type)
        value_size = r.elem if r.elem is not None and list_range else _elem_size(value_type)
        inner = {**scope, node.var: Info(key_type, 1, key_size), var2: Info(value_type, 1, value_size)}
        first = self.check(node.pred, inner)
        n, step = r.size, first.cost + STEP_COST[node.kind]
        transformed = first
        if (node.kind in ("all", "exists", "existsOne") or node.transform is not None) and first.type not in ("bool", "dyn"):
            raise CheckError(f"the predicate of {node.kind}() must be bool, not {type_str(first.type)}")
        if node.transform is not None:
            transformed = self.check(node.transform, inner)
            step += transformed.cost
        if node.kind in ("all", "exists", "existsOne"):
            return Info("bool", _loop_cost(node.kind, r.cost, n, step), 1)
        if node.kind == "transformList":
            result: Type = ("list", transformed.type)
        elif node.kind == "transformMap":
            result = ("map", key_type, transformed.type)
        else:  # transformMapEntry: the transform makes one-entry maps that are merged
            if not (transformed.type == "dyn" or (isinstance(transformed.type, tuple) and transformed.type[0] == "map")):
                raise CheckError(f"transformMapEntry() must produce a map, not {type_str(transformed.type)}")
            result = transformed.type
        return Info(result, _loop_cost(node.kind, r.cost, n, step), n)


def _loop_cost(kind: str, range_cost: int, n: int, step: int) -> int:
    """cel-go's comprehension: its range, the accumulator's first value and its result once,
    and the loop condition and step (predicate included) per element."""
    return range_cost + INIT_COST.get(kind, 0) + RESULT_COST.get(kind, 1) + n * step


@dataclass(frozen=True, slots=True)
class _Access:
    info: Info
    optional: bool  # the operand was optional: the result is too


def _is_optional(t: Type) -> bool:
    return isinstance(t, tuple) and t[0] == "optional"


def _maybe_optional(access: _Access, optional_syntax: bool) -> Info:
    """x.?f and x[?k], or any selection on an optional, give optional(T)."""
    info = access.info
    if access.optional or optional_syntax:
        return Info(("optional", info.type), info.cost, info.size)
    return info


def _homogeneous(previous: Type | None, current: Type) -> Type:
    """Kubernetes enables HomogeneousAggregateLiterals: one type per list/map literal
    (dyn is compatible with anything; the more general type wins)."""
    if previous is None:
        return current
    if not assignable(previous, current):
        raise CheckError(f"expected type '{type_str(previous)}' but found '{type_str(current)}' (list and map literals hold one type)")
    return "dyn" if "dyn" in (previous, current) else previous


def _is_list(t: Type) -> bool:
    return isinstance(t, tuple) and t[0] == "list"


def _elem_size(t: Type) -> int:
    if isinstance(t, tuple):
        return MAX_ELEMENTS
    if t in ("string", "bytes", "dyn"):
        return ATTRIBUTE_MAX_LENGTH
    return 1
