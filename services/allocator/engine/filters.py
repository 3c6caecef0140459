"""The candidate filters: one pipeline for the search and for `explain`.

A request alternative's candidates on a node are the devices left after each
filter of `FILTERS`, in that order. The first four are bitsets the engine
keeps anyway ("pool": usable devices, "class" and "selectors": the verdicts,
"node": the node's devices); `candidates` starts from the verdict's matches
on the node and runs the device stages of `STAGES`, each a list-to-list
function that keeps what it lets through, in candidate order. The search asks
for the list alone; `explain` also reads how many devices each stage left
(`Candidates.left`: the lengths, so counting costs nothing extra) and the
first taint a device failed on.

A request for All devices is not filtered the same way: every device that
matches and can serve the capacity request belongs to "all", so one held or
tainted device makes the request fail rather than shrink (`_all_devices`).

Pure: reads the inventory and the ledger, changes nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from dralloc.allocator.engine.inventory import NOT_YET, DeviceRec, Inventory, iter_bits
from dralloc.allocator.engine.ledger import Ledger
from dralloc.allocator.engine.plan import Alt, ClaimPlan, Constraint, consumed_capacity, tolerated
from dralloc.allocator.engine.verdicts import Verdict


@dataclass(slots=True, eq=False)
class Request:
    """One request alternative being filtered on one node: what every stage reads."""

    inv: Inventory
    ledger: Ledger
    alt: Alt
    covering: list[Constraint]  # the claim's constraints that cover `alt`
    explain: bool  # whether stages leave notes for `explain` (the search needs none)
    use: dict[int, dict[str, int] | None] = field(default_factory=dict)  # device id -> consumed capacity (capacity stage)
    note: str = ""


Stage = Callable[[Request, list[DeviceRec]], list[DeviceRec]]


def _in_use(rq: Request, recs: list[DeviceRec]) -> list[DeviceRec]:
    """Held exclusively (a shared device too, by a result without a shareID); admin access
    watches a device and may take one in use."""
    if rq.alt.admin:
        return recs
    used = rq.ledger.used_ids
    return [rec for rec in recs if rec.id not in used]


def _counters(rq: Request, recs: list[DeviceRec]) -> list[DeviceRec]:
    """Counter room: admin access consumes no counters."""
    if rq.alt.admin:
        return recs
    ledger = rq.ledger
    used, shares = ledger.used_ids, ledger.shares
    # ledger.counters_fit inlined (it runs per MIG slice): no counters, already active, or room
    return [rec for rec in recs if not rec.consumes or rec.id in used or shares.get(rec.key) or ledger.counter_room(rec)]


def _capacity(rq: Request, recs: list[DeviceRec]) -> list[DeviceRec]:
    """Devices that can serve the capacity request (its policy, and for a shared device what is
    left of it beside the ledger's use; admin access consumes none). Remembers what each kept
    device would consume."""
    alt, use_of, cap_used = rq.alt, rq.use, rq.ledger.cap_used
    out = []
    for rec in recs:
        # plan.consumed_capacity's first case inline: without capacity requests, kept on the device
        use = rec.default_use if not alt.capacity and rec.default_use is not NOT_YET else consumed_capacity(alt, rec)
        if use is None or (rec.multi and not alt.admin and not _room(cap_used.get(rec.id, {}), use, rec)):
            continue
        if rec.multi:
            use_of[rec.id] = use
        out.append(rec)
    return out


def _taints(rq: Request, recs: list[DeviceRec]) -> list[DeviceRec]:
    """Devices whose taints the request tolerates; `explain` notes the first it dropped."""
    tolerations = rq.alt.tolerations
    out = []
    for rec in recs:
        if rec.taints and not all(tolerated(t, tolerations) for t in rec.taints):
            if rq.explain and not rq.note:
                rq.note = f"device {rec.label} is tainted: {taint_text(rq.inv, rec, rq.alt)}"
            continue
        out.append(rec)
    return out


def _constraints(rq: Request, recs: list[DeviceRec]) -> list[DeviceRec]:
    """Devices that have every attribute a constraint covering the request names."""
    if not rq.covering:
        return recs
    names = [c.attribute for c in rq.covering]
    return [rec for rec in recs if all(rec.attribute(a) is not None for a in names)]


STAGES: tuple[tuple[str, Stage], ...] = (
    ("in use", _in_use),
    ("counters", _counters),
    ("capacity", _capacity),
    ("taints", _taints),
    ("constraints", _constraints),
)
"""The device stages, in order."""

FILTERS = ("pool", "class", "selectors", "node", *(name for name, _ in STAGES))
"""The candidate filters, in the order they are applied (what `explain` counts)."""


@dataclass(slots=True, eq=False)
class Candidates:
    """What `candidates` found: the devices in candidate order, what each shared one would
    consume, why the list is short ("" when it is not), the devices left after each stage
    (not for All), and with `explain` a note."""

    recs: list[DeviceRec]
    consumed: dict[int, dict[str, int]]
    problem: str
    left: list[tuple[str, int]]
    emptied_by: str | None  # the first stage that left fewer than wanted (not for All)
    note: str

    def __init__(
        self, recs: list[DeviceRec], consumed: dict[int, dict[str, int]], problem: str, left: list[tuple[str, int]] | None = None, note: str = ""
    ) -> None:
        # written out (one per node tried): mypyc compiles it, not the interpreted one `@dataclass` generates
        self.recs = recs
        self.consumed = consumed
        self.problem = problem
        self.left = [] if left is None else left
        self.emptied_by = None
        self.note = note


def node_devices(inv: Inventory, node: str | None) -> tuple[int, list[int]]:
    """The devices usable from `node` (bitset, ids in candidate order); with no node known at all
    (None), only devices usable from every node."""
    if node is not None:
        return inv.node_mask(node)
    bits = 0
    for i in iter_bits(inv.nonlocal_bits):
        rec = inv.devices[i]
        if rec is not None and rec.all_nodes:
            bits |= 1 << i
    return bits, sorted(iter_bits(bits), key=lambda i: inv.devices[i].order)  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)


def candidates(
    inv: Inventory,
    ledger: Ledger,
    plan: ClaimPlan,
    alt: Alt,
    verdict: Verdict,
    devices_of_node: tuple[int, list[int]],
    node: str | None,
    *,
    explain: bool = False,
) -> Candidates:
    """Devices `alt` (of `plan`) could take on `node` before the choices of other requests are
    known; `devices_of_node` is `node_devices(inv, node)`, `verdict` the alternative's selector
    verdict evaluated on them (`Verdicts.get`). The stages start from the devices that pass the
    first four filters (pool, class, selectors: the verdict, node). `explain`
    also notes the first taint that dropped a device; the devices found are the same."""
    mask, order = devices_of_node
    recs = _in_order(inv, verdict.matched & mask, mask, order)
    covering = [c for c in plan.constraints if c.covers(alt)] if plan.constraints else []
    need = alt.count
    left: list[tuple[str, int]] = []
    if not explain and not alt.all_mode:
        # the search's case: every stage in one pass (the same devices: each stage is a test of
        # one device, independent of the others); what each stage dropped gives the counts
        # per stage, which only a short list needs
        kept, consumed, dropped = _passing(ledger, alt, covering, recs)
        if len(kept) >= need:
            return Candidates(recs=kept, consumed=consumed, problem="")
        out, note = kept, ""
        n = len(recs)
        for (name, _), gone in zip(STAGES, dropped):
            n -= gone
            left.append((name, n))
    else:
        rq = Request(inv=inv, ledger=ledger, alt=alt, covering=covering, explain=explain)
        if alt.all_mode:
            return _all_devices(rq, recs, node)
        out = recs
        for name, stage in STAGES:
            out = stage(rq, out)
            left.append((name, len(out)))
        use_of, note = rq.use, rq.note
        consumed = {rec.id: use for rec in out if rec.multi and (use := use_of.get(rec.id)) is not None} if use_of else {}
    found = Candidates(recs=out, consumed=consumed, problem="", left=left, note=note)
    if len(out) >= need:
        return found  # nothing fell short (each stage only narrows: the last count is the least)
    found.emptied_by = next(name for name, n in left if n < need)
    if len(recs) < need:
        where = f"on node {node}" if node is not None else "usable from every node"
        found.problem = f"{len(recs)} device(s) {where} match the class and selectors, {need} wanted"
    else:
        found.problem = f"only {dict(left)[found.emptied_by]} device(s) left after the '{found.emptied_by}' filter, {need} wanted"
    return found


def _passing(ledger: Ledger, alt: Alt, covering: list[Constraint], recs: list[DeviceRec]) -> tuple[list[DeviceRec], dict[int, dict[str, int]], list[int]]:
    """The devices of `recs` every stage of STAGES keeps, in order, what each shared one would
    consume, and how many devices each stage dropped (per stage of STAGES): the stages' tests
    fused (same order, same results), for a request not for All."""
    admin = alt.admin
    used, shares, cap_used = ledger.used_ids, ledger.shares, ledger.cap_used
    defaults = not alt.capacity
    tolerations = alt.tolerations
    names = [c.attribute for c in covering] if covering else []
    out: list[DeviceRec] = []
    consumed: dict[int, dict[str, int]] = {}
    dropped = [0] * len(STAGES)  # in use, counters, capacity, taints, constraints
    in_use = 0  # (dropped[0], counted in a local: most devices a claim passes are in use)
    for rec in recs:
        if not admin:
            if rec.id in used:
                in_use += 1
                continue
            # (a method call, not a bound method held: native to native, per MIG slice)
            if rec.consumes and not shares.get(rec.key) and not ledger.counter_room(rec):
                dropped[1] += 1  # counters
                continue
        use = rec.default_use
        if not defaults or use is NOT_YET:
            use = consumed_capacity(alt, rec)
        if use is None or (rec.multi and not admin and not _room(cap_used.get(rec.id, {}), use, rec)):
            dropped[2] += 1  # capacity
            continue
        if rec.taints and not all(tolerated(t, tolerations) for t in rec.taints):
            dropped[3] += 1  # taints
            continue
        if names and not all(rec.attribute(a) is not None for a in names):
            dropped[4] += 1  # constraints
            continue
        if rec.multi:
            consumed[rec.id] = use
        out.append(rec)
    dropped[0] = in_use
    return out, consumed, dropped


SPAN_MAX = 4096
"""Up to this span of device ids (the node's lowest to highest), `_in_order` tests bits of a
small int; past it (devices of many slices far apart), of a set."""


SPARSE = 8
"""`_in_order` sorts the matched devices instead of filtering the node's order when they are fewer
than 1/SPARSE of the node's devices."""


def _order_key(rec: DeviceRec) -> tuple[bool, str, str, str, str]:
    return rec.order


def _in_order(inv: Inventory, matched: int, mask: int, order: list[int]) -> list[DeviceRec]:
    """The devices of `matched` (within the node's `mask`) in the node's candidate `order`.
    Bitsets span the fleet: shifting one per device would copy it each time, so it is shifted
    once down to the node's lowest id (a node's devices are mostly one slice, ids together)."""
    if not matched:
        return []
    devices = inv.devices
    if matched == mask:
        # every device of the node (a class of the node's only kind): the order as it is, no
        # bit to test per device (a comprehension: compiled, `list(map(devices.__getitem__, ...))`
        # called the bound method through Python's call protocol per device)
        return [devices[i] for i in order]  # type: ignore[misc]  # ids from a live bitset name live devices (None marks only a removed id)
    low = (mask & -mask).bit_length() - 1
    if mask.bit_length() - low <= SPAN_MAX:
        local = matched >> low
        if local.bit_count() * SPARSE < len(order):
            # a few of many (a node's whole GPUs among its MIG partitions): sorted by the key
            # `order` is sorted by (a stable sort from ascending ids, as `order` was made)
            return sorted([devices[low + j] for j in iter_bits(local)], key=_order_key)  # type: ignore[misc]  # ids from a live bitset name live devices (None marks only a removed id)
        # each device's bit read from the bytes of `local` (compiled: machine integers), not by
        # shifting `local` per device (an int as wide as the node's span made and freed each time)
        data = local.to_bytes((local.bit_length() + 7) >> 3, "little")
        size = len(data)
        found: list[DeviceRec] = []
        for i in order:
            j = i - low
            if j >> 3 < size and (data[j >> 3] >> (j & 7)) & 1:
                found.append(devices[i])  # type: ignore[arg-type]  # ids from a live bitset name live devices (None marks only a removed id)
        return found
    wanted = set(iter_bits(matched))
    return [devices[i] for i in order if i in wanted]  # type: ignore[misc]  # ids from a live bitset name live devices (None marks only a removed id)


def _all_devices(rq: Request, recs: list[DeviceRec], node: str | None) -> Candidates:
    """A request for All devices: every matching device that can serve the capacity request, and
    the first reason one of them cannot be taken (in use, no counter room, a taint not tolerated),
    or an unusable pool near the node (what "all" is cannot be known)."""
    alt, ledger = rq.alt, rq.ledger
    used = ledger.used_ids
    out: list[DeviceRec] = []
    consumed: dict[int, dict[str, int]] = {}
    problem = ""
    for rec in recs:
        use = consumed_capacity(alt, rec)
        if use is None or (rec.multi and not alt.admin and not _room(ledger.cap_used.get(rec.id, {}), use, rec)):
            continue  # not part of "all": it cannot serve the capacity request (as in Kubernetes)
        if not alt.admin and rec.id in used:
            problem = problem or f"device {rec.label} is in use"
        elif not alt.admin and not ledger.counters_fit(rec):
            problem = problem or f"device {rec.label} has no counter room left"
        elif not all(tolerated(t, alt.tolerations) for t in rec.taints):
            problem = problem or f"device {rec.label} has a taint the request does not tolerate ({taint_text(rq.inv, rec, alt)})"
        if rec.multi:
            consumed[rec.id] = use
        out.append(rec)
    if not out:
        problem = "no device matches"
    for pool in rq.inv.unusable_near(node):
        problem = f"asks for all devices, but pool {pool.label} is " + ("invalid" if pool.invalid else "being updated (incomplete)")
    return Candidates(recs=out, consumed=consumed, problem=problem, note=problem)


def room_for(ledger: Ledger, alt: Alt, rec: DeviceRec) -> bool:
    """Whether `rec`, a device not held exclusively, passes the 'counters' and 'capacity' stages
    for `alt` (not admin access) now: the tests `_passing` fuses, for one device. Placement
    reads it to leave out nodes whose free devices the filters would all drop (a MIG node whose
    counters a slice holds, for a whole GPU; a shared GPU whose memory is given out)."""
    if rec.consumes and not ledger.shares.get(rec.key) and not ledger.counter_room(rec):
        return False
    use = consumed_capacity(alt, rec)
    return use is not None and (not rec.multi or _room(ledger.cap_used.get(rec.id, {}), use, rec))


def _room(used: dict[str, int], use: dict[str, int], rec: DeviceRec) -> bool:
    """Whether a shared device has `use` left beside what is `used` of it."""
    # a plain loop, not all(<genexpr>): it runs for every shared device of every node a claim passes
    capacity = rec.capacity
    for name, amount in use.items():  # noqa: SIM110 - the loop is the point (see above)
        if used.get(name, 0) + amount > capacity[name].value:
            return False
    return True


def taint_text(inv: Inventory, rec: DeviceRec, alt: Alt) -> str:
    """The taints `alt` does not tolerate on `rec`, each with where it comes from."""
    return ", ".join(
        f"{t.key}={t.value or ''}:{t.effect} from {src}" for t, src in zip(rec.taints, inv.taint_sources(rec)) if not tolerated(t, alt.tolerations)
    )
