"""`cel_syntax.children` / `map_children`, the AST's one traversal (the diagnosis, dralloc.hardware's
reference finder and rewriter use it): every subexpression of every node kind is visited and rebuilt.

A node kind added to the AST but not to these two functions would silently hide its subtree from
every user; this compares them with a generic walk over the dataclass fields, on the selector corpus
and on expressions that use every node kind (two-variable comprehensions, optionals, cel.bind).
"""

from __future__ import annotations

import dataclasses
import typing
from collections import Counter
from pathlib import Path

import pytest
import yaml

from dralloc.allocator.engine.cel_syntax import Call, CelSyntaxError, Lit, Node, children, map_children, parse

CORPUS = yaml.safe_load((Path(__file__).parent / "selectors.yaml").read_text())
EXTRA = [
    'cel.bind(a, device.attributes["gpu.nvidia.com"], a.?model.orValue("") == "x" && a[?"index"].hasValue())',
    'device.attributes["gpu.nvidia.com"].all(k, v, k.startsWith("c") || v != 0)',
    '{"a": 1, "b": [1, 2]}.transformMap(k, v, k != "", size(v) > 0 ? v : 0).size() == 2',
    "[1, 2, 3].map(x, x > 1, x * 2).exists_one(y, y == 4) ? -1 < 0 : !false",
    'device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("40Gi")) >= 0',
    'has(device.attributes["dra.net"].rdma) && device.driver.matches("^dra")',
]


def _parses(expression: str) -> bool:
    try:
        parse(expression)
    except CelSyntaxError:
        return False
    return True


# (the corpus's syntax errors have no tree to walk)
EXPRESSIONS = [case["expression"] for case in CORPUS["selectors"] if _parses(case["expression"])] + EXTRA


def _field_nodes(node: Node) -> list[Node]:
    """The Node values among `node`'s fields (tuples of nodes, and of node pairs, flattened)."""
    kinds = typing.get_args(Node)
    out: list[Node] = []
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        for item in value if isinstance(value, tuple) else (value,):
            out += [x for x in (item if isinstance(item, tuple) else (item,)) if isinstance(x, kinds)]
    return out


def _all_nodes(root: Node) -> list[Node]:
    found, stack = [], [root]
    while stack:
        node = stack.pop()
        found.append(node)
        stack += _field_nodes(node)
    return found


@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_children_are_every_subexpression_and_map_children_rebuilds_them(expression: str) -> None:
    ast = parse(expression)
    for node in _all_nodes(ast):
        assert Counter(map(id, children(node))) == Counter(map(id, _field_nodes(node))), type(node).__name__
        assert map_children(node, lambda child: child) == node
    # a rewrite through map_children reaches every literal: none of the old ones is left, none is lost
    rewritten = _all_nodes(_replace_literals(ast))
    literals = [n for n in _all_nodes(ast) if isinstance(n, Lit)]
    assert [n for n in rewritten if isinstance(n, Lit)] == [MARKER] * len(literals)
    assert len(rewritten) == len(_all_nodes(ast))


MARKER = Lit("\x00marker", "string")


def _replace_literals(node: Node) -> Node:
    return MARKER if isinstance(node, Lit) else map_children(node, _replace_literals)


def test_a_calls_target_comes_before_its_arguments() -> None:
    ast = parse('device.driver.startsWith("gpu")')
    assert isinstance(ast, Call)
    assert children(ast) == [ast.target, *ast.args]
