"""Semantic versions as Kubernetes' CEL ``semver()`` and version attributes see them.

Parsing is strict SemVer 2.0.0 (blang/semver ``Parse``: no ``v`` prefix, no
leading zeros, all three numbers). ``normalize=True`` is the tolerant mode of
``semver(s, true)``: a ``v`` prefix is dropped, missing minor/patch become 0,
leading zeros are removed.

A version is kept as a tuple that sorts the way SemVer orders versions, so
comparison is plain tuple comparison; build metadata is not part of it (it
does not take part in precedence or equality).
"""

from __future__ import annotations

import re
from typing import NamedTuple

_NUM = r"(?:0|[1-9][0-9]*)"
_IDENT = r"[0-9A-Za-z-]+"
_STRICT = re.compile(rf"({_NUM})\.({_NUM})\.({_NUM})(?:-({_IDENT}(?:\.{_IDENT})*))?(?:\+({_IDENT}(?:\.{_IDENT})*))?\Z")
_MAX = 2**64 - 1  # blang/semver keeps uint64 numbers


class Version(NamedTuple):
    """Precedence order: numbers, then release > any pre-release, then pre-release fields."""

    major: int
    minor: int
    patch: int
    release: bool  # True when there is no pre-release part (sorts after pre-releases)
    pre: tuple[tuple[int, int | str], ...]  # (0, n) numeric sorts before (1, "s") alphanumeric


def parse_semver(text: str, normalize: bool = False) -> Version:
    """Parse a semantic version; raises ValueError with the reason."""
    if not isinstance(text, str):
        raise ValueError(f"invalid semantic version {text!r}: expected a string")
    source = _normalize(text) if normalize else text
    m = _STRICT.match(source)
    if m is None:
        raise ValueError(f"invalid semantic version {text!r}: expected MAJOR.MINOR.PATCH[-PRERELEASE][+BUILD]")
    major, minor, patch = (int(g) for g in m.group(1, 2, 3))
    if max(major, minor, patch) > _MAX:
        raise ValueError(f"invalid semantic version {text!r}: number out of range")
    pre: list[tuple[int, int | str]] = []
    for part in (m.group(4) or "").split(".") if m.group(4) else ():
        if part.isdigit():
            if len(part) > 1 and part[0] == "0":
                raise ValueError(f"invalid semantic version {text!r}: leading zero in pre-release {part!r}")
            pre.append((0, int(part)))
        else:
            pre.append((1, part))
    return Version(major, minor, patch, not pre, tuple(pre))


def _normalize(text: str) -> str:
    """Tolerant form: "v1.2" -> "1.2.0", "1.02.3" -> "1.2.3"."""
    text = text.removeprefix("v")
    core = text[: len(text) - len(text.lstrip("0123456789."))]  # the leading run of digits and dots
    rest = text[len(core) :]
    parts = core.split(".") if core else []
    if not parts or len(parts) > 3 or any(not p for p in parts):
        return text  # leave it to the strict parser to reject
    parts = [p.lstrip("0") or "0" for p in parts] + ["0"] * (3 - len(parts))
    return ".".join(parts) + rest


def is_semver(text: str, normalize: bool = False) -> bool:
    try:
        parse_semver(text, normalize)
    except ValueError:
        return False
    return True


def compare(a: Version, b: Version) -> int:
    return (a > b) - (a < b)
