"""What of a device a selector can see: its projection, for sharing verdicts between devices.

Thousands of devices of a fleet differ only in fields no selector reads (uuid,
index, pciBusID). A selector that reads only fields it names literally
(`device.driver`, `device.allowMultipleAllocations`,
`device.attributes["d"].name` or `["d"]["name"]`, `device.capacity["d"].name`,
`has(...)` and `"name" in device.attributes["d"]` on those) gives the same
outcome (match, no match, or a runtime error with the same reason) on every
device whose values of those fields are equal: the selector's `fields` (found
on its AST) and a device's projection of them (projector.py, compiled in the
native build) are what the verdict cache keys such outcomes by.

A selector that reads the device in any way that cannot be listed statically
(a computed index, a whole `device.attributes[...]` map or `device` itself
passed to a function or macro, iterated, compared or bound with `cel.bind`)
has no projection (`fields` returns None) and is evaluated on each device.

Pure: no I/O, no evaluator. A device Kubernetes cannot represent fails every
selector, whatever it reads, so such devices never share (projector.py's
`representable`, worked out as each device arrives).
"""

from __future__ import annotations

import functools

from .cel import compile_selector
from .cel_syntax import Binary, Bind, Comp, Has, Ident, Index, Lit, Node, Select, children
from .projector import Field

_SCALARS = ("driver", "allowMultipleAllocations")
_MAPS = ("attributes", "capacity")


class _Dynamic(Exception):
    """The selector reads the device in a way no list of fields describes."""


def fields(ast: Node) -> tuple[Field, ...] | None:
    """The device fields `ast` can read, sorted, or None when that cannot be listed statically.
    `device` shadowed by a comprehension or `cel.bind` variable is not the device."""
    found: set[Field] = set()
    try:
        _walk(ast, frozenset(), found, {})
    except (_Dynamic, RecursionError):
        return None
    return tuple(sorted(found))


@functools.lru_cache(maxsize=4096)
def fields_of(expression: str) -> tuple[Field, ...] | None:
    """`fields` of a selector expression (cached per expression; it must compile)."""
    return fields(compile_selector(expression).ast)


def _is_device(node: Node, bound: frozenset[str]) -> bool:
    return isinstance(node, Ident) and node.name == "device" and "device" not in bound


Aliases = dict[str, tuple[str, str]]
"""A `cel.bind` variable bound to a domain map -> (outer, domain) of that map."""


def _domain_map(node: Node, bound: frozenset[str], aliases: Aliases) -> tuple[str, str] | None:
    """(outer, domain) when `node` is `device.attributes["domain"]` (or `.domain`; capacity alike),
    or a `cel.bind` variable bound to one (`aliases`)."""
    if isinstance(node, Ident):
        return aliases.get(node.name)
    if isinstance(node, Index) and not node.optional and isinstance(node.index, Lit) and node.index.kind == "string":
        outer, domain = node.operand, node.index.value
    elif isinstance(node, Select) and not node.optional:
        outer, domain = node.operand, node.field
    else:
        return None
    if isinstance(outer, Select) and not outer.optional and outer.field in _MAPS and _is_device(outer.operand, bound):
        return outer.field, domain
    return None


def _walk(node: Node, bound: frozenset[str], found: set[Field], aliases: Aliases) -> None:
    if _is_device(node, bound):
        raise _Dynamic  # `device` itself, not one of its fields
    if isinstance(node, Ident) and node.name in aliases:
        raise _Dynamic  # a bound domain map used whole (iterated, compared, passed on)
    if isinstance(node, Select) and _is_device(node.operand, bound):
        if node.optional or node.field not in _SCALARS:
            raise _Dynamic  # a whole attributes/capacity map, or a field no device has
        found.add((node.field,))
        return
    # a literal name inside a domain map: its presence and value are all that is read
    if isinstance(node, (Select, Has)) and (dm := _domain_map(node.operand, bound, aliases)) is not None:
        found.add((*dm, node.field))
        return
    if (
        isinstance(node, Index)
        and isinstance(node.index, Lit)
        and node.index.kind == "string"
        and (dm := _domain_map(node.operand, bound, aliases)) is not None
    ):
        found.add((*dm, node.index.value))
        return
    if (
        isinstance(node, Binary)
        and node.op == "in"
        and isinstance(node.left, Lit)
        and node.left.kind == "string"
        and (dm := _domain_map(node.right, bound, aliases)) is not None
    ):
        found.add((*dm, node.left.value))
        return
    if isinstance(node, Comp):
        _walk(node.range, bound, found, aliases)
        names = {node.var} | ({node.var2} if node.var2 else set())
        inner = bound | names
        scoped = {k: v for k, v in aliases.items() if k not in names}  # shadowed inside
        _walk(node.pred, inner, found, scoped)
        if node.transform is not None:
            _walk(node.transform, inner, found, scoped)
        return
    if isinstance(node, Bind):
        # `cel.bind(a, device.attributes["d"], body)`: `a.name` in the body reads that one field
        dm = _domain_map(node.init, bound, aliases)
        if dm is None:
            _walk(node.init, bound, found, aliases)
            scoped = {k: v for k, v in aliases.items() if k != node.var}
        else:
            scoped = {**aliases, node.var: dm}
        _walk(node.body, bound | {node.var}, found, scoped)
        return
    for child in children(node):
        _walk(child, bound, found, aliases)
