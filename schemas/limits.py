"""Structural limits on untrusted input: nesting depth and integer size, checked before decoding.

msgspec, PyYAML's constructors and `json` recurse once per nesting level and raise
`RecursionError` (not a decode error) at about a thousand levels, wherever in the
document the nesting sits: in a field dralloc ignores, or inside a claim's opaque
driver parameters, which dralloc carries without reading. And msgspec decodes a
400-digit JSON integer into a Python int without complaint. So every path that
decodes bytes nobody vouches for (bus events, KV values, Kubernetes responses,
manifest files) asks here first and refuses with a reason:

- `json_problem(data)`: raw JSON bytes, before any decoder sees them. Cheap: the
  usual message has fewer brackets than the depth limit and no run of 19 digits,
  and is passed after two C-speed scans; an inventory slice (hundreds of brackets,
  none inside a string) after a few more (`_brackets`).
- `tree_problem(doc)`: an already parsed document (YAML's builtins), iteratively.
- `without_deep_items(data)`: a Kubernetes list `json_problem` refused, with the items
  that are too deep cut out (and named), so that the others can still be read.
- `slice_problem(slice)`: a decoded ResourceSlice against the API's size limits, cheaply.

The checks return None when the input is within limits, or one line naming the problem.
Kubernetes stores every integer field as int64, so a larger integer is refused
(the API server would refuse it too); depth is limited to `MAX_DEPTH`, far beyond
what any resource.k8s.io object needs (about 12 levels, inside an event envelope)
and far below the recursion limit.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from dralloc.schemas.resource import ResourceSlice
from dralloc.schemas.validation import (
    ATTRIBUTES_AND_CAPACITY_MAX,
    CONSUMPTIONS_PER_DEVICE_MAX,
    COUNTERS_PER_SET_MAX,
    SHARED_COUNTERS_MAX,
    SLICE_DEVICES_MAX,
    SLICE_DEVICES_WITH_COUNTERS_MAX,
    is_dns_label,
    skip_node_operations_problem,
)

MAX_DEPTH = 100
"""Deepest nesting of arrays and objects accepted (a Kubernetes object needs about 12)."""

INT_MIN, INT_MAX = -(2**63), 2**63 - 1
"""Kubernetes' int64: every integer field of the API (generation, counts, attribute values)."""

MAX_NODES = 2_000_000
"""Most values in one parsed document: YAML aliases can make a small file a huge tree."""

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
# Structure alone: `{}` become `[]` (a type mismatch is the decoder's to report, depth is the same).
_BRACKETS_ONLY = bytes.maketrans(b"{}", b"[]"), bytes(b for b in range(256) if b not in b"[]{}")
_BRACKETS_AND_QUOTES = bytes.maketrans(b"{}", b"[]"), bytes(b for b in range(256) if b not in b'[]{}"')
_DIGITS_AS_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19  # the shortest run of digits that can be outside int64
# An integer token of 19 digits or more: not part of a fraction or an exponent.
_BIG_INT = re.compile(rb"(?<![\d.eE+-])-?\d{19,}(?![\d.eE])")


def json_problem(data: bytes | str | msgspec.Raw) -> str | None:
    """Why raw JSON must not be decoded (too deep, an integer outside int64), or None.

    Malformed JSON that is within limits is passed: the decoder names that problem better."""
    raw = data if isinstance(data, bytes) else data.encode() if isinstance(data, str) else bytes(data)  # (msgspec.Raw)
    deep = raw.count(b"[") + raw.count(b"{") > MAX_DEPTH
    long_digits = _LONG_RUN in raw.translate(_DIGITS_AS_ZERO)
    if not deep and not long_digits:
        return None  # the usual claim: fewer brackets than the limit, no long number anywhere
    if deep and _depth(_brackets(raw)) > MAX_DEPTH:
        return f"nested more than {MAX_DEPTH} levels deep"
    if long_digits:
        for match in _BIG_INT.finditer(_without_strings(raw)):  # (digits inside strings are text)
            if not INT_MIN <= int(match.group()) <= INT_MAX:
                digits = len(match.group().lstrip(b"-"))
                return f"an integer of {digits} digits, outside the 64-bit range every integer field has"
    return None


def _brackets(raw: bytes) -> bytes:
    """The JSON text's structure: its brackets outside strings, in order, each as `[` or `]`.

    Fast when no string holds a bracket (an inventory slice: hundreds of brackets, all structure).
    The text reduced to brackets and quotes (C speed) then has every string as ``""``: with no
    escaped quote, pairing its quotes left to right, each next to the next, pairs them all. Any
    quote left unpaired is a string holding a bracket (or malformed text): then the strings are
    taken out of the text first (`_without_strings`)."""
    if b"\\" not in raw or b'\\"' not in raw:
        skeleton = raw.translate(*_BRACKETS_AND_QUOTES)
        if 2 * skeleton.count(b'""') == skeleton.count(b'"'):  # (count: non-overlapping, from the left)
            return skeleton.translate(None, b'"')
    return _without_strings(raw).translate(*_BRACKETS_ONLY)


def _without_strings(raw: bytes) -> bytes:
    """The JSON text with every string's content removed (what a parser sees as structure)."""
    if b'\\"' not in raw:  # no escaped quote: every other piece between quotes is a string (C speed)
        return b'""'.join(raw.split(b'"')[0::2])
    return _STRING.sub(b'""', raw)


def _depth(brackets: bytes) -> int:
    """Nesting depth of a string of `[` and `]` alone, up to MAX_DEPTH + 1 (enough to refuse).

    Each round removes the innermost pairs (one `replace`, in C). When no pair is left
    but brackets are (malformed), the `[` left are levels a parser would still enter
    before failing, so they count: the result never understates what a decoder recurses."""
    rounds = 0
    while brackets and rounds <= MAX_DEPTH:
        shorter = brackets.replace(b"[]", b"")
        if len(shorter) == len(brackets):
            return rounds + brackets.count(b"[")
        brackets, rounds = shorter, rounds + 1
    return rounds


def tree_problem(doc: Any, where: str = "") -> str | None:
    """Why a parsed document (dicts, lists, scalars) must not be used, or None: nesting deeper
    than MAX_DEPTH, an integer outside int64, more than MAX_NODES values. Iterative, so a
    deep document cannot exhaust the stack here. `where` prefixes the path in the message."""
    stack: list[tuple[Any, int, str]] = [(doc, 0, where)]
    seen = 0
    while stack:
        value, depth, path = stack.pop()
        seen += 1
        if seen > MAX_NODES:
            return f"more than {MAX_NODES:,} values (YAML aliases expanding?)"
        if isinstance(value, dict | list):
            if depth >= MAX_DEPTH:
                return f"{_short(path) or 'the document'}: nested more than {MAX_DEPTH} levels deep"
            items = value.items() if isinstance(value, dict) else enumerate(value)
            for key, item in items:
                stack.append((item, depth + 1, f"{path}.{key}" if path else str(key)))
        elif isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
            return f"{_short(path) or 'the document'}: an integer of {len(str(abs(value)))} digits, outside the 64-bit range"
    return None


def _short(path: str, limit: int = 80) -> str:
    """A path for a message: a deep one is cut after its first `limit` characters."""
    return path if len(path) <= limit else f"{path[:limit]}..."


def slice_problem(slice_: ResourceSlice) -> str | None:
    """Why a ResourceSlice from the bus must not enter the inventory, or None: the API server's
    limits that bound what one slice costs the allocator (devices per slice, attributes and
    capacities per device, counter sets and counters and what a device consumes, device names
    unique DNS labels, counter set and counter names DNS labels where they are defined), and the
    slice's `skipNodeOperations` (copied into the status of every claim its devices serve). The full
    validation (`validation.validate`, ~0.2 ms per device) runs where slices enter from files;
    this is what every consumer can afford for every slice (~1 us per device)."""
    spec = slice_.spec
    devices = spec.devices
    limited = any(d.consumes_counters or d.taints for d in devices)
    limit = SLICE_DEVICES_WITH_COUNTERS_MAX if limited else SLICE_DEVICES_MAX
    if len(devices) > limit:
        why = " with counters or taints" if limited else ""
        return f"spec.devices: at most {limit} devices per slice{why}, has {len(devices):,}"
    if problem := skip_node_operations_problem(spec.skip_node_operations):
        return f"spec.skipNodeOperations: {problem}"  # (copied into every claim it serves)
    if len(spec.shared_counters) > SHARED_COUNTERS_MAX:
        return f"spec.sharedCounters: at most {SHARED_COUNTERS_MAX} counter sets, has {len(spec.shared_counters):,}"
    for i, counter_set in enumerate(spec.shared_counters):
        if len(counter_set.counters) > COUNTERS_PER_SET_MAX:
            return f"spec.sharedCounters[{i}].counters: at most {COUNTERS_PER_SET_MAX} counters, has {len(counter_set.counters):,}"
        # (what devices consume must be defined in the pool, so naming the definitions names all)
        if not is_dns_label(counter_set.name):
            return f"spec.sharedCounters[{i}].name: {_short(counter_set.name)!r} is not a DNS label"
        for counter in counter_set.counters:
            if not is_dns_label(counter):
                return f"spec.sharedCounters[{i}].counters: {_short(counter)!r} is not a DNS label"
    names: set[str] = set()
    for i, device in enumerate(devices):
        if not is_dns_label(device.name):
            return f"spec.devices[{i}].name: {device.name!r} is not a DNS label"
        if device.name in names:
            return f"spec.devices[{i}].name: duplicate device name {device.name!r}"
        names.add(device.name)
        if len(device.consumes_counters) > CONSUMPTIONS_PER_DEVICE_MAX:
            return f"spec.devices[{i}].consumesCounters: at most {CONSUMPTIONS_PER_DEVICE_MAX} entries, has {len(device.consumes_counters):,}"
        if len(device.attributes) + len(device.capacity) > ATTRIBUTES_AND_CAPACITY_MAX:
            return f"spec.devices[{i}]: at most {ATTRIBUTES_AND_CAPACITY_MAX} attributes and capacities together, has {len(device.attributes) + len(device.capacity):,}"
    return None


_NAME = re.compile(rb'"name"\s*:\s*"([^"\\]{1,253})"')
_NAMESPACE = re.compile(rb'"namespace"\s*:\s*"([^"\\]{1,63})"')


def without_deep_items(data: bytes, level: int = 2) -> tuple[bytes, list[str]]:
    """`data` (a JSON document `json_problem` refused) with every container that opens at nesting
    `level` (2: the items of a Kubernetes list, ``{"items": [<here>]}``) and is nested more than
    MAX_DEPTH levels itself replaced by ``null``; and, for each one replaced, its ``namespace/name``
    as far as its first bytes tell (``?`` when they do not). The rest of the document can then be
    decoded, and each remaining item judged alone. A Python scan of every byte: only for the rare
    document that needs it (a 3 MB list takes about a second)."""
    spans: list[tuple[int, int]] = []
    depth, deepest, start = 0, 0, -1
    in_string = escaped = False
    for i, byte in enumerate(data):
        if in_string:
            if escaped:
                escaped = False
            elif byte == 0x5C:  # backslash
                escaped = True
            elif byte == 0x22:
                in_string = False
        elif byte == 0x22:
            in_string = True
        elif byte in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth == level + 1:
                start, deepest = i, depth
            elif depth > deepest:
                deepest = depth
        elif byte in (0x5D, 0x7D):  # ] }
            if depth == level + 1 and start >= 0:
                if deepest - level > MAX_DEPTH:
                    spans.append((start, i + 1))
                start = -1
            depth -= 1
    if not spans:
        return data, []
    out, names, at = bytearray(), [], 0
    for begin, end in spans:
        out += data[at:begin] + b"null"
        head = data[begin : min(end, begin + 4096)]
        name, namespace = _NAME.search(head), _NAMESPACE.search(head)
        label = name.group(1).decode(errors="replace") if name else "?"
        names.append(f"{namespace.group(1).decode(errors='replace')}/{label}" if namespace and name else label)
        at = end
    out += data[at:]
    return bytes(out), names
