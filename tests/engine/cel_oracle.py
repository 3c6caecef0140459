"""An independent oracle for DRA CEL selectors, built on cel-python (``celpy``).

Nothing here comes from dralloc's engine: quantities are parsed with
``decimal``, versions with the semver.org regular expression, and the
Kubernetes environment (device map, unknown domain as empty map, the quantity
and semver libraries, the string/list/set extensions Kubernetes enables) is
configured on celpy from scratch. celpy lacks ``cel.bind`` and dotted
function names, so those are rewritten textually before compiling (a bound
name is replaced by its parenthesised value; ``sets.f`` by ``sets_f``).

``verdict(expression, driver, device)`` returns True, False or "error".
"""

from __future__ import annotations

import re
from decimal import ROUND_CEILING, Decimal, localcontext
from functools import total_ordering
from typing import Any

import celpy
from celpy import celtypes

# --- Kubernetes quantity -------------------------------------------------------------

_Q = re.compile(r"([+-]?)([0-9]+\.?[0-9]*|\.[0-9]+)(Ki|Mi|Gi|Ti|Pi|Ei|[numkMGTPE]|[eE][+-]?[0-9]+)?\Z")
_MULT = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal(10**3),
    "M": Decimal(10**6),
    "G": Decimal(10**9),
    "T": Decimal(10**12),
    "P": Decimal(10**15),
    "E": Decimal(10**18),
}
_MULT.update({s: Decimal(2 ** (10 * (i + 1))) for i, s in enumerate(["Ki", "Mi", "Gi", "Ti", "Pi", "Ei"])})


class OracleQuantity:
    """Exact value in nano-units (Kubernetes rounds finer values up, away from zero)."""

    def __init__(self, nano: int):
        self.nano = nano

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, OracleQuantity):
            raise TypeError("no such overload: Quantity == other type")
        return self.nano == other.nano

    __hash__ = None  # type: ignore[assignment]


def oracle_parse_quantity(text: str) -> OracleQuantity:
    m = _Q.match(text)
    if m is None:
        raise ValueError(f"bad quantity {text!r}")
    sign, num, suffix = m.groups()
    with localcontext() as ctx:
        ctx.prec = 200
        if suffix and suffix not in _MULT:  # an exponent such as e3 or E-2
            value = Decimal(num) * Decimal(10) ** int(suffix[1:])
        else:
            value = Decimal(num) * _MULT.get(suffix or "", Decimal(1))
        nano = int((value * Decimal(10**9)).to_integral_value(rounding=ROUND_CEILING))
        if suffix in ("Ki", "Mi", "Gi", "Ti", "Pi", "Ei"):
            nano = min(nano, (2**63 - 1) * 10**9)
    return OracleQuantity(-nano if sign == "-" else nano)


# --- semver ---------------------------------------------------------------------------

_SEMVER = re.compile(
    r"^(0|[1-9]\d*)\.(0|[1-9]\d*)\.(0|[1-9]\d*)"
    r"(?:-((?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*)(?:\.(?:0|[1-9]\d*|\d*[a-zA-Z-][0-9a-zA-Z-]*))*))?"
    r"(?:\+([0-9a-zA-Z-]+(?:\.[0-9a-zA-Z-]+)*))?$"
)


@total_ordering
class OracleSemver:
    def __init__(self, text: str):
        m = _SEMVER.match(text)
        if m is None:
            raise ValueError(f"bad semver {text!r}")
        self.nums = tuple(int(x) for x in m.group(1, 2, 3))
        self.pre = m.group(4).split(".") if m.group(4) else []

    def _key(self) -> tuple:
        pre = [(0, int(p), "") if p.isdigit() else (1, 0, p) for p in self.pre]
        return (self.nums, not self.pre, pre)

    def __eq__(self, other: Any) -> bool:
        if not isinstance(other, OracleSemver):
            raise TypeError("no such overload: Semver == other type")
        return self._key() == other._key()

    def __lt__(self, other: OracleSemver) -> bool:
        return self._key() < other._key()

    __hash__ = None  # type: ignore[assignment]


# --- library functions ------------------------------------------------------------------


def _b(x: bool) -> celtypes.BoolType:
    return celtypes.BoolType(bool(x))


def _cmp(a: Any, b: Any) -> int:
    if isinstance(a, OracleQuantity) and isinstance(b, OracleQuantity):
        return (a.nano > b.nano) - (a.nano < b.nano)
    if isinstance(a, OracleSemver) and isinstance(b, OracleSemver):
        return (a > b) - (a < b)
    raise TypeError("no such overload")


def _quantity_operand(x: Any) -> int:
    if isinstance(x, OracleQuantity):
        return x.nano
    if isinstance(x, celtypes.IntType):
        return int(x) * 10**9
    raise TypeError("no such overload")


def _as_int(q: OracleQuantity) -> int:
    if q.nano % 10**9 or not -(2**63) <= q.nano // 10**9 < 2**63:
        raise ValueError("cannot convert value to integer")
    return q.nano // 10**9


def _is_sv(s: str) -> bool:
    try:
        OracleSemver(s)
        return True
    except ValueError:
        return False


def _is_q(s: str) -> bool:
    try:
        oracle_parse_quantity(s)
        return True
    except ValueError:
        return False


def _same(a: Any, b: Any) -> bool:
    try:
        return bool(a == b) and type(a) is type(b)
    except TypeError:
        return False


def _list_index(items: Any, x: Any, last: bool) -> int:
    idx = [i for i, v in enumerate(items) if _same(v, x)]
    return (idx[-1] if last else idx[0]) if idx else -1


def _index_of(s: Any, sub: Any, *rest: Any) -> celtypes.IntType:
    if isinstance(s, celtypes.ListType):
        return celtypes.IntType(_list_index(s, sub, False))
    start = int(rest[0]) if rest else 0
    if start < 0 or start > len(s):
        raise ValueError("index out of range")
    return celtypes.IntType(str(s).find(str(sub), start))


def _last_index_of(s: Any, sub: Any, *rest: Any) -> celtypes.IntType:
    if isinstance(s, celtypes.ListType):
        return celtypes.IntType(_list_index(s, sub, True))
    if rest:
        return celtypes.IntType(str(s).rfind(str(sub), 0, int(rest[0]) + len(sub)))
    return celtypes.IntType(str(s).rfind(str(sub)))


def _split(s: Any, sep: Any, *rest: Any) -> celtypes.ListType:
    n = int(rest[0]) if rest else -1
    if n == 0:
        return celtypes.ListType([])
    parts = str(s).split(str(sep), n - 1) if n > 0 else str(s).split(str(sep))
    return celtypes.ListType([celtypes.StringType(p) for p in parts])


def _join(items: Any, *sep: Any) -> celtypes.StringType:
    return celtypes.StringType(str(sep[0] if sep else "").join(str(i) for i in items))


def _substring(s: Any, start: Any, *end: Any) -> celtypes.StringType:
    e = int(end[0]) if end else len(s)
    if not 0 <= int(start) <= e <= len(s):
        raise ValueError("substring out of range")
    return celtypes.StringType(str(s)[int(start) : e])


def _ordered(items: Any) -> list:
    values = list(items)
    kinds = {type(v) for v in values}
    if len(kinds) > 1:
        raise TypeError("no such overload: mixed list")
    return values


def _includes(target: Any, arg: Any) -> celtypes.BoolType:
    """KEP-5491 ``includes``: a list attribute contains the value, a scalar equals it; a value
    of another type is simply not included. Lists over 48 entries are an error."""
    if isinstance(target, celtypes.ListType):
        if len(target) > 48 and not any(_same(v, arg) for v in list(target)[:48]):
            raise ValueError("includes: list longer than 48 values")
        return _b(any(_same(v, arg) for v in target))
    return _b(_same(target, arg))


def _sets_contains(a: Any, b: Any) -> celtypes.BoolType:
    return _b(all(any(_same(x, y) for x in a) for y in b))


def _strings(fn: Any) -> Any:
    """String functions take strings only (celpy would stringify anything)."""

    def call(s: Any, *args: Any) -> Any:
        if not isinstance(s, celtypes.StringType) or not all(isinstance(a, (celtypes.StringType, celtypes.IntType)) for a in args):
            raise TypeError("no such overload")
        return fn(s, *args)

    return call


FUNCTIONS = {
    "quantity": lambda s: oracle_parse_quantity(str(s)),
    "isQuantity": lambda s: _b(_is_q(str(s))),
    "semver": lambda s: OracleSemver(str(s)),
    "isSemver": lambda s: _b(_is_sv(str(s))),
    "isGreaterThan": lambda a, b: _b(_cmp(a, b) > 0),
    "isLessThan": lambda a, b: _b(_cmp(a, b) < 0),
    "compareTo": lambda a, b: celtypes.IntType(_cmp(a, b)),
    "sign": lambda q: celtypes.IntType((q.nano > 0) - (q.nano < 0)),
    "isInteger": lambda q: _b(q.nano % 10**9 == 0 and -(2**63) <= q.nano // 10**9 < 2**63),
    "asInteger": lambda q: celtypes.IntType(_as_int(q)),
    "asApproximateFloat": lambda q: celtypes.DoubleType(q.nano / 1e9),
    "add": lambda q, x: OracleQuantity(q.nano + _quantity_operand(x)),
    "sub": lambda q, x: OracleQuantity(q.nano - _quantity_operand(x)),
    "major": lambda v: celtypes.IntType(v.nums[0]),
    "minor": lambda v: celtypes.IntType(v.nums[1]),
    "patch": lambda v: celtypes.IntType(v.nums[2]),
    "lowerAscii": _strings(lambda s: celtypes.StringType("".join(c.lower() if c.isascii() else c for c in str(s)))),
    "upperAscii": _strings(lambda s: celtypes.StringType("".join(c.upper() if c.isascii() else c for c in str(s)))),
    "trim": _strings(lambda s: celtypes.StringType(str(s).strip())),
    "replace": _strings(lambda s, a, b, *n: celtypes.StringType(str(s).replace(str(a), str(b), int(n[0]) if n else -1))),
    "split": _strings(_split),
    "join": _join,
    "includes": _includes,
    "indexOf": _index_of,
    "lastIndexOf": _last_index_of,
    "substring": _strings(_substring),
    "charAt": _strings(lambda s, i: celtypes.StringType(str(s)[int(i) : int(i) + 1])),
    "find": _strings(lambda s, p: celtypes.StringType((m := re.search(str(p), str(s))) and m.group(0) or "")),
    "findAll": _strings(lambda s, p: celtypes.ListType([celtypes.StringType(x.group(0)) for x in re.finditer(str(p), str(s))])),
    "isSorted": lambda xs: _b(all(a <= b for a, b in zip(_ordered(xs), _ordered(xs)[1:]))),
    "sum": lambda xs: sum(_ordered(xs), celtypes.IntType(0)) if xs else celtypes.IntType(0),
    "min": lambda xs: min(_ordered(xs)),
    "max": lambda xs: max(_ordered(xs)),
    "sets_contains": _sets_contains,
    "sets_equivalent": lambda a, b: _b(bool(_sets_contains(a, b)) and bool(_sets_contains(b, a))),
    "sets_intersects": lambda a, b: _b(any(_same(x, y) for x in a for y in b)),
}


# --- source rewrites for what celpy's grammar lacks ------------------------------------------


def _split_args(text: str, start: int) -> tuple[list[str], int]:
    """Top-level comma-separated arguments of the call whose '(' is at text[start - 1]."""
    depth, args, cur, i, quote = 0, [], start, start, ""
    while i < len(text):
        c = text[i]
        if quote:
            if c == "\\":
                i += 1
            elif c == quote:
                quote = ""
        elif c in "\"'":
            quote = c
        elif c in "([{":
            depth += 1
        elif c in ")]}":
            if depth == 0:
                args.append(text[cur:i])
                return args, i
            depth -= 1
        elif c == "," and depth == 0:
            args.append(text[cur:i])
            cur = i + 1
        i += 1
    raise ValueError("unbalanced cel.bind(")


def rewrite(expression: str) -> str:
    text = re.sub(r"\bsets\.(contains|equivalent|intersects)\(", r"sets_\1(", expression)
    while (at := text.find("cel.bind(")) >= 0:
        args, end = _split_args(text, at + len("cel.bind("))
        if len(args) != 3:
            raise ValueError("cel.bind needs 3 arguments")
        var, init, body = (a.strip() for a in args)
        text = f"{text[:at]}({_substitute(body, var, init)}){text[end + 1 :]}"
    return text


_TOKENS = re.compile(r"""("(?:\\.|[^"\\])*"|'(?:\\.|[^'\\])*')|(\.?\s*)\b([A-Za-z_][A-Za-z0-9_]*)\b""")


def _substitute(body: str, var: str, init: str) -> str:
    """cel.bind(var, init, body) == body with (init) for var: CEL is pure. String
    literals and field names (after a dot) are left alone."""

    def repl(m: re.Match) -> str:
        if m.group(1) is not None or m.group(3) != var or m.group(2).startswith("."):
            return m.group(0)
        return f"{m.group(2)}({init})"

    return _TOKENS.sub(repl, body)


# --- the device -------------------------------------------------------------------------


class DomainMap(celtypes.MapType):
    """Kubernetes: looking up an unknown domain yields an empty map."""

    def __getitem__(self, key: Any) -> Any:
        try:
            return super().__getitem__(key)
        except KeyError:
            return celtypes.MapType({})


def _attr(value: dict) -> Any:
    for kind, scalar in (("ints", "int"), ("bools", "bool"), ("strings", "string"), ("versions", "version")):
        if kind in value:  # a list attribute (KEP-5491): a list of the scalar values
            return celtypes.ListType([_attr({scalar: v}) for v in value[kind]])
    if "int" in value:
        return celtypes.IntType(value["int"])
    if "bool" in value:
        return celtypes.BoolType(value["bool"])
    if "string" in value:
        return celtypes.StringType(value["string"])
    return OracleSemver(value["version"])


def device_activation(driver: str, device: dict) -> dict:
    """``device`` is the ResourceSlice device as plain YAML (camelCase keys)."""
    attributes: dict = {}
    capacity: dict = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, _, ident = name.partition("/") if "/" in name else (driver, "", name)
        attributes.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(ident)] = _attr(value)
    for name, value in (device.get("capacity") or {}).items():
        domain, _, ident = name.partition("/") if "/" in name else (driver, "", name)
        capacity.setdefault(celtypes.StringType(domain), {})[celtypes.StringType(ident)] = oracle_parse_quantity(str(value["value"]))
    to_map = lambda d: DomainMap({k: celtypes.MapType(v) for k, v in d.items()})  # noqa: E731
    return {
        "device": celtypes.MapType(
            {
                celtypes.StringType("driver"): celtypes.StringType(driver),
                celtypes.StringType("attributes"): to_map(attributes),
                celtypes.StringType("capacity"): to_map(capacity),
                celtypes.StringType("allowMultipleAllocations"): celtypes.BoolType(bool(device.get("allowMultipleAllocations"))),
            }
        )
    }


_env = celpy.Environment()
_programs: dict[str, Any] = {}


def verdict(expression: str, driver: str, device: dict, activation: dict | None = None) -> bool | str:
    """True / False, or "error" for anything Kubernetes would report as an error.
    ``activation`` (from ``device_activation``) saves rebuilding the device per call."""
    try:
        program = _programs.get(expression)
        if program is None:
            program = _programs[expression] = _env.program(_env.compile(rewrite(expression)), functions=FUNCTIONS)
        result = program.evaluate(activation if activation is not None else device_activation(driver, device))
    except Exception:  # noqa: BLE001 - celpy reports errors as several exception types
        return "error"
    if isinstance(result, celtypes.BoolType):
        return bool(result)
    return "error"
