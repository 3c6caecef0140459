"""Kubernetes resource.Quantity and semantic versions as the engine uses them."""

from __future__ import annotations

from decimal import Decimal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dralloc.allocator.engine.cel_runtime import key_nano, quantity_key
from dralloc.allocator.engine.semver import is_semver, parse_semver
from dralloc.schemas.quantity import (
    NANO,
    as_int64,
    format_quantity,
    is_quantity,
    parse_quantity,
    parse_quantity_format,
)


@pytest.mark.parametrize(
    "text, nano",
    [
        ("0", 0),
        ("1", NANO),
        ("1.5", 1_500_000_000),
        ("500m", 500_000_000),
        ("1n", 1),
        ("1u", 1000),
        ("1k", 1000 * NANO),
        ("2M", 2 * 10**6 * NANO),
        ("40G", 40 * 10**9 * NANO),
        ("1E", 10**18 * NANO),
        ("1Ki", 1024 * NANO),
        ("80Gi", 80 * 2**30 * NANO),
        ("1.5Gi", 3 * 2**29 * NANO),
        ("-2Gi", -2 * 2**30 * NANO),
        ("+3", 3 * NANO),
        ("1e3", 1000 * NANO),
        ("1E-3", NANO // 1000),
        ("1.5e3", 1500 * NANO),
        (".5", NANO // 2),
        ("1.", NANO),
        ("0.1Ki", 102_400_000_000),
        # finer than 1n rounds up (away from zero), as ParseQuantity does
        ("0.5n", 1),
        ("1.1n", 2),
        ("-0.5n", -1),
        ("1e-12", 1),
        # BinarySI is capped at the int64 maximum
        ("8Ei", (2**63 - 1) * NANO),
    ],
)
def test_parse(text: str, nano: int) -> None:
    assert parse_quantity(text) == nano


@pytest.mark.parametrize("value, nano", [(8, 8 * NANO), (0, 0), (1.5, 1_500_000_000), (-2, -2 * NANO)])
def test_parse_numbers(value: int | float, nano: int) -> None:
    """msgspec hands unquoted YAML numbers over as int/float."""
    assert parse_quantity(value) == nano


@pytest.mark.parametrize(
    "text", ["", " 1", "1 ", "1 Gi", "abc", "Gi", "1.2.3", "1K", "1gi", "1Qi", "--1", "1e", "e3", ".", "1,5", "0x10", "1.5.Gi", "nan", "inf"]
)
def test_parse_rejects(text: str) -> None:
    with pytest.raises(ValueError, match="invalid quantity"):
        parse_quantity(text)
    assert not is_quantity(text)


def test_parse_rejects_non_numbers() -> None:
    for bad in (True, None, [1], float("nan"), float("inf")):
        with pytest.raises(ValueError, match="invalid quantity"):
            parse_quantity(bad)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "text, canonical",
    [
        # Kubernetes' canonical form keeps the written format: BinarySI, DecimalSI, DecimalExponent
        ("80Gi", "80Gi"),
        ("1024Mi", "1Gi"),
        ("1.5Gi", "1536Mi"),
        ("0.5Gi", "512Mi"),
        ("1000Ki", "1000Ki"),
        ("1.5Ki", "1536"),
        ("0.1Ki", "102400m"),
        ("-1Ki", "-1Ki"),
        ("8Ei", "9223372036854775807"),
        ("1000", "1k"),
        ("1000000", "1M"),
        ("1500", "1500"),
        ("1.5", "1500m"),
        ("0.001", "1m"),
        ("100m", "100m"),
        ("0", "0"),
        ("1n", "1n"),
        ("0.5n", "1n"),
        ("12E", "12E"),
        ("1024", "1024"),
        ("1e3", "1e3"),
        ("1.5e3", "1500"),
        ("1e-3", "1e-3"),
        ("1e-12", "1e-9"),
    ],
)
def test_canonical_format(text: str, canonical: str) -> None:
    q, fmt = parse_quantity_format(text)
    assert format_quantity(q, fmt) == canonical
    assert parse_quantity(canonical) == q


@pytest.mark.parametrize(
    "text, shortest", [("80Gi", "80Gi"), ("40G", "40G"), ("500m", "500m"), ("2", "2"), ("1000", "1k"), ("1024", "1Ki"), ("2G", "2G"), ("1536Mi", "1536Mi")]
)
def test_format_without_format_picks_the_shorter_spelling(text: str, shortest: str) -> None:
    assert format_quantity(parse_quantity(text)) == shortest


nanos = st.integers(min_value=-(10**30), max_value=10**30)


@given(nanos, st.sampled_from([None, "DecimalSI", "BinarySI", "DecimalExponent"]))
def test_format_parse_round_trip(q: int, fmt: str | None) -> None:
    text = format_quantity(q, fmt)  # type: ignore[arg-type]
    if text.endswith("i") and abs(q) > (2**63 - 1) * NANO:
        # sums may exceed what parsing allows: Kubernetes caps a parsed BinarySI value at int64
        assert parse_quantity(text) == (2**63 - 1) * NANO * (1 if q > 0 else -1)
    else:
        assert parse_quantity(text) == q


@given(st.decimals(min_value=Decimal("-1e15"), max_value=Decimal("1e15"), allow_nan=False, places=9))
def test_parse_is_exact(d: Decimal) -> None:
    text = format(d, "f")
    assert parse_quantity(text) == int(d * NANO)


@given(nanos, nanos)
def test_arithmetic_is_exact_and_ordered(a: int, b: int) -> None:
    total = a + b
    assert total - b == a
    assert (a < b) == (parse_quantity(format_quantity(a)) < parse_quantity(format_quantity(b)))


@given(nanos, nanos)
def test_order_preserving_key(a: int, b: int) -> None:
    """The fast evaluator compares quantities by this string key: its order is the value order."""
    ka, kb = quantity_key(a), quantity_key(b)
    assert (ka < kb) == (a < b) and (ka == kb) == (a == b)
    assert key_nano(ka) == a


def test_as_int64() -> None:
    assert as_int64(parse_quantity("80Gi")) == 80 * 2**30
    assert as_int64(parse_quantity("1500m")) is None
    assert as_int64(parse_quantity("9999999999999999999999999999999999999G")) is None
    assert as_int64(parse_quantity("-9223372036854775808")) == -(2**63)


# --- semver ------------------------------------------------------------------------------


def test_semver_precedence_follows_semver_org() -> None:
    ordered = [
        "1.0.0-alpha",
        "1.0.0-alpha.1",
        "1.0.0-alpha.beta",
        "1.0.0-beta",
        "1.0.0-beta.2",
        "1.0.0-beta.11",
        "1.0.0-rc.1",
        "1.0.0",
        "1.0.1",
        "1.1.0",
        "2.0.0",
        "10.0.0",
    ]
    parsed = [parse_semver(v) for v in ordered]
    assert parsed == sorted(parsed)
    assert len(set(parsed)) == len(parsed)


def test_semver_build_metadata_is_ignored() -> None:
    assert parse_semver("550.54.15+build.2") == parse_semver("550.54.15")


@pytest.mark.parametrize("text", ["1.2", "v1.2.3", "1.02.3", "1.2.3-01", "1.2.3-", "1.2.3+", "", "a.b.c", "1.2.3.4", " 1.2.3", "1.2.3-a..b"])
def test_semver_strict_rejects(text: str) -> None:
    assert not is_semver(text)
    with pytest.raises(ValueError, match="invalid semantic version"):
        parse_semver(text)


@pytest.mark.parametrize("text, normal", [("v1.2", "1.2.0"), ("1", "1.0.0"), ("1.02.3", "1.2.3"), ("v1.2.3-rc.1", "1.2.3-rc.1"), ("1.2.3", "1.2.3")])
def test_semver_normalize(text: str, normal: str) -> None:
    assert parse_semver(text, normalize=True) == parse_semver(normal)


def test_semver_fields() -> None:
    v = parse_semver("12.4.1-rc.2")
    assert (v.major, v.minor, v.patch) == (12, 4, 1)
