"""Explain misuse of the DRA CEL environment and suggest a corrected expression.

Selectors written from blog posts or for older APIs make the same few
mistakes; each rule here recognises one pattern on the AST (never a specific
expression) and rewrites it:

- a driver compared with an extended-resource name ("nvidia.com/gpu"): driver
  names are DNS names ("gpu.nvidia.com");
- ``device.attributes['memory']``: the outer map is keyed by domain, an
  unqualified name lives under the driver's domain;
- typed-value fields from the YAML form (``.quantity``, ``.value``,
  ``.boolean``, ``.int``, ``.string``, ``.version``): CEL sees the value itself;
  a quantity is a capacity, not an attribute;
- ``<``/``>=`` on quantities: they compare with ``compareTo``/``isGreaterThan``;
- ``driver``/``attributes``/``capacity`` without ``device.``;
- ``q.sign()``: Kubernetes declares ``sign`` as a global function only.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import TypeGuard

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
    children,
    map_children,
    parse,
)

_DNS = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*\Z")
_RESOURCE_NAME = re.compile(r"([a-z0-9.-]+\.[a-z]+)/([a-z0-9.-]+)\Z")
_VALUE_FIELDS = {
    "quantity": "capacity",
    "value": "capacity",
    "boolean": "attributes",
    "bool": "attributes",
    "int": "attributes",
    "integer": "attributes",
    "string": "attributes",
    "version": "attributes",
}
_DEVICE_FIELDS = ("driver", "attributes", "capacity", "allowMultipleAllocations")
_RELATIONS = ("<", "<=", ">", ">=")
PLACEHOLDER = "<driver>"


def _is_device_field(node: Node, *fields: str) -> TypeGuard[Select]:
    return isinstance(node, Select) and isinstance(node.operand, Ident) and node.operand.name == "device" and (node.field in fields)


def _driver_literals(node: Node) -> list[Lit]:
    """String literals the expression compares device.driver with."""
    found: list[Lit] = []

    def visit(n: Node) -> None:
        if isinstance(n, Binary) and n.op in ("==", "!=", "in"):
            sides = (n.left, n.right)
            if any(_is_device_field(s, "driver") or (isinstance(s, Ident) and s.name == "driver") for s in sides):
                for s in sides:
                    if isinstance(s, Lit) and s.kind == "string":
                        found.append(s)
                    if isinstance(s, ListLit):
                        found.extend(i for i in s.items if isinstance(i, Lit) and i.kind == "string")
        for child in children(n):
            visit(child)

    visit(node)
    return found


def _fix_driver(name: str) -> str | None:
    if _DNS.match(name):
        return None
    m = _RESOURCE_NAME.match(name.lower())
    if m:
        return f"{m.group(2)}.{m.group(1)}"  # nvidia.com/gpu -> gpu.nvidia.com
    return None


class _Fixer:
    def __init__(self, quote: str):
        self.problems: list[str] = []
        self.quote = quote
        self.placeholder = False
        self.driver = PLACEHOLDER

    def note(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def show(self, node: Node) -> str:
        return pretty(node, self.quote)

    def run(self, ast: Node) -> Node:
        for lit in _driver_literals(ast):
            fixed = _fix_driver(lit.value)
            if fixed is not None:
                self.driver = fixed
                break
            if _DNS.match(lit.value):
                self.driver = lit.value
                break
        return self.fix(ast)

    def domain(self) -> Lit:
        if self.driver == PLACEHOLDER:
            self.placeholder = True
        return Lit(self.driver, "string")

    def fix(self, n: Node) -> Node:
        f = self.fix
        match n:
            case Ident(name) if name in _DEVICE_FIELDS:
                fixed: Node = Select(Ident("device"), name)
                self.note(f"'{name}' is not a variable: the selector's input is 'device', use {self.show(fixed)}")
                return fixed
            case Binary(op, left, right) if op in ("==", "!=", "in"):
                left, right = f(left), f(right)
                if _is_device_field(left, "driver") or _is_device_field(right, "driver"):
                    left, right = self._driver_side(left), self._driver_side(right)
                return self._quantity_relation(Binary(op, left, right))
            case Binary(op, left, right):
                return self._quantity_relation(Binary(op, f(left), f(right)))
            case Call("sign", (), target) if target is not None:
                fixed = Call("sign", (f(target),))
                self.note(f"sign is a function, not a method (despite the library's documentation): use {self.show(fixed)}")
                return fixed
            case Select(operand, field, False) if field in _VALUE_FIELDS and self._is_value(operand):
                inner = f(operand)
                if _VALUE_FIELDS[field] == "capacity":
                    inner = self._to_capacity(inner)
                    self.note(f"attribute and capacity values have no '.{field}' field; a quantity is a device capacity: use {self.show(inner)}")
                else:
                    self.note(f"attribute values are typed values with no '.{field}' field: use {self.show(inner)}")
                return inner
            case Index(outer, Lit(key, "string"), False) if self._outer(outer) and "." not in key:
                fixed = Select(Index(outer, self.domain()), key)
                self.note(f"device.{outer.field} is keyed by domain: use {self.show(fixed)} (an unqualified name belongs to the driver's domain)")
                return fixed
            case Select(outer, field, False) if self._outer(outer) and field not in _VALUE_FIELDS:
                fixed = Select(Index(outer, self.domain()), field)
                self.note(f"device.{outer.field} is keyed by domain: use {self.show(fixed)}")
                return fixed
        return map_children(n, f)

    @staticmethod
    def _outer(n: Node) -> TypeGuard[Select]:
        return _is_device_field(n, "attributes", "capacity")

    def _is_value(self, n: Node) -> bool:
        """An attribute or capacity value: device.X[...][...] or device.X['name'] (a misused domain)."""
        if isinstance(n, (Select, Index)):
            inner = n.operand
            if isinstance(inner, Index) and self._outer(inner.operand):
                return True
            if self._outer(inner):
                return True
        return False

    def _to_capacity(self, n: Node) -> Node:
        if isinstance(n, Select) and isinstance(n.operand, Index) and _is_device_field(n.operand.operand, "attributes"):
            return Select(Index(Select(Ident("device"), "capacity"), n.operand.index), n.field)
        return n

    def _driver_side(self, n: Node) -> Node:
        if isinstance(n, Lit) and n.kind == "string":
            fixed = _fix_driver(n.value)
            if fixed is not None:
                self.note(
                    f"driver names are DNS names such as {fixed}, not resource names like {n.value!r}: use device.driver == {self.show(Lit(fixed, 'string'))}"
                )
                return Lit(fixed, "string")
        if isinstance(n, ListLit):
            return ListLit(tuple(self._driver_side(i) for i in n.items))
        return n

    def _quantity_relation(self, n: Binary) -> Node:
        if n.op not in _RELATIONS or not (_is_quantity(n.left) or _is_quantity(n.right)):
            return n
        fixed = Binary(n.op, Call("compareTo", (n.right,), n.left), Lit(0, "int"))
        self.note(f"capacity is compared with quantity methods: {self.show(fixed)}")
        return fixed


def _is_quantity(n: Node) -> bool:
    if isinstance(n, Call) and n.name in ("quantity", "add", "sub"):
        return True
    return isinstance(n, (Select, Index)) and isinstance(n.operand, Index) and _is_device_field(n.operand.operand, "capacity")


# --- printing people can read (minimal parentheses) ---------------------------------------

_PREC = {"||": 1, "&&": 2, "==": 3, "!=": 3, "<": 3, "<=": 3, ">": 3, ">=": 3, "in": 3, "+": 4, "-": 4, "*": 5, "/": 5, "%": 5}


def pretty(n: Node, quote: str = '"') -> str:
    def p(x: Node, need: int = 0) -> str:
        text, prec = _pretty(x)
        return f"({text})" if prec < need else text

    def _pretty(x: Node) -> tuple[str, int]:
        match x:
            case Lit(value, "string"):
                body = value.replace("\\", "\\\\").replace(quote, "\\" + quote)
                return f"{quote}{body}{quote}", 9
            case Lit() | Ident():
                from .cel_syntax import unparse

                return unparse(x), 9
            case Select(o, field, optional):
                return f"{p(o, 8)}.{'?' if optional else ''}{field}", 8
            case Has(o, field):
                return f"has({p(o, 8)}.{field})", 9
            case Index(o, i, optional):
                return f"{p(o, 8)}[{'?' if optional else ''}{p(i)}]", 8
            case Call(name, args, target):
                inner = ", ".join(p(a) for a in args)
                return (f"{p(target, 8)}.{name}({inner})" if target is not None else f"{name}({inner})"), 8
            case Unary(op, o):
                return f"{op}{p(o, 7)}", 7
            case Binary(op, l, r):
                prec = _PREC[op]
                return f"{p(l, prec)} {op} {p(r, prec + 1)}", prec
            case Cond(c, t, o):
                return f"{p(c, 1)} ? {p(t, 1)} : {p(o)}", 0
            case ListLit(items):
                return "[" + ", ".join(p(i) for i in items) + "]", 9
            case MapLit(entries):
                return "{" + ", ".join(f"{p(k)}: {p(v)}" for k, v in entries) + "}", 9
            case Comp(kind, r, var, pred, t, var2):
                extra = f", {p(t)}" if t is not None else ""
                names = f"{var}, {var2}" if var2 is not None else var
                return f"{p(r, 8)}.{kind}({names}, {p(pred)}{extra})", 8
            case Bind(var, i, b):
                return f"cel.bind({var}, {p(i)}, {p(b)})", 9
        raise TypeError(f"not a CEL node: {x!r}")

    return p(n)


def diagnose(expression: str, compile_check: Callable[[str], object]) -> list[str]:
    """Problems a person can act on, then ``suggested expression: ...`` when one is known."""
    try:
        ast = parse(expression)
    except CelSyntaxError as e:
        return [f"syntax error at column {e.pos + 1}: {e}"]
    except RecursionError:
        return ["the expression is nested too deeply"]
    problems: list[str] = []
    try:
        compile_check(expression)
    except Exception as e:  # noqa: BLE001 - CelCompileError; kept generic to avoid an import cycle
        from .cel import shown  # errors name the expression as shown() cuts it

        problems.append(f"does not compile: {str(e).removeprefix(shown(expression) + ': ')}")
    quote = "'" if expression.count("'") > expression.count('"') else '"'
    fixer = _Fixer(quote)
    fixed = fixer.run(ast)
    problems += fixer.problems
    if fixer.problems:
        suggestion = pretty(fixed, quote)
        if fixer.placeholder:
            problems.append(f"replace {PLACEHOLDER} with the driver's name (a DNS name such as gpu.nvidia.com): {suggestion}")
        else:
            try:
                compile_check(suggestion)
            except Exception:  # noqa: BLE001 - no suggestion when it would not compile either
                pass
            else:
                problems.append(f"suggested expression: {suggestion}")
    return problems
