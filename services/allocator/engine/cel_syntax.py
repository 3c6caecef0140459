"""CEL syntax: a small lexer and recursive-descent parser producing an AST.

dralloc needs the expression's structure (not just a verdict) to type-check it
against the Kubernetes device environment, estimate its cost, rewrite it for
the fast evaluator and explain misuse to people, so it parses CEL itself.
The grammar is the CEL spec's; macros (has, all, exists, exists_one, map,
filter, cel.bind) become ``Comp``/``Has``/``Bind`` nodes here, as in cel-go.
Optional selection (``x.?f``, ``x[?k]``) is parsed; message construction
(``Foo{a: 1}``) and optional list/map elements (``[?x]``, ``{?k: v}``) have no
use in a device selector and are rejected with a clear message.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAX_DEPTH = 250  # cel-go's default parser recursion limit


class CelSyntaxError(ValueError):
    def __init__(self, message: str, pos: int):
        super().__init__(message)
        self.pos = pos


# --- AST ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Lit:
    value: Any
    kind: str  # int uint double string bytes bool null


@dataclass(frozen=True, slots=True)
class Ident:
    name: str


@dataclass(frozen=True, slots=True)
class Select:
    operand: Node
    field: str
    optional: bool = False  # x.?field (cel-go optional types)


@dataclass(frozen=True, slots=True)
class Has:
    operand: Node
    field: str


@dataclass(frozen=True, slots=True)
class Index:
    operand: Node
    index: Node
    optional: bool = False  # x[?index]


@dataclass(frozen=True, slots=True)
class Call:
    name: str  # "size", "startsWith", "_+_"-style operators are Binary/Unary instead
    args: tuple[Node, ...]
    target: Node | None = None  # receiver of a member call


@dataclass(frozen=True, slots=True)
class Unary:
    op: str  # "!" or "-"
    operand: Node


@dataclass(frozen=True, slots=True)
class Binary:
    op: str  # || && == != < <= > >= in + - * / %
    left: Node
    right: Node


@dataclass(frozen=True, slots=True)
class Cond:
    cond: Node
    then: Node
    other: Node


@dataclass(frozen=True, slots=True)
class ListLit:
    items: tuple[Node, ...]


@dataclass(frozen=True, slots=True)
class MapLit:
    entries: tuple[tuple[Node, Node], ...]


@dataclass(frozen=True, slots=True)
class Comp:
    # all exists exists_one map filter; with two variables (cel-go ext.TwoVarComprehensions):
    # all exists existsOne transformList transformMap transformMapEntry
    kind: str
    range: Node
    var: str
    pred: Node  # with a filter: the filter; else the predicate / transform
    transform: Node | None = None  # map(x, filter, transform), transformList(i, v, filter, t)
    var2: str | None = None  # the value variable of a two-variable comprehension


@dataclass(frozen=True, slots=True)
class Bind:
    var: str
    init: Node
    body: Node


Node = Lit | Ident | Select | Has | Index | Call | Unary | Binary | Cond | ListLit | MapLit | Comp | Bind


def children(n: Node) -> list[Node]:
    """The direct subexpressions of `n`, in source order."""
    match n:
        case Select(o, _) | Has(o, _) | Unary(_, o):
            return [o]
        case Index(o, i):
            return [o, i]
        case Call(_, args, target):
            return ([target] if target is not None else []) + list(args)
        case Binary(_, l, r):
            return [l, r]
        case Cond(c, t, o):
            return [c, t, o]
        case ListLit(items):
            return list(items)
        case MapLit(entries):
            return [x for kv in entries for x in kv]
        case Comp(_, r, _, p, t):
            return [r, p] + ([t] if t is not None else [])
        case Bind(_, i, b):
            return [i, b]
    return []


def map_children(n: Node, f: Callable[[Node], Node]) -> Node:
    """`n` with `f` applied to each direct subexpression (`n` itself when it has none)."""
    match n:
        case Select(o, field, optional):
            return Select(f(o), field, optional)
        case Has(o, field):
            return Has(f(o), field)
        case Unary(op, o):
            return Unary(op, f(o))
        case Index(o, i, optional):
            return Index(f(o), f(i), optional)
        case Call(name, args, target):
            return Call(name, tuple(f(a) for a in args), f(target) if target is not None else None)
        case Binary(op, l, r):
            return Binary(op, f(l), f(r))
        case Cond(c, t, o):
            return Cond(f(c), f(t), f(o))
        case ListLit(items):
            return ListLit(tuple(f(i) for i in items))
        case MapLit(entries):
            return MapLit(tuple((f(k), f(v)) for k, v in entries))
        case Comp(kind, r, var, p, t, var2):
            return Comp(kind, f(r), var, f(p), f(t) if t is not None else None, var2)
        case Bind(var, i, b):
            return Bind(var, f(i), f(b))
    return n


# --- lexer -------------------------------------------------------------------------

_TOKEN = re.compile(
    r"""
    (?P<ws>[\s]+|//[^\n]*)
  | (?P<float>(?:[0-9]+\.[0-9]+(?:[eE][+-]?[0-9]+)?|[0-9]+[eE][+-]?[0-9]+|\.[0-9]+(?:[eE][+-]?[0-9]+)?))
  | (?P<hex>0[xX][0-9a-fA-F]+[uU]?)
  | (?P<int>[0-9]+[uU]?)
  | (?P<string>[rR]?[bB]?[rR]?(?:\"\"\"(?:\\.|[^\\])*?\"\"\"|'''(?:\\.|[^\\])*?'''|"(?:\\.|[^"\\\n])*"|'(?:\\.|[^'\\\n])*'))
  | (?P<ident>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>\|\||&&|==|!=|<=|>=|[<>!+\-*/%?:.,()\[\]{}])
    """,
    re.X | re.S,
)
_RESERVED = {
    "as",
    "break",
    "const",
    "continue",
    "else",
    "for",
    "function",
    "if",
    "import",
    "let",
    "loop",
    "package",
    "namespace",
    "return",
    "var",
    "void",
    "while",
}
_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", "'": "'", '"': '"', "`": "`", "?": "?"}
_INT64 = (-(2**63), 2**63 - 1)


def _unescape(body: str, raw: bool, is_bytes: bool, pos: int) -> str | bytes:
    if raw:
        return body.encode() if is_bytes else body
    out: list[str] = []
    raw_bytes = bytearray()
    i = 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            raw_bytes += c.encode()
            i += 1
            continue
        nxt = body[i + 1] if i + 1 < len(body) else ""
        if nxt in _ESCAPES:
            out.append(_ESCAPES[nxt])
            raw_bytes += _ESCAPES[nxt].encode()
            i += 2
        elif nxt in "xX" and re.match(r"[0-9a-fA-F]{2}", body[i + 2 : i + 4]):
            v = int(body[i + 2 : i + 4], 16)
            out.append(chr(v))
            raw_bytes.append(v)
            i += 4
        elif nxt in "uU":
            n = 4 if nxt == "u" else 8
            hexd = body[i + 2 : i + 2 + n]
            if is_bytes or not re.fullmatch(rf"[0-9a-fA-F]{{{n}}}", hexd):
                raise CelSyntaxError("invalid unicode escape", pos)
            cp = int(hexd, 16)
            if cp > 0x10FFFF or 0xD800 <= cp <= 0xDFFF:
                raise CelSyntaxError("invalid unicode code point", pos)
            out.append(chr(cp))
            raw_bytes += chr(cp).encode()
            i += 2 + n
        elif nxt in "0123" and re.match(r"[0-7]{3}", body[i + 1 : i + 4]):
            v = int(body[i + 1 : i + 4], 8)
            out.append(chr(v))
            raw_bytes.append(v)
            i += 4
        else:
            raise CelSyntaxError(f"invalid escape sequence '\\{nxt}'", pos)
    return bytes(raw_bytes) if is_bytes else "".join(out)


def tokenize(text: str) -> list[tuple[str, Any, int]]:
    """Tokens as (kind, value, position); kind is an operator's text for operators."""
    tokens: list[tuple[str, Any, int]] = []
    pos = 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise CelSyntaxError(f"unexpected character {text[pos]!r}", pos)
        kind, lexeme = m.lastgroup, m.group()
        if kind == "ws":
            pass
        elif kind == "float":
            tokens.append(("lit", Lit(float(lexeme), "double"), pos))
        elif kind in ("int", "hex"):
            unsigned = lexeme[-1] in "uU"
            digits = lexeme[:-1] if unsigned else lexeme
            number = int(digits, 16 if kind == "hex" else 10)
            limit = 2**64 - 1 if unsigned else 2**63  # 2**63 only legal after unary minus
            if number > limit:
                raise CelSyntaxError(f"integer literal {lexeme} out of range", pos)
            tokens.append(("lit", Lit(number, "uint" if unsigned else "int"), pos))
        elif kind == "string":
            prefix = lexeme[: len(lexeme) - len(lexeme.lstrip("rRbB"))]
            raw, is_bytes = "r" in prefix.lower(), "b" in prefix.lower()
            body = lexeme[len(prefix) :]
            q = 3 if body[:3] in ('"""', "'''") else 1
            value = _unescape(body[q:-q], raw, is_bytes, pos)
            tokens.append(("lit", Lit(value, "bytes" if is_bytes else "string"), pos))
        elif kind == "ident":
            if lexeme == "in":
                tokens.append(("in", "in", pos))
            elif lexeme in ("true", "false"):
                tokens.append(("lit", Lit(lexeme == "true", "bool"), pos))
            elif lexeme == "null":
                tokens.append(("lit", Lit(None, "null"), pos))
            elif lexeme in _RESERVED:
                raise CelSyntaxError(f"reserved identifier '{lexeme}'", pos)
            else:
                tokens.append(("ident", lexeme, pos))
        else:
            tokens.append((lexeme, lexeme, pos))
        pos = m.end()
    tokens.append(("eof", None, len(text)))
    return tokens


# --- parser ------------------------------------------------------------------------

_RELATIONS = {"<", "<=", ">", ">=", "==", "!=", "in"}
_MACROS = {"all": 2, "exists": 2, "exists_one": 2, "filter": 2}
_TWO_VAR = {"all": (3,), "exists": (3,), "existsOne": (3,), "transformList": (3, 4), "transformMap": (3, 4), "transformMapEntry": (3, 4)}


class _Parser:
    def __init__(self, text: str):
        self.toks = tokenize(text)
        self.i = 0
        self.depth = 0

    def peek(self, ahead: int = 0) -> tuple[str, Any, int]:
        return self.toks[min(self.i + ahead, len(self.toks) - 1)]

    def take(self, kind: str) -> tuple[str, Any, int]:
        tok = self.peek()
        if tok[0] != kind:
            found = "end of expression" if tok[0] == "eof" else repr(tok[1] if tok[0] != "lit" else "literal")
            raise CelSyntaxError(f"expected {kind!r}, found {found}", tok[2])
        self.i += 1
        return tok

    def accept(self, kind: str) -> bool:
        if self.peek()[0] == kind:
            self.i += 1
            return True
        return False

    def parse(self) -> Node:
        node = self.expr()
        tok = self.peek()
        if tok[0] != "eof":
            raise CelSyntaxError(f"unexpected {tok[1]!r} after a complete expression", tok[2])
        return node

    def expr(self) -> Node:
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise CelSyntaxError(f"expression nested more than {MAX_DEPTH} levels deep", self.peek()[2])
        try:
            cond = self.binary(0)
            if self.accept("?"):
                then = self.binary(0)
                self.take(":")
                return Cond(cond, then, self.expr())
            return cond
        finally:
            self.depth -= 1

    _LEVELS = (("||",), ("&&",), tuple(_RELATIONS), ("+", "-"), ("*", "/", "%"))

    def binary(self, level: int) -> Node:
        if level == len(self._LEVELS):
            return self.unary()
        node = self.binary(level + 1)
        ops = self._LEVELS[level]
        while self.peek()[0] in ops:
            op = self.peek()[1]
            self.i += 1
            node = Binary(op, node, self.binary(level + 1))
        return node

    def unary(self) -> Node:
        tok = self.peek()
        if tok[0] in ("!", "-"):
            ops = []
            while self.peek()[0] == tok[0]:
                ops.append(self.take(tok[0]))
            if tok[0] == "-" and self.peek()[0] == "lit" and self.peek()[1].kind in ("int", "double"):
                # fold "-<literal>" so that -9223372036854775808 is representable
                lit = self.take("lit")[1]
                node: Node = Lit(-lit.value, lit.kind)
                ops.pop()
                node = self.member_tail(node)
            else:
                node = self.member()
            for _ in ops:
                node = Unary(tok[0], node)
            return node
        return self.member()

    def member(self) -> Node:
        return self.member_tail(self.primary())

    def member_tail(self, node: Node) -> Node:
        if isinstance(node, Lit) and node.kind == "int" and node.value == 2**63:
            raise CelSyntaxError("integer literal out of range", self.peek()[2])
        while True:
            tok = self.peek()
            if tok[0] == ".":
                self.i += 1
                optional = self.accept("?")
                name = self.take("ident")[1]
                if not optional and self.accept("("):
                    node = self.member_call(node, name, self.args(")"), tok[2])
                else:
                    node = Select(node, name, optional)
            elif tok[0] == "[":
                self.i += 1
                optional = self.accept("?")
                node = Index(node, self.expr(), optional)
                self.take("]")
            elif tok[0] == "{" and isinstance(node, (Ident, Select)):
                raise CelSyntaxError("message construction is not supported in a device selector", tok[2])
            else:
                return node

    def member_call(self, target: Node, name: str, args: list[Node], pos: int) -> Node:
        if isinstance(target, Ident) and target.name == "cel" and name == "bind":
            if len(args) != 3 or not isinstance(args[0], Ident):
                raise CelSyntaxError("cel.bind(name, value, expression) takes an identifier and two expressions", pos)
            return Bind(args[0].name, args[1], args[2])
        # (every _TWO_VAR arity is at least 3, so args[1] exists)
        if name in _TWO_VAR and len(args) in _TWO_VAR[name] and isinstance(args[0], Ident) and isinstance(args[1], Ident):
            var, var2 = args[0].name, args[1].name
            if var == var2:
                raise CelSyntaxError(f"{name}() needs two different variable names", pos)
            if len(args) == 4:
                return Comp(name, target, var, args[2], args[3], var2)
            return Comp(name, target, var, args[2], None, var2)
        if name in _MACROS or name == "map":
            if not args or not isinstance(args[0], Ident):
                raise CelSyntaxError(f"{name}() needs an iteration variable name as its first argument", pos)
            want = (2, 3) if name == "map" else (_MACROS[name],)
            if len(args) not in want:
                raise CelSyntaxError(f"{name}() takes {' or '.join(map(str, want))} arguments, got {len(args)}", pos)
            var = args[0].name
            if name == "map" and len(args) == 3:
                return Comp("map", target, var, args[1], args[2])
            return Comp(name, target, var, args[1])
        return Call(name, tuple(args), target)

    def args(self, close: str) -> list[Node]:
        items: list[Node] = []
        while not self.accept(close):
            items.append(self.expr())
            if not self.accept(","):
                self.take(close)
                break
        return items

    def primary(self) -> Node:
        kind, value, pos = self.peek()
        if isinstance(value, Lit):  # only "lit" tokens carry a Lit
            self.i += 1
            return value
        if kind == ".":
            self.i += 1
            kind, value, pos = self.peek()
            if kind != "ident":
                raise CelSyntaxError("expected an identifier after a leading '.'", pos)
        if kind == "ident":
            self.i += 1
            if self.accept("("):
                args = self.args(")")
                if value == "has":
                    if len(args) != 1 or not isinstance(args[0], Select):
                        raise CelSyntaxError("has() needs a field selection such as has(a.b)", pos)
                    return Has(args[0].operand, args[0].field)
                return Call(value, tuple(args))
            return Ident(value)
        if kind == "(":
            self.i += 1
            node = self.expr()
            self.take(")")
            return node
        if kind == "[":
            self.i += 1
            if self.peek()[0] == "?":
                raise CelSyntaxError("optional list elements '[?x]' are not supported", self.peek()[2])
            return ListLit(tuple(self.args("]")))
        if kind == "{":
            self.i += 1
            entries: list[tuple[Node, Node]] = []
            while not self.accept("}"):
                if self.peek()[0] == "?":
                    raise CelSyntaxError("optional map entries '{?k: v}' are not supported", self.peek()[2])
                key = self.expr()
                self.take(":")
                entries.append((key, self.expr()))
                if not self.accept(","):
                    self.take("}")
                    break
            return MapLit(tuple(entries))
        found = "end of expression" if kind == "eof" else repr(value)
        raise CelSyntaxError(f"unexpected {found}", pos)


def parse(text: str) -> Node:
    """Parse CEL source into an AST; raises CelSyntaxError with a position."""
    return _Parser(text).parse()


def unparse(node: Node) -> str:
    """CEL source for an AST (fully parenthesised where precedence could matter)."""
    match node:
        case Lit(value, kind):
            return _literal(value, kind)
        case Ident(name):
            return name
        case Select(operand, field, optional):
            return f"{unparse(operand)}.{'?' if optional else ''}{field}"
        case Has(operand, field):
            return f"has({unparse(operand)}.{field})"
        case Index(operand, index, optional):
            return f"{unparse(operand)}[{'?' if optional else ''}{unparse(index)}]"
        case Call(name, args, target):
            inner = ", ".join(unparse(a) for a in args)
            return f"{unparse(target)}.{name}({inner})" if target is not None else f"{name}({inner})"
        case Unary(op, operand):
            return f"{op}({unparse(operand)})"
        case Binary(op, left, right):
            return f"({unparse(left)} {op} {unparse(right)})"
        case Cond(c, t, o):
            return f"({unparse(c)} ? {unparse(t)} : {unparse(o)})"
        case ListLit(items):
            return "[" + ", ".join(unparse(i) for i in items) + "]"
        case MapLit(entries):
            return "{" + ", ".join(f"{unparse(k)}: {unparse(v)}" for k, v in entries) + "}"
        case Comp(kind, rng, var, pred, transform, var2):
            extra = f", {unparse(transform)}" if transform is not None else ""
            names = f"{var}, {var2}" if var2 is not None else var
            return f"{unparse(rng)}.{kind}({names}, {unparse(pred)}{extra})"
        case Bind(var, init, body):
            return f"cel.bind({var}, {unparse(init)}, {unparse(body)})"
    raise TypeError(f"not a CEL node: {node!r}")


def _literal(value: Any, kind: str) -> str:
    if kind == "string":
        return '"' + "".join(_escape_char(c) for c in value) + '"'
    if kind == "bytes":
        return 'b"' + "".join(f"\\x{b:02x}" for b in value) + '"'
    if kind == "bool":
        return "true" if value else "false"
    if kind == "null":
        return "null"
    if kind == "uint":
        return f"{value}u"
    if kind == "double":
        text = repr(value)
        if text in ("inf", "-inf", "nan"):
            return {"inf": 'double("Infinity")', "-inf": 'double("-Infinity")', "nan": 'double("NaN")'}[text]
        return text if any(c in text for c in ".e") else text + ".0"
    return str(value)


def _escape_char(c: str) -> str:
    if c in '"\\':
        return "\\" + c
    if c.isprintable():
        return c
    return f"\\u{ord(c):04x}" if ord(c) < 0x10000 else f"\\U{ord(c):08x}"
