"""Kubernetes ``resource.Quantity``: parse, format, exact arithmetic.

A quantity is a plain ``int`` counting nano-units (1 == 1n, 10**9 == "1").
Plain ints are exact, hashable, totally ordered and fast in the engine's
capacity arithmetic, and every value Kubernetes can hold is a whole number of
nano-units: ``ParseQuantity`` rounds anything finer *up* (away from zero) to
1n, so nothing is lost.

What an int does not keep is the *format* a quantity was written in
(``80Gi`` is BinarySI, ``85899345920`` DecimalSI). ``format_quantity`` takes
it as an optional argument; without one it picks the shorter of the two
canonical spellings (ties: decimal), which round-trips what people write
("80Gi", "40G", "500m", "2").
"""

from __future__ import annotations

import functools
import re
from typing import Literal

Q = int
"""A quantity: an exact count of nano-units."""

NANO = 10**9
_MAX_BINARY = (2**63 - 1) * NANO  # Kubernetes caps BinarySI values at int64 max units

Format = Literal["DecimalSI", "BinarySI", "DecimalExponent"]

# sign, integer digits, optional fraction, suffix (validated separately)
_QUANTITY = re.compile(r"([+-]?)([0-9]*)(?:\.([0-9]*))?([A-Za-z]*(?:[eE][+-]?[0-9]+)?)\Z")
_DECIMAL_SUFFIX = {"n": -9, "u": -6, "m": -3, "": 0, "k": 3, "M": 6, "G": 9, "T": 12, "P": 15, "E": 18}
_BINARY_SUFFIX = {"Ki": 10, "Mi": 20, "Gi": 30, "Ti": 40, "Pi": 50, "Ei": 60}
_EXPONENT = re.compile(r"[eE]([+-]?[0-9]+)\Z")


def _ceil_div(n: int, d: int) -> int:
    """Divide, rounding away from zero (Kubernetes rounds sub-nano values up)."""
    q, r = divmod(abs(n), d)
    return (q + (r != 0)) * (1 if n >= 0 else -1)


def parse_quantity_format(value: str | int | float) -> tuple[Q, Format]:
    """Parse like ``resource.ParseQuantity`` and also return the format written."""
    if isinstance(value, bool):
        raise ValueError(f"invalid quantity {value!r}: expected a string or number")
    if isinstance(value, int):
        return value * NANO, "DecimalSI"
    if isinstance(value, float):
        if value != value or value in (float("inf"), float("-inf")):
            raise ValueError(f"invalid quantity {value!r}: not a finite number")
        value = repr(value)
    if not isinstance(value, str):
        raise ValueError(f"invalid quantity {value!r}: expected a string or number")
    m = _QUANTITY.match(value)
    if m is None or not (m.group(2) or m.group(3)):
        raise ValueError(f"invalid quantity {value!r}: expected a number with an optional suffix such as 80Gi, 500m, 2")
    sign, whole, frac, suffix = m.group(1), m.group(2), m.group(3) or "", m.group(4)
    digits = int((whole or "0") + frac)  # the value is digits * 10**-len(frac) * suffix
    fmt: Format
    if suffix in _DECIMAL_SUFFIX:
        fmt, base, exp = "DecimalSI", 10, _DECIMAL_SUFFIX[suffix]
    elif suffix in _BINARY_SUFFIX:
        fmt, base, exp = "BinarySI", 2, _BINARY_SUFFIX[suffix]
    elif (em := _EXPONENT.match(suffix)) is not None:
        fmt, base, exp = "DecimalExponent", 10, int(em.group(1))
        if abs(exp) > 10_000:  # keeps hostile input from building huge ints
            raise ValueError(f"invalid quantity {value!r}: exponent out of range")
    else:
        raise ValueError(f"invalid quantity {value!r}: unknown suffix {suffix!r} (use n u m k M G T P E, Ki Mi Gi Ti Pi Ei, or an exponent like e3)")
    # nano = digits * base**exp * 10**9 / 10**len(frac), rounded up to a whole nano-unit
    num = digits * NANO
    den = 10 ** len(frac)
    if base == 2:
        num <<= exp
    elif exp >= 0:
        num *= 10**exp
    else:
        den *= 10**-exp
    nano = _ceil_div(num, den)
    if fmt == "BinarySI":
        nano = min(nano, _MAX_BINARY)
        if 0 < nano < NANO:  # Kubernetes: a BinarySI value below 1 is shown as DecimalSI
            fmt = "DecimalSI"
    return (-nano if sign == "-" else nano), fmt


def parse_quantity(value: str | int | float) -> Q:
    """Parse a Kubernetes quantity ("80Gi", "500m", "1.5", 8) into nano-units.

    Strings are memoised (errors are not cached): a fleet's slices repeat the same
    few capacity and counter strings hundreds of thousands of times, and the engine
    parses them on every pool rebuild (`dralloc plan` on 1,000 nodes spent a third
    of its time here)."""
    if type(value) is str:
        return _parse_string(value)
    return parse_quantity_format(value)[0]


@functools.lru_cache(maxsize=65536)
def _parse_string(value: str) -> Q:
    return parse_quantity_format(value)[0]


def is_quantity(value: str) -> bool:
    try:
        parse_quantity(value)
    except ValueError:
        return False
    return True


def _decimal(q: Q, exponent_style: bool) -> str:
    """Canonical DecimalSI/DecimalExponent: the largest power of 1000 that keeps an integer."""
    if q == 0:
        return "0"
    mantissa, exp = q, -9
    while mantissa % 1000 == 0 and exp < 18:
        mantissa //= 1000
        exp += 3
    if exponent_style:
        return f"{mantissa}e{exp}" if exp else str(mantissa)
    suffix = {v: k for k, v in _DECIMAL_SUFFIX.items()}[exp]
    return f"{mantissa}{suffix}"


def _binary(q: Q) -> str | None:
    """Canonical BinarySI, or None when Kubernetes would fall back to DecimalSI."""
    if q % NANO or abs(q) < 1024 * NANO:
        return None
    units, exp = q // NANO, 0
    while units % 1024 == 0 and exp < 60:
        units //= 1024
        exp += 10
    suffix = {v: k for k, v in _BINARY_SUFFIX.items()}.get(exp, "")
    return f"{units}{suffix}"


def format_quantity(q: Q, fmt: Format | None = None) -> str:
    """Canonical Kubernetes spelling ("80Gi", "500m", "2").

    ``fmt`` is the format the quantity was written in (from
    ``parse_quantity_format``); without it, the shorter canonical spelling.
    """
    if fmt == "BinarySI":
        return _binary(q) or _decimal(q, False)
    if fmt == "DecimalExponent":
        return _decimal(q, True)
    decimal = _decimal(q, False)
    if fmt == "DecimalSI":
        return decimal
    binary = _binary(q)
    return binary if binary is not None and len(binary) < len(decimal) else decimal


def as_int64(q: Q) -> int | None:
    """The value in whole units if it is an integer that fits int64 (``Quantity.AsInt64``)."""
    if q % NANO:
        return None
    units = q // NANO
    return units if -(2**63) <= units < 2**63 else None


def as_float(q: Q) -> float:
    """Approximate float value (``AsApproximateFloat64``)."""
    return q / NANO
