"""Runtime values and library functions of the Kubernetes DRA CEL environment.

The fast evaluator (``cel``, a Rust core) only carries plain CEL values, so
the two Kubernetes types are encoded as one-entry maps:

- Quantity: ``{"@quantity": key}`` where ``key`` is an order-preserving string
  of the nano-unit value, so ``==`` is map equality (1000m == 1) and the
  compiler can emit native string comparisons for typed quantities.
- Semver: ``{"@semver": "1.2.3-rc.1"}``, build metadata dropped because it
  takes no part in SemVer equality or precedence.

The same values and functions serve the reference interpreter
(``cel_eval``), so both evaluators agree on the library by construction;
they differ only in the core language, which is what the tests compare.
Functions raise ``LibraryError`` (a message Kubernetes users would
recognise); the fast evaluator reports any exception as an error.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache
from typing import Any

import re2

from dralloc.schemas.quantity import NANO, as_float, as_int64, parse_quantity

from .semver import Version, compare, parse_semver

Q_KEY = "@quantity"
V_KEY = "@semver"


class LibraryError(Exception):
    """A CEL runtime error raised by a library function."""


class UInt(int):
    """CEL ``uint`` in the reference interpreter (Python has one int type)."""

    __slots__ = ()


# --- encodings ---------------------------------------------------------------------


def quantity_key(nano: int) -> str:
    """Order-preserving string for an integer: sign, digit count, digits."""
    if nano >= 0:
        digits = str(nano)
        return f"1{len(digits):04d}{digits}"
    digits = str(-nano)
    return f"0{9999 - len(digits):04d}" + digits.translate(_COMPLEMENT)


_COMPLEMENT = str.maketrans("0123456789", "9876543210")


def key_nano(key: str) -> int:
    digits = key[5:]
    return int(digits) if key[0] == "1" else -int(digits.translate(_COMPLEMENT))


def quantity_value(nano: int) -> dict[str, str]:
    return {Q_KEY: quantity_key(nano)}


def semver_value(v: Version) -> dict[str, str]:
    text = f"{v.major}.{v.minor}.{v.patch}"
    if v.pre:
        text += "-" + ".".join(str(p) for _, p in v.pre)
    return {V_KEY: text}


def is_quantity_value(x: Any) -> bool:
    return type(x) is dict and len(x) == 1 and Q_KEY in x


def is_semver_value(x: Any) -> bool:
    return type(x) is dict and len(x) == 1 and V_KEY in x


def nano_of(x: Any) -> int:
    return key_nano(x[Q_KEY])


@lru_cache(maxsize=4096)
def _version(text: str) -> Version:
    return parse_semver(text)


def type_name(x: Any) -> str:
    """The CEL type name of a runtime value, for error messages."""
    if isinstance(x, bool):
        return "bool"
    if isinstance(x, UInt):
        return "uint"
    if isinstance(x, int):
        return "int"
    if isinstance(x, float):
        return "double"
    if isinstance(x, str):
        return "string"
    if isinstance(x, bytes):
        return "bytes"
    if x is None:
        return "null_type"
    if isinstance(x, list):
        return "list"
    if is_quantity_value(x):
        return "kubernetes.Quantity"
    if is_semver_value(x):
        return "kubernetes.Semver"
    if isinstance(x, dict):
        return "map"
    return type(x).__name__


def _no_overload(name: str, *args: Any) -> LibraryError:
    return LibraryError(f"no such overload: {name}({', '.join(type_name(a) for a in args)})")


# --- quantity and semver -------------------------------------------------------------


def quantity(s: Any) -> dict[str, str]:
    if not isinstance(s, str):
        raise _no_overload("quantity", s)
    try:
        return quantity_value(parse_quantity(s))
    except ValueError as e:
        raise LibraryError(str(e)) from None


def is_quantity(s: Any) -> bool:
    if not isinstance(s, str):
        raise _no_overload("isQuantity", s)
    try:
        parse_quantity(s)
    except ValueError:
        return False
    return True


def semver(s: Any, normalize: Any = False) -> dict[str, str]:
    if not isinstance(s, str) or not isinstance(normalize, bool):
        raise _no_overload("semver", s, normalize)
    try:
        return semver_value(parse_semver(s, normalize))
    except ValueError as e:
        raise LibraryError(str(e)) from None


def is_semver(s: Any, normalize: Any = False) -> bool:
    if not isinstance(s, str) or not isinstance(normalize, bool):
        raise _no_overload("isSemver", s, normalize)
    try:
        parse_semver(s, normalize)
    except ValueError:
        return False
    return True


def _cmp(name: str, a: Any, b: Any) -> int:
    if is_quantity_value(a) and is_quantity_value(b):
        x, y = nano_of(a), nano_of(b)
        return (x > y) - (x < y)
    if is_semver_value(a) and is_semver_value(b):
        return compare(_version(a[V_KEY]), _version(b[V_KEY]))
    raise _no_overload(name, a, b)


def is_greater_than(a: Any, b: Any) -> bool:
    return _cmp("isGreaterThan", a, b) == 1


def is_less_than(a: Any, b: Any) -> bool:
    return _cmp("isLessThan", a, b) == -1


def compare_to(a: Any, b: Any) -> int:
    return _cmp("compareTo", a, b)


def _q(name: str, q: Any) -> int:
    if not is_quantity_value(q):
        raise _no_overload(name, q)
    return nano_of(q)


def sign(q: Any) -> int:
    n = _q("sign", q)
    return (n > 0) - (n < 0)


def is_integer(q: Any) -> bool:
    return as_int64(_q("isInteger", q)) is not None


def as_integer(q: Any) -> int:
    v = as_int64(_q("asInteger", q))
    if v is None:
        raise LibraryError("cannot convert value to integer")
    return v


def as_approximate_float(q: Any) -> float:
    return as_float(_q("asApproximateFloat", q))


def _operand(name: str, q: Any, other: Any) -> tuple[int, int]:
    n = _q(name, q)
    if is_quantity_value(other):
        return n, nano_of(other)
    if isinstance(other, int) and not isinstance(other, bool):
        return n, other * NANO
    raise _no_overload(name, q, other)


def add(q: Any, other: Any) -> dict[str, str]:
    a, b = _operand("add", q, other)
    return quantity_value(a + b)


def sub(q: Any, other: Any) -> dict[str, str]:
    a, b = _operand("sub", q, other)
    return quantity_value(a - b)


def _v(name: str, v: Any) -> Version:
    if not is_semver_value(v):
        raise _no_overload(name, v)
    return _version(v[V_KEY])


def major(v: Any) -> int:
    return _v("major", v).major


def minor(v: Any) -> int:
    return _v("minor", v).minor


def patch(v: Any) -> int:
    return _v("patch", v).patch


# --- strings (cel-go ext.Strings v2) and regex (Kubernetes regex library) ------------------


def _s(name: str, *args: Any) -> None:
    if not all(isinstance(a, str) for a in args):
        raise _no_overload(name, *args)


def _i(name: str, *args: Any) -> None:
    if not all(isinstance(a, int) and not isinstance(a, bool) for a in args):
        raise _no_overload(name, *args)


def char_at(s: Any, i: Any) -> str:
    _s("charAt", s)
    _i("charAt", i)
    text: str = s  # checked just above
    if i < 0 or i > len(text):
        raise LibraryError(f"index out of range: {i}")
    return text[i : i + 1]


def index_of(x: Any, sub_: Any, offset: Any = 0) -> int:
    if isinstance(x, list):
        return _list_index(x, sub_, "indexOf", reverse=False)
    _s("indexOf", x, sub_)
    _i("indexOf", offset)
    text: str = x  # checked just above
    if offset < 0 or offset > len(text):
        raise LibraryError(f"index out of range: {offset}")
    return text.find(sub_, offset)


def last_index_of(x: Any, sub_: Any, offset: Any = None) -> int:
    if isinstance(x, list):
        return _list_index(x, sub_, "lastIndexOf", reverse=True)
    _s("lastIndexOf", x, sub_)
    text: str = x  # checked just above
    if offset is None:
        return text.rfind(sub_)
    _i("lastIndexOf", offset)
    if offset < 0 or (offset >= len(text) and not (offset == 0 and not text)):
        raise LibraryError(f"index out of range: {offset}")
    return text.rfind(sub_, 0, offset + len(sub_))


def lower_ascii(s: Any) -> str:
    _s("lowerAscii", s)
    text: str = s  # checked just above
    return text.lower() if text.isascii() else "".join(c.lower() if c.isascii() else c for c in text)


def upper_ascii(s: Any) -> str:
    _s("upperAscii", s)
    text: str = s  # checked just above
    return text.upper() if text.isascii() else "".join(c.upper() if c.isascii() else c for c in text)


def replace(s: Any, old: Any, new: Any, n: Any = -1) -> str:
    _s("replace", s, old, new)
    _i("replace", n)
    text: str = s  # checked just above
    return text.replace(old, new, n if n >= 0 else -1)


def split(s: Any, sep: Any, n: Any = -1) -> list[str]:
    _s("split", s, sep)
    _i("split", n)
    if n == 0:
        return []
    if sep == "":
        chars = list(s)
        return chars if n < 0 or n >= len(chars) else chars[: n - 1] + ["".join(chars[n - 1 :])]
    text: str = s  # checked just above
    return text.split(sep, n - 1 if n > 0 else -1)


def substring(s: Any, start: Any, end: Any = None) -> str:
    _s("substring", s)
    end = len(s) if end is None else end
    _i("substring", start, end)
    text: str = s  # checked just above
    if start < 0 or start > len(text) or end < start or end > len(text):
        raise LibraryError(f"substring({start}, {end}) out of range for a string of length {len(text)}")
    return text[start:end]


_SPACE = "".join(chr(c) for c in (0x09, 0x0A, 0x0B, 0x0C, 0x0D, 0x20, 0x85, 0xA0, 0x1680, *range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000))


def trim(s: Any) -> str:
    _s("trim", s)
    text: str = s  # checked just above
    return text.strip(_SPACE)


def join(items: Any, sep: Any = "") -> str:
    if not isinstance(items, list) or not all(isinstance(i, str) for i in items):
        raise _no_overload("join", items, sep)
    _s("join", sep)
    separator: str = sep  # checked just above
    return separator.join(items)


_RE2_OPTIONS = re2.Options()
_RE2_OPTIONS.log_errors = False  # a bad pattern is a CEL error, not a line on stderr


@lru_cache(maxsize=1024)
def compile_regex(pattern: str) -> Any:
    """RE2, as Kubernetes (Go) uses: same syntax, ASCII \\d \\w \\s, and linear time, so a
    hostile pattern cannot backtrack for ever."""
    try:
        return re2.compile(pattern, _RE2_OPTIONS)
    except re2.error as e:
        message = e.args[0].decode() if e.args and isinstance(e.args[0], bytes) else str(e)
        raise LibraryError(f"invalid regular expression {pattern!r}: {message}") from None


def find(s: Any, pattern: Any) -> str:
    _s("find", s, pattern)
    m = compile_regex(pattern).search(s)
    return m.group(0) if m else ""


def find_all(s: Any, pattern: Any, n: Any = -1) -> list[str]:
    _s("findAll", s, pattern)
    _i("findAll", n)
    found = [m.group(0) for m in compile_regex(pattern).finditer(s)]
    return found if n < 0 else found[:n]


def matches(s: Any, pattern: Any) -> bool:
    _s("matches", s, pattern)
    return compile_regex(pattern).search(s) is not None


# --- lists (Kubernetes lists library) and sets (cel-go ext.Sets) --------------------------------


def _same_kind(a: Any, b: Any) -> bool:
    """CEL equality has no implicit bool/int mixing, unlike Python's."""
    return isinstance(a, bool) == isinstance(b, bool)


def cel_equal(a: Any, b: Any) -> bool:
    if not _same_kind(a, b):
        return False
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(cel_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(cel_equal(a[k], b[k]) for k in a)
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b  # CEL compares numbers across int/uint/double at runtime
    return type(a) is type(b) and a == b


def _list_index(items: list[Any], x: Any, name: str, reverse: bool) -> int:
    order = range(len(items) - 1, -1, -1) if reverse else range(len(items))
    for i in order:
        if cel_equal(items[i], x):
            return i
    return -1


def _comparable(name: str, items: Any) -> list[Any]:
    if not isinstance(items, list):
        raise _no_overload(name, items)
    kinds = {type_name(i) for i in items}
    if len(kinds) > 1 and not kinds <= {"int", "uint", "double"}:
        raise _no_overload(name, items)
    if kinds & {"map", "list", "null_type", "kubernetes.Quantity", "kubernetes.Semver"}:
        raise _no_overload(name, items)
    return items


def is_sorted(items: Any) -> bool:
    items = _comparable("isSorted", items)
    return all(items[i] <= items[i + 1] for i in range(len(items) - 1))


def list_sum(items: Any) -> Any:
    items = _comparable("sum", items)
    if items and not all(isinstance(i, (int, float)) and not isinstance(i, bool) for i in items):
        raise _no_overload("sum", items)
    total = sum(items) if items else 0
    if isinstance(total, int) and not -(2**63) <= total < 2**63:
        raise LibraryError("integer overflow in sum()")
    return total


def list_min(items: Any) -> Any:
    items = _comparable("min", items)
    if not items:
        raise LibraryError("min called on empty list")
    return min(items)


def list_max(items: Any) -> Any:
    items = _comparable("max", items)
    if not items:
        raise LibraryError("max called on empty list")
    return max(items)


def _lists(name: str, a: Any, b: Any) -> None:
    if not isinstance(a, list) or not isinstance(b, list):
        raise _no_overload(name, a, b)


def sets_contains(a: Any, b: Any) -> bool:
    _lists("sets.contains", a, b)
    return all(any(cel_equal(x, y) for x in a) for y in b)


def sets_equivalent(a: Any, b: Any) -> bool:
    _lists("sets.equivalent", a, b)
    return sets_contains(a, b) and sets_contains(b, a)


def sets_intersects(a: Any, b: Any) -> bool:
    _lists("sets.intersects", a, b)
    return any(cel_equal(x, y) for x in a for y in b)


INCLUDES_MAX = 48  # resource.k8s.io ResourceSliceMaxAttributeValuesPerDevice


def includes(target: Any, arg: Any) -> bool:
    """Kubernetes' ``<target>.includes(<arg>)`` (KEP-5491): membership in a list attribute,
    equality for a scalar one. A value of another type is not included (false, not an
    error, as cel-go's Equal answers); a list longer than 48 entries is an error once
    the first 48 did not match, the bound Kubernetes puts on its cost."""
    if isinstance(target, list):
        for i, item in enumerate(target):
            if i >= INCLUDES_MAX:
                raise LibraryError(f"'includes' function cannot be applied to lists longer than {INCLUDES_MAX} values")
            if cel_equal(item, arg):
                return True
        return False
    return cel_equal(target, arg)


# Functions registered with the fast evaluator (it has size/contains/startsWith/endsWith/matches
# and the conversions natively). A member call x.f(a) reaches these as f(x, a).
FUNCTIONS: dict[str, Callable[..., Any]] = {
    "quantity": quantity,
    "isQuantity": is_quantity,
    "semver": semver,
    "isSemver": is_semver,
    "isGreaterThan": is_greater_than,
    "isLessThan": is_less_than,
    "compareTo": compare_to,
    "sign": sign,
    "isInteger": is_integer,
    "asInteger": as_integer,
    "asApproximateFloat": as_approximate_float,
    "add": add,
    "sub": sub,
    "major": major,
    "minor": minor,
    "patch": patch,
    "charAt": char_at,
    "indexOf": index_of,
    "lastIndexOf": last_index_of,
    "lowerAscii": lower_ascii,
    "upperAscii": upper_ascii,
    "replace": replace,
    "split": split,
    "substring": substring,
    "trim": trim,
    "join": join,
    "find": find,
    "findAll": find_all,
    "isSorted": is_sorted,
    "sum": list_sum,
    "min": list_min,
    "max": list_max,
    "sets.contains": sets_contains,
    "sets.equivalent": sets_equivalent,
    "sets.intersects": sets_intersects,
    "includes": includes,
}
