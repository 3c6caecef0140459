"""Rendering outcomes and explanations for people (rich) and machines (JSON/YAML)."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence

import msgspec
import yaml
from rich.console import Console
from rich.table import Table

from dralloc.allocator.engine import Outcome
from dralloc.allocator.verdicts_text import Group, group_nodes, names

MESSAGE_MAX = 300
"""Longer messages are cut when printed for people (a 10 KB expression is never repeated in full)."""


def cut(text: str, limit: int = MESSAGE_MAX) -> str:
    """`text` as printed in a table or line: whole when short, else its start and its length."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


CEL_ERROR_RULE = (
    "CEL runtime errors: a selector that fails at run time (a missing attribute, a type mismatch) on a device "
    "the request could otherwise take on a node - reachable from it, in a usable pool, not held exclusively by "
    "another claim unless the request has admin access or asks for All - makes that node unusable for the claim. "
    "With --node the claim is an error; when the engine picks the node it uses one without such failures and "
    "reports the error only if no node fits. The verdict never depends on the order the search visits devices in "
    "(Kubernetes reports such an error only when its search happens to reach that device)."
)


def _entry(outcome: Outcome, pods: Mapping[str, str]) -> dict:
    """One result: the contract entry, plus `"pod"` for a claim allocated for a Pod."""
    entry = outcome.contract()
    if outcome.claim in pods:
        entry["pod"] = pods[outcome.claim]
    return entry


def document(outcomes: Sequence[Outcome], pods: Mapping[str, str] | None = None) -> dict:
    """The `allocate -o json` document (CLI-CONTRACT.md); `pods`: claim -> the Pod it was made or named for."""
    return {"results": [_entry(o, pods or {}) for o in outcomes]}


def render_allocate(outcomes: Sequence[Outcome], output: str, console: Console, pods: Mapping[str, str] | None = None) -> None:
    if output == "json":
        console.file.write(json.dumps(document(outcomes, pods), indent=2) + "\n")
    elif output == "yaml":
        console.file.write(yaml.safe_dump(document(outcomes, pods), sort_keys=False))
    else:
        pods = pods or {}
        with_pods = any(o.claim in pods for o in outcomes)
        table = Table(title="allocations", title_justify="left", box=None, header_style="bold")
        for column in ("claim", *(["pod"] if with_pods else []), "status", "node", "devices", "message"):
            table.add_column(column)
        for o in outcomes:
            devices = "\n".join(f"{r.request}: {r.driver}/{r.pool}/{r.device}" for r in o.allocation.devices.results) if o.allocation else ""
            style = {"allocated": "green", "unsatisfiable": "yellow", "error": "red"}[o.status]
            pod = [pods.get(o.claim, "")] if with_pods else []
            table.add_row(o.claim, *pod, f"[{style}]{o.status}[/]", o.node or "", devices, cut(o.message))
        console.print(table)


Holders = Mapping[str, Mapping[str | None, Sequence[str]]]
"""claim -> node -> the claims holding devices on that node when the claim was decided."""


def _groups(o: Outcome, holders: Holders) -> list[Group]:
    if o.explanation is None or o.status == "allocated":
        return []
    return group_nodes(o.explanation, o.claim, holders.get(o.claim, {}))


def explain_document(outcomes: Sequence[Outcome], holders: Holders | None = None, pods: Mapping[str, str] | None = None) -> dict:
    """The `explain -o json` document: each claim's result, the engine's explanation, and for a claim
    not allocated its nodes grouped by verdict (`groups`: nodes, verdict, holders)."""
    claims = []
    for o in outcomes:
        entry = {**_entry(o, pods or {}), "explanation": msgspec.to_builtins(o.explanation) if o.explanation is not None else None}
        groups = _groups(o, holders or {})
        if groups:
            entry["groups"] = [{"nodes": g.nodes, "verdict": g.verdict, "holders": g.holders} for g in groups]
        claims.append(entry)
    return {"rules": {"celRuntimeErrors": CEL_ERROR_RULE}, "claims": claims}


def render_explain(outcomes: Sequence[Outcome], output: str, console: Console, holders: Holders | None = None, pods: Mapping[str, str] | None = None) -> None:
    """Each claim: its status and message; nodes with the same verdict grouped under one sentence and
    one table (a claim allocated: its node's table, why these devices)."""
    if output == "json":
        console.file.write(json.dumps(explain_document(outcomes, holders, pods), indent=2) + "\n")
        return
    if output == "yaml":
        console.file.write(yaml.safe_dump(explain_document(outcomes, holders, pods), sort_keys=False))
        return
    for o in outcomes:
        style = {"allocated": "green", "unsatisfiable": "yellow", "error": "red"}[o.status]
        pod = f" (Pod {pods[o.claim]})" if pods and o.claim in pods else ""
        console.print(f"[bold]{o.claim}[/]{pod}: [{style}]{o.status}[/]" + (f" on {o.node}" if o.node else ""))
        if o.message:
            console.print(f"  {cut(o.message)}")
        if o.explanation is None:
            if o.status == "error":
                console.print(f"  [dim]{CEL_ERROR_RULE}[/]" if "CEL runtime error" in o.message else "")
            continue
        for note in o.explanation.notes:
            console.print(f"  note: {cut(note)}")
        groups = _groups(o, holders or {})
        shown = [(g.report, g) for g in groups] if groups else [(node, None) for node in o.explanation.nodes]
        for node, group in shown:
            assert node is not None
            requests = [r for r in node.requests if r.claim == o.claim]
            if group is not None:
                title = f"{group.verdict}\n  nodes: {names(group.nodes, 8)}"
            else:
                title = f"node {node.node or '(any)'}" + (f": {cut(node.verdict)}" if node.verdict else "")
            table = Table(title=title, title_justify="left", box=None, header_style="bold")
            table.add_column("devices left after")
            for r in requests:
                table.add_column(f"{r.request} (wants {r.wanted})", justify="right")
            filters: list[str] = []
            for r in requests:
                filters += [f.filter for f in r.filters if f.filter not in filters]
            for name in filters:
                cells = []
                for r in requests:
                    left = next((f.left for f in r.filters if f.filter == name), None)
                    cell = "" if left is None else str(left)
                    cells.append(f"[red]{cell}[/]" if r.emptied_by == name else cell)
                table.add_row(name, *cells)
            table.add_row("emptied by", *[r.emptied_by or "" for r in requests])
            table.add_row("chosen / note", *["\n".join(r.devices) or r.note for r in requests])
            console.print(table)
