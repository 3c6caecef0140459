"""`dralloc explain` in an operator's words: nodes grouped by verdict, holders named, a change suggested.

Pure: takes the engine's Explanation of one claim (per node, per request, how
many devices each filter left) and who holds what (`holders`: node -> claims
with devices there), and returns groups of nodes whose reports are the same,
each with one sentence: what stopped the claim there, which claims hold the
devices, counters or capacity that it needed, and what would make it fit.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dralloc.allocator.engine import Explanation
from dralloc.allocator.engine.explanations import NodeReport, RequestReport

MAX_NAMED = 5
"""Nodes and holders named in a sentence; the rest are counted."""


@dataclass(slots=True)
class Group:
    """Nodes with the same verdict for a claim, and that verdict in words."""

    nodes: list[str | None]
    verdict: str
    holders: list[str] = field(default_factory=list)
    report: NodeReport | None = None
    """The first node's report (the table shown for the whole group)."""


def _signature(report: NodeReport, claim: str) -> tuple:
    return tuple(
        (r.request, r.wanted, tuple((f.filter, f.left) for f in r.filters), r.emptied_by, bool(r.devices)) for r in report.requests if r.claim == claim
    )


def names(items: Sequence[str | None], limit: int = MAX_NAMED) -> str:
    """`a, b, c` or `a, b, c and 4 more`."""
    shown = [str(i) if i is not None else "(any node)" for i in items[:limit]]
    more = len(items) - len(shown)
    return ", ".join(shown) + (f" and {more} more" if more > 0 else "")


def group_nodes(explanation: Explanation, claim: str, holders: Mapping[str | None, Sequence[str]] = {}) -> list[Group]:  # noqa: B006 - read only
    """The claim's node reports grouped by identical counts and verdicts, largest group first
    (ties: the first node's order), each with its sentence."""
    groups: dict[tuple, Group] = {}
    for report in explanation.nodes:
        key = _signature(report, claim)
        group = groups.get(key)
        if group is None:
            group = groups[key] = Group(nodes=[], verdict="", report=report)
        group.nodes.append(report.node)
        for holder in holders.get(report.node, ()):
            if holder != claim and holder not in group.holders:
                group.holders.append(holder)
    ordered = sorted(groups.values(), key=lambda g: -len(g.nodes))
    for group in ordered:
        assert group.report is not None
        group.verdict = sentence(group, claim)
    return ordered


def _before(request: RequestReport, name: str) -> int | None:
    previous = None
    for f in request.filters:
        if f.filter == name:
            return previous
        previous = f.left
    return None


def _left(request: RequestReport, name: str) -> int | None:
    return next((f.left for f in request.filters if f.filter == name), None)


def sentence(group: Group, claim: str) -> str:
    """One line: how many nodes, what stopped the claim there, who holds what, what to change."""
    assert group.report is not None
    count = len(group.nodes)
    where = f"{count} node{'s' if count != 1 else ''}" if group.nodes != [None] else "devices usable from every node"
    requests = [r for r in group.report.requests if r.claim == claim]
    if requests and all(r.devices for r in requests):
        return f"{where}: allocated here"
    blocked = next((r for r in requests if r.emptied_by), None)
    if blocked is None:
        return f"{where}: {group.report.verdict}" if group.report.verdict else where
    held = f"held by {names(group.holders)}" if group.holders else "held by other claims"
    f, wanted = blocked.emptied_by, blocked.wanted
    after, before = _left(blocked, f or ""), _before(blocked, f or "")
    each = " each" if count > 1 else ""
    what = f"request {blocked.request}"
    match f:
        case "node":
            return (
                f"{where}: only {after} matching devices{each}, {wanted} wanted ({what}): "
                "split the claim, or use a gang (several claims allocated together: dralloc submit --gang)"
            )
        case "in use":
            return (
                f"{where}: {after} of {before} matching devices free{each}, {wanted} wanted ({what}); the others are {held}: "
                "wait for them to be released, or ask for fewer"
            )
        case "counters":
            return (
                f"{where}: {after} of {before} matching devices{each} have their shared counters free, {wanted} wanted ({what}): "
                f"partitions (MIG) {held} use the GPU's memory slices; a whole GPU needs them all: "
                "ask for a partition instead, or wait for the partitions to be released"
            )
        case "capacity":
            return (
                f"{where}: {after} of {before} matching devices{each} have the capacity left, {wanted} wanted ({what}); "
                f"capacity is {held}: ask for less capacity, or wait"
            )
        case "taints":
            return (
                f"{where}: {(before or 0) - (after or 0)} matching devices{each} are tainted, {wanted} wanted ({what}): "
                "add a toleration to the request if the taint allows it, or wait for the taint to go"
            )
        case "constraints":
            return (
                f"{where}: no {wanted} devices satisfy the claim's constraints together ({what}; {before} candidates{each}): "
                "relax the matchAttribute/distinctAttribute, or ask for fewer devices"
            )
        case "class" | "selectors":
            return f"{where}: {after} devices{each} match the {f}, {wanted} wanted ({what}): check the selectors against the hardware with `dralloc lint`"
        case "pool":
            return f"{where}: no usable pool ({what}): a pool is incomplete or its slices disagree on the generation"
    return f"{where}: {group.report.verdict}" if group.report.verdict else f"{where}: blocked by {f} ({what})"
