"""A second independent oracle for DRA CEL selectors, built on cel-cpp (``cel-expr-python``).

Google's binding of cel-cpp evaluates in 1-9 µs where celpy (``cel_oracle``) takes
100-1,300 µs, so this one can check every selector of the upstream corpus on
every device of it. Nothing comes from dralloc's engine: the CEL language
(parser, type checker, macros, heterogeneous equality, error absorption in
``&&``/``||``, RE2 for ``matches``) is cel-cpp's; the strings extension
(``lowerAscii`` ...) and ``cel.bind`` are its standard extensions; the
Kubernetes quantity and semver libraries are declared here, with the values
parsed by the celpy oracle's own pure-Python parsers (``oracle_parse_quantity``,
``OracleSemver``: decimal and the semver.org grammar).

How the Kubernetes environment is emulated, and why:

- ``device`` is a ``map(string, dyn)`` with ``driver``, ``attributes``,
  ``capacity`` and ``allowMultipleAllocations``; attributes are int, bool,
  string, Semver or lists of those (KEP-5491), capacities Quantity.
- Quantity and Semver are protobuf messages of a pool made here (the binding
  cannot return opaque Python objects). A Quantity holds its exact value in
  nano-units as a decimal string, a Semver its text without build metadata,
  so message equality is Kubernetes' ``==`` (``quantity("1") == quantity("1000m")``;
  build metadata does not count in a version's equality).
- Kubernetes' attribute and capacity maps yield an empty map for a domain the
  device does not have, while ``"domain" in device.attributes`` sees only the
  device's own domains. A plain map cannot do both, so (the "unknown domain
  guard") every domain the corpus indexes is present (empty when the device
  lacks it) and ``"d" in device.attributes`` is rewritten to ask a list of the
  device's real domains instead (`rewrite`). ``has(device.attributes.d)`` and
  iterating over the domain map itself are not emulated (neither is in the
  corpus; the test would show a disagreement if one came in).
- Not available at run time in this binding: ``transformMap`` and the other
  two-variable comprehensions (`UNSUPPORTED`): those selectors are skipped by
  the caller, named and counted.
- The binding keeps a little memory per call into a Python function (quantity,
  semver and their methods): fine for a test process, not for a service.

``Oracle.verdict(expression, activation)`` returns True, False or "error".
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from typing import Any

from cel_expr_python import cel
from cel_expr_python.ext import ext_bindings, ext_strings
from cel_oracle import OracleSemver, oracle_parse_quantity
from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

UNSUPPORTED = re.compile(r"\.(transformMap|transformMapEntry|transformList)\s*\(|\.(all|exists|existsOne|exists_one)\s*\(\s*\w+\s*,\s*\w+\s*,")
"""Selectors this binding cannot run: two-variable comprehensions (cel-go's ext, absent from cel-cpp's Python runtime)."""

# --- Quantity and Semver as protobuf messages -----------------------------------------------

_PACKAGE = "dralloc_cel_oracle"


def _pool() -> descriptor_pool.DescriptorPool:
    proto = descriptor_pb2.FileDescriptorProto(name=f"{_PACKAGE}.proto", package=_PACKAGE, syntax="proto3")
    for name in ("Quantity", "Semver"):
        message = proto.message_type.add(name=name)
        message.field.add(
            name="value", number=1, type=descriptor_pb2.FieldDescriptorProto.TYPE_STRING, label=descriptor_pb2.FieldDescriptorProto.LABEL_OPTIONAL
        )
    pool = descriptor_pool.DescriptorPool()
    pool.Add(proto)
    return pool


POOL = _pool()
QuantityMessage = message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{_PACKAGE}.Quantity"))
SemverMessage = message_factory.GetMessageClass(POOL.FindMessageTypeByName(f"{_PACKAGE}.Semver"))
Q = cel.Type(f"{_PACKAGE}.Quantity")
S = cel.Type(f"{_PACKAGE}.Semver")
INT64 = range(-(2**63), 2**63)


def quantity(text: str) -> Any:
    """A Quantity message: the exact value in nano-units (ValueError for what Kubernetes cannot parse)."""
    return QuantityMessage(value=str(oracle_parse_quantity(text).nano))


def _nano(q: Any) -> int:
    return int(q.value)


def semver(text: str) -> Any:
    """A Semver message: the version without build metadata (ValueError for what is not semver)."""
    OracleSemver(text)  # validates
    return SemverMessage(value=text.split("+", 1)[0])


def _version(v: Any) -> OracleSemver:
    return OracleSemver(v.value)


def _compare_q(a: Any, b: Any) -> int:
    x, y = _nano(a), _nano(b)
    return (x > y) - (x < y)


def _compare_s(a: Any, b: Any) -> int:
    x, y = _version(a), _version(b)
    return (x > y) - (x < y)


def _is_valid(parse: Callable[[str], Any]) -> Callable[[str], bool]:
    def check(text: str) -> bool:
        try:
            parse(text)
        except ValueError:
            return False
        return True

    return check


def _as_integer(q: Any) -> int:
    nano = _nano(q)
    if nano % 10**9 or nano // 10**9 not in INT64:
        raise ValueError("cannot convert value to integer")
    return nano // 10**9


def _plus(q: Any, n: int) -> Any:
    return QuantityMessage(value=str(_nano(q) + n))


def _ordered(compare_q: Callable[[Any, Any], int], compare_s: Callable[[Any, Any], int], test: Callable[[int], Any]) -> Callable[[Any, Any], Any]:
    """One implementation for the Quantity and the Semver overload: the runtime tells messages apart
    by their Python type (cel-cpp dispatches on the value's kind, and both are messages)."""

    def call(a: Any, b: Any) -> Any:
        if isinstance(a, QuantityMessage) and isinstance(b, QuantityMessage):
            return test(compare_q(a, b))
        if isinstance(a, SemverMessage) and isinstance(b, SemverMessage):
            return test(compare_s(a, b))
        raise TypeError("no such overload")  # a dyn attribute of the other type: an error, as in Kubernetes

    return call


def _functions() -> list[cel.FunctionDecl]:
    """The Kubernetes quantity and semver libraries (k8s.io/apiserver/pkg/cel/library).

    The type checker sees every overload; the runtime gets one implementation per function and
    argument kinds (a Quantity and a Semver overload share theirs: `_ordered`)."""
    b, i, f, s = cel.Type.BOOL, cel.Type.INT, cel.Type.DOUBLE, cel.Type.STRING
    member = True
    table: dict[str, tuple[list[tuple[cel.Type, list[cel.Type]]], Callable[..., Any], bool]] = {
        "quantity": ([(Q, [s])], quantity, not member),
        "isQuantity": ([(b, [s])], _is_valid(oracle_parse_quantity), not member),
        "semver": ([(S, [s])], semver, not member),
        "isSemver": ([(b, [s])], _is_valid(OracleSemver), not member),
        "isGreaterThan": ([(b, [Q, Q]), (b, [S, S])], _ordered(_compare_q, _compare_s, lambda c: c > 0), member),
        "isLessThan": ([(b, [Q, Q]), (b, [S, S])], _ordered(_compare_q, _compare_s, lambda c: c < 0), member),
        "compareTo": ([(i, [Q, Q]), (i, [S, S])], _ordered(_compare_q, _compare_s, lambda c: c), member),
        "sign": ([(i, [Q])], lambda x: (_nano(x) > 0) - (_nano(x) < 0), member),
        "isInteger": ([(b, [Q])], lambda x: _nano(x) % 10**9 == 0 and _nano(x) // 10**9 in INT64, member),
        "asInteger": ([(i, [Q])], _as_integer, member),
        "asApproximateFloat": ([(f, [Q])], lambda x: _nano(x) / 1e9, member),
        "add": ([(Q, [Q, Q]), (Q, [Q, i])], lambda x, y: _plus(x, y * 10**9 if isinstance(y, int) else _nano(y)), member),
        "sub": ([(Q, [Q, Q]), (Q, [Q, i])], lambda x, y: _plus(x, -(y * 10**9 if isinstance(y, int) else _nano(y))), member),
        "major": ([(i, [S])], lambda v: _version(v).nums[0], member),
        "minor": ([(i, [S])], lambda v: _version(v).nums[1], member),
        "patch": ([(i, [S])], lambda v: _version(v).nums[2], member),
    }
    out = []
    for name, (overloads, impl, is_member) in table.items():
        decls, kinds = [], set()
        for result, params in overloads:
            kind = tuple("message" if p in (Q, S) else p.name() for p in params)
            signature = "_".join([name, *(p.name().replace(".", "_") for p in params)])
            if kind in kinds:  # the runtime already has this function for these kinds: declare only
                decls.append(cel.Overload(signature, result, params, is_member=is_member))
            else:
                kinds.add(kind)
                decls.append(cel.Overload(signature, result, params, is_member=is_member, impl=impl))
        out.append(cel.FunctionDecl(name, decls))
    return out


# --- the device ------------------------------------------------------------------------------

_SCALARS = (("int", int), ("bool", bool), ("string", str), ("version", semver))


def _attribute(value: dict) -> Any:
    for kind, make in _SCALARS:
        if kind in value:
            return make(value[kind])
        if f"{kind}s" in value:  # a list attribute (KEP-5491)
            return [make(v) for v in value[f"{kind}s"]]
    raise ValueError(f"attribute without a value: {value!r}")


def _split(name: str, driver: str) -> tuple[str, str]:
    """``domain/id`` as written, or the driver's domain for an unqualified name."""
    domain, _, ident = name.partition("/")
    return (domain, ident) if ident else (driver, name)


def device_data(driver: str, device: dict, guarded: Iterable[str] = ()) -> dict[str, Any]:
    """The activation's variables for a ResourceSlice device given as plain YAML (camelCase keys).

    `guarded`: domains present as empty maps when the device lacks them (Kubernetes' default)."""
    attributes: dict[str, dict[str, Any]] = {}
    capacity: dict[str, dict[str, Any]] = {}
    for name, value in (device.get("attributes") or {}).items():
        domain, ident = _split(name, driver)
        attributes.setdefault(domain, {})[ident] = _attribute(value)
    for name, value in (device.get("capacity") or {}).items():
        domain, ident = _split(name, driver)
        capacity.setdefault(domain, {})[ident] = quantity(str(value["value"]))
    real = {"attributes": sorted(attributes), "capacity": sorted(capacity)}
    for domain in guarded:
        attributes.setdefault(domain, {})
        capacity.setdefault(domain, {})
    return {
        "device": {
            "driver": driver,
            "attributes": attributes,
            "capacity": capacity,
            "allowMultipleAllocations": bool(device.get("allowMultipleAllocations")),
        },
        DOMAINS: real,
    }


DYN_RANGE = "cannot be the range of a comprehension"
"""cel-cpp's checker error for ``m.exists(k, ...)`` on a ``dyn`` map (every domain map is dyn here)."""

DOMAINS = "dralloc_oracle_domains"
"""The variable holding the device's real domains (what ``in device.attributes`` is rewritten to ask)."""

_IN_MAP = re.compile(r"\bin\s+device\s*\.\s*(attributes|capacity)\b(?!\s*[\[.])")
_INDEXED = re.compile(r"device\s*\.\s*(?:attributes|capacity)\s*(?:\[\s*\"([^\"]*)\"\s*\]|\[\s*'([^']*)'\s*\]|\.\s*([A-Za-z_][A-Za-z0-9_]*))")


def rewrite(expression: str) -> str:
    """``x in device.attributes`` (or capacity) asks the device's real domains, not the guarded map."""
    return _IN_MAP.sub(lambda m: f"in {DOMAINS}.{m.group(1)}", expression)


def indexed_domains(expression: str) -> set[str]:
    """The domains an expression looks up by a literal name (those the guard must make present)."""
    return {next(g for g in m.groups() if g is not None) for m in _INDEXED.finditer(expression)}


class Oracle:
    """One cel-cpp environment with the Kubernetes DRA variables and libraries; compiled programs cached."""

    BOOL = cel.Type.BOOL

    def __init__(self) -> None:
        self.env = cel.NewEnv(
            POOL,
            variables={"device": cel.Type.Map(cel.Type.STRING, cel.Type.DYN), DOMAINS: cel.Type.Map(cel.Type.STRING, cel.Type.List(cel.Type.STRING))},
            extensions=[ext_strings.ExtStrings(), ext_bindings.ExtBindings()],
            functions=_functions(),
        )
        self._programs: dict[str, Any] = {}
        self.unchecked: set[str] = set()
        """Selectors compiled without the type checker (`DYN_RANGE`)."""

    def compile(self, expression: str) -> Any:
        """The compiled program (RuntimeError when cel-cpp refuses it: parse or type errors)."""
        program = self._programs.get(expression)
        if program is None:
            try:
                program = self.env.compile(rewrite(expression))
            except RuntimeError as exc:
                if DYN_RANGE not in str(exc):
                    raise
                # cel-cpp's checker refuses a dyn value as a comprehension's range (cel-go and the
                # message itself allow it): such a selector runs unchecked, its types checked at run time
                program = self.env.compile(rewrite(expression), disable_check=True)
                self.unchecked.add(expression)
            self._programs[expression] = program
        return program

    def activation(self, data: dict[str, Any]) -> Any:
        return self.env.Activation(data)

    def verdict(self, expression: str, activation: Any) -> bool | str:
        """True / False, or "error" for an evaluation error or a result that is not a bool."""
        result = self.compile(expression).eval(activation)
        if result.type() == self.BOOL:
            return bool(result.value())
        return "error"


__all__ = ["UNSUPPORTED", "Oracle", "device_data", "indexed_domains", "quantity", "rewrite", "semver"]
