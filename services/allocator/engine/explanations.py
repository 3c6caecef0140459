"""Explanations: why the engine placed a unit where it did, or could not place it.

For `allocate(..., explain=True)` (`dralloc explain`): per node, per request,
how many devices were left after each candidate filter (`FILTERS`), the
verdict of each node, and notes (nodes not tried, unusable pools, the node a
waiting claim would hold). Built from the engine's parts after the search has
decided; nothing here changes what the engine allocates. The filter counts
past "node" come from the pipeline the search runs (`filters.candidates`), so
they describe the state the search saw.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import msgspec

from dralloc.allocator.engine.filters import candidates, node_devices
from dralloc.allocator.engine.gang import describe_held_whole, reservation_for
from dralloc.allocator.engine.placement import demand_of

if TYPE_CHECKING:
    from dralloc.allocator.engine.engine import Engine
    from dralloc.allocator.engine.plan import Alt, ClaimPlan
    from dralloc.allocator.engine.search import Slot

EXPLAIN_GLOBAL_MAX = 4096
"""Up to this many usable devices, `explain` counts class and selector matches over all of them."""


class FilterCount(msgspec.Struct, kw_only=True):
    filter: str
    left: int


class RequestReport(msgspec.Struct, kw_only=True, omit_defaults=True):
    claim: str
    request: str  # "req" or "req/sub"
    wanted: str  # "2" or "all"
    filters: list[FilterCount] = []
    emptied_by: str | None = None  # the first filter that left fewer devices than wanted
    devices: list[str] = []  # the chosen devices (allocated) as driver/pool/device
    note: str = ""


class NodeReport(msgspec.Struct, kw_only=True, omit_defaults=True):
    node: str | None
    requests: list[RequestReport] = []
    verdict: str = ""


class Explanation(msgspec.Struct, kw_only=True, omit_defaults=True):
    nodes: list[NodeReport] = []
    notes: list[str] = []


def request_report(engine: Engine, plan: ClaimPlan, alt: Alt, devices: tuple[int, list[int]], node: str | None = None) -> RequestReport:
    """Devices left after each filter for one request (`alt` of `plan`) on one node (`devices`:
    `filters.node_devices` of it). The first counts
    (pool, class, selectors) cover every usable device, or in an inventory over
    EXPLAIN_GLOBAL_MAX devices only the node's (selectors are evaluated lazily)."""
    report = RequestReport(claim=plan.key, request=alt.result_name, wanted="all" if alt.all_mode else str(alt.count))
    mask = devices[0]
    live = engine.inventory.live
    universe = live if live.bit_count() <= EXPLAIN_GLOBAL_MAX else mask & live
    cls = engine.verdicts.class_only(alt, universe)
    full = engine.verdicts.get(alt, universe)
    counts = [
        ("pool", universe.bit_count()),
        ("class", (cls.matched & universe).bit_count()),
        ("selectors", (full.matched & universe).bit_count()),
        ("node", (full.matched & universe & mask).bit_count()),
    ]
    report.filters = [FilterCount(filter=f, left=n) for f, n in counts]
    need = 1 if alt.all_mode else alt.count
    for f, n in counts:
        if n < need:
            report.emptied_by = f
            break
    found = candidates(engine.inventory, engine.ledger, plan, alt, engine.verdicts.get(alt, mask), devices, node, explain=True)
    report.filters += [FilterCount(filter=f, left=n) for f, n in found.left]
    report.note = found.note
    if alt.all_mode and found.problem:
        report.emptied_by = report.emptied_by or "all"
    report.emptied_by = report.emptied_by or found.emptied_by
    return report


def explain_failure(engine: Engine, plans: list[ClaimPlan], node: str | None, nodes: list[str | None], reasons: list[tuple[str | None, str]]) -> Explanation:
    """Why a unit (`plans`) could not be placed: `node` the node it was asked for (None: the engine
    picked), `nodes` those tried in order, `reasons` (node, why) of each refusal. Reports up to
    `engine.explain_nodes` nodes (with `engine.explain_untried` also those never tried), and notes
    on the nodes skipped, unusable pools and, for one claim, what it would hold while it waits."""
    explanation = Explanation()
    inventory = engine.inventory
    known = len(inventory.node_known)
    if node is None and len(nodes) != known:
        explanation.notes.append(
            f"{len(nodes)} of {known} known nodes were tried; the others cannot hold the claims (too few free devices, or none that match{grouped(plans)})"
        )
    for pool in list(inventory.unusable.values())[:5]:
        why = f"invalid: {pool.invalid}" if pool.invalid else f"incomplete: {len(pool.slices)} of {pool.expected} slices of generation {pool.generation}"
        explanation.notes.append(f"pool {pool.label} is not used: {why}")
    if node is None and len(plans) == 1 and not plans[0].error:
        # a large claim that may wait holds the node closest to fitting it (reservations)
        explanation.notes += engine.placement.describe_wait(reservation_for(engine, [plans[0].claim]))
    if node is None:
        explanation.notes += engine.placement.describe_kept(plans)  # whole nodes kept for large claims (keep_whole.py)
        explanation.notes += describe_held_whole(engine, plans)  # held nodes whole again, kept from smaller claims (reservations)
    k = engine.explain_nodes
    if node is None and engine.explain_untried:
        tried = set(nodes)
        nodes = [*nodes, *(n for n in inventory.nodes() if n not in tried)]
    shown = [node] if node is not None else (nodes[:k] or inventory.nodes()[:k] or [None])
    reason_of = dict(reasons)
    for candidate in shown:
        devices = node_devices(inventory, candidate)
        report = NodeReport(node=candidate, verdict=reason_of.get(candidate, ""))
        for plan in plans:
            for request in plan.requests:
                for alt in request.alts:
                    report.requests.append(request_report(engine, plan, alt, devices, node=candidate))
        explanation.nodes.append(report)
    return explanation


def explain_success(engine: Engine, plan: ClaimPlan, node: str | None, slots: list[Slot]) -> Explanation:
    """Where one claim (`plan`) was placed: on `node`, the devices of each slot, with the filter
    counts of the state the search saw (call it before the allocation is committed), and the
    placement's notes on the choice."""
    devices = node_devices(engine.inventory, node)
    report = NodeReport(node=node, verdict="allocated: the first devices in candidate order (driver/pool/slice/device) that satisfy every constraint")
    for slot in slots:
        request = request_report(engine, plan, slot.alt, devices, node=node)
        request.devices = [rec.label for rec in slot.chosen]
        report.requests.append(request)
    chosen = [rec for slot in slots for rec in slot.chosen]
    return Explanation(nodes=[report], notes=engine.placement.describe(node, chosen, demand_of([plan])))


def grouped(plans: list[ClaimPlan]) -> str:
    """Words for the matchAttribute groups a node must have (`Alt.group`), for messages about
    nodes skipped without a try; empty when no request asks for one."""
    groups = sorted({(alt.group, a) for plan in plans for request in plan.requests for alt in request.alts if alt.group for a in alt.match_attributes})
    return "".join(f", or no {n} of them with one value of {a} (matchAttribute)" for n, a in groups)
