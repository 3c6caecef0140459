"""The engine: inventory + ledger + search behind one small API.

    engine = Engine()
    engine.apply(obj)                      # DeviceClass | ResourceSlice | Node
    engine.restore(claim)                  # an existing allocation becomes in use
    outcomes = engine.allocate(claims, node=None, together=False)
    engine.release("ns/name")

Allocation works in units: each claim alone, or all claims together
(all-or-nothing, one node). For a unit the engine picks a node (the given one,
or the known nodes in order, skipping those that cannot have enough free
matching devices), filters candidates per request, and runs the search. The
first answer found is committed to the ledger.
"""

from __future__ import annotations

import enum
import itertools
import time
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, Literal

import msgspec

from dralloc.allocator.engine import adoption, cel, moves
from dralloc.allocator.engine.explanations import Explanation, explain_failure, explain_success, grouped
from dralloc.allocator.engine.filters import candidates, node_devices
from dralloc.allocator.engine.inventory import AttrValue, DeviceRec, Inventory, iter_bits
from dralloc.allocator.engine.ledger import Entry, Ledger, Record
from dralloc.allocator.engine.misfits import Misfits
from dralloc.allocator.engine.moves import MovePlan
from dralloc.allocator.engine.placement import Placement
from dralloc.allocator.engine.plan import Alt, ClaimPlan, Constraint, Planner
from dralloc.allocator.engine.search import BudgetExceeded, Search, Slot, elements, independent
from dralloc.allocator.engine.snapshot import EngineSnapshot, Observer
from dralloc.allocator.engine.topology import NodeTopology, value_bits
from dralloc.allocator.engine.verdicts import SelectorBudgetExceeded, Verdict, Verdicts
from dralloc.schemas.quantity import format_quantity, parse_quantity
from dralloc.schemas.resource import (
    AllocationResult,
    DeviceAllocationConfiguration,
    DeviceAllocationResult,
    DeviceClass,
    DeviceRequestAllocationResult,
    DeviceTaintRule,
    Node,
    NodeSelector,
    NodeSelectorRequirement,
    NodeSelectorTerm,
    ResourceClaim,
    ResourceSlice,
)
from dralloc.schemas.validation import ALLOCATION_RESULTS_MAX

Status = Literal["allocated", "unsatisfiable", "error"]

DEFAULT_BUDGET = 500_000
"""Search steps (device or value trials) per allocation unit before giving up with an error."""

DEFAULT_CEL_BUDGET = 5_000_000
"""Cost units (cel-go's, each evaluation charged its selector's estimate) an allocation unit may spend
evaluating selectors before it ends as an error: five evaluations of the costliest selector Kubernetes
accepts (CELSelectorExpressionMaxCost), ~1,000 times what the benchmark fleets' claims spend."""


class Outcome(msgspec.Struct, kw_only=True):
    claim: str
    status: Status
    node: str | None = None
    allocation: AllocationResult | None = None
    message: str = ""
    explanation: Explanation | None = None  # only with `allocate(..., explain=True)`

    def contract(self) -> dict[str, Any]:
        """The entry `dralloc allocate -o json` prints (CLI-CONTRACT.md)."""
        return {
            "claim": self.claim,
            "status": self.status,
            "node": self.node,
            "allocation": msgspec.to_builtins(self.allocation) if self.allocation is not None else None,
            "message": self.message,
        }


class Why(enum.Enum):
    """Why a unit cannot be placed on a node, which decides what the engine does next."""

    MISFIT = "misfit"
    """The node cannot hold the unit: the next node is tried (unsatisfiable if none can)."""
    CEL_ERROR = "cel error"
    """A selector fails at run time on a device of the node (verdicts.py's rule): with a given
    node the unit is an error; when the engine picks, the node is not used, and the unit is an
    error only if no node fits."""
    UNIT_ERROR = "unit error"
    """Wrong wherever it goes (over the device limit): the unit is an error at once."""


class _Failure(Exception):
    """A unit cannot be placed on a node, and `why`."""

    def __init__(self, message: str, why: Why = Why.MISFIT) -> None:
        super().__init__(message)
        self.message = message
        self.why = why


class Engine:
    def __init__(
        self,
        *,
        budget: int = DEFAULT_BUDGET,
        scoring: bool = True,
        cel_budget: int | None = DEFAULT_CEL_BUDGET,
        cel_seconds: tuple[Callable[[], float], float] | None = None,
        keep_whole: float = 0.0,
    ) -> None:
        self.inventory = Inventory()
        self.ledger = Ledger(self.inventory)
        self.verdicts = Verdicts(self.inventory)
        self.budget = budget
        self.cel_budget = cel_budget
        """Selector evaluation budget per allocation unit (verdicts.py; None: unlimited)."""
        self.cel_seconds = cel_seconds
        """(clock, seconds) an allocation unit may spend evaluating selectors, on that clock (the
        allocator's; None: no time limit, so that results do not depend on the machine's speed)."""
        self.explain_nodes = 3
        """How many nodes an explanation of a refusal reports (`dralloc explain` groups many)."""
        self.explain_untried = False
        """Whether it also reports nodes not tried (too few free or matching devices), after the tried ones."""
        # node and candidate order: topology/best-fit scoring, or Kubernetes' order (placement.py)
        self.placement = Placement(self.inventory, self.ledger, self.verdicts, scoring=scoring, learn=self._learn)
        self.placement.keep_whole.factor = keep_whole  # whole nodes kept for large claims (keep_whole.py; 0: off)
        self.misfits = Misfits(self.inventory, self.ledger)
        """Failures per (claim shape, node), valid until the node changes: repeated attempts cost a lookup."""
        self.placement.note_misfit = self.misfits.note  # nodes placement leaves out as certain misfits
        self._observer: Observer | None = None  # made by the first `snapshot`
        self.planner = Planner(cel.compile_selector, cel.CelCompileError)
        """Claims checked and flattened (plan.py), remembered per spec: a fleet's claims repeat a few."""

    # --- inventory -----------------------------------------------------------------------

    def apply(self, obj: DeviceClass | ResourceSlice | Node | DeviceTaintRule) -> list[str]:
        """Add or replace an object by name; returns problems (e.g. an invalid pool)."""
        if isinstance(obj, ResourceSlice):
            return self.inventory.apply_slice(obj)
        if isinstance(obj, DeviceTaintRule):
            self.inventory.apply_taint_rule(obj)
            return []
        if isinstance(obj, DeviceClass):
            self.inventory.apply_class(obj)
            return []
        if isinstance(obj, Node):
            self.inventory.apply_node(obj)
            return []
        raise TypeError(f"the engine takes DeviceClass, ResourceSlice, Node or DeviceTaintRule, not {type(obj).__name__}")

    def remove(self, kind: str, name: str) -> list[str]:
        if kind == "ResourceSlice":
            return self.inventory.remove_slice(name)
        if kind == "DeviceClass":
            self.inventory.remove_class(name)
        elif kind == "Node":
            self.inventory.remove_node(name)
        elif kind == "DeviceTaintRule":
            self.inventory.remove_taint_rule(name)
        else:
            raise ValueError(f"unknown kind {kind!r}: expected DeviceClass, ResourceSlice, Node or DeviceTaintRule")
        return []

    # --- ledger --------------------------------------------------------------------------

    def adopt(self, claim: ResourceClaim) -> list[str]:
        """Hold an allocation made elsewhere (claim.status.allocation) only if it conflicts with
        nothing held: else hold nothing and return the conflicts, naming the holders (adoption.py)."""
        return adoption.adopt(self, claim)

    def restore(self, claim: ResourceClaim) -> list[str]:
        """Mark an existing allocation (claim.status.allocation) as in use."""
        allocation = claim.status.allocation if claim.status is not None else None
        if allocation is None:
            return [f"claim {claim.key} has no status.allocation to restore"]
        key = claim.key
        self.ledger.remove(key)
        problems: list[str] = []
        entries: list[Entry] = []
        for i, result in enumerate(allocation.devices.results):
            dkey = (result.driver, result.pool, result.device)
            if result.admin_access:
                entries.append(Entry(device=dkey, kind="admin"))
            elif result.share_id is not None:
                # a result without a shareID holds the device exclusively, even a device that
                # allows multiple allocations (Kubernetes: AllocatedDevices, not shared IDs)
                consumed: dict[str, int] = {}
                try:
                    for name, value in result.consumed_capacity.items():
                        consumed[name if "/" in name else f"{result.driver}/{name}"] = parse_quantity(value)
                except ValueError as exc:
                    problems.append(f"claim {key}: result #{i}: consumedCapacity: {exc}")
                    continue
                entries.append(Entry(device=dkey, kind="share", share=result.share_id or f"{key}#{i}", consumed=consumed))
            else:
                holder = self.ledger.exclusive.get(dkey)
                if holder is not None and holder != key:
                    problems.append(f"claim {key}: device {'/'.join(dkey)} is already allocated to claim {holder}; not counted twice")
                    continue
                if any(e.device == dkey and e.kind == "exclusive" for e in entries):
                    # a shared device's results without shareID, twice: held whole once, not charged twice
                    problems.append(f"claim {key}: result #{i}: device {'/'.join(dkey)} is listed twice; counted once")
                    continue
                entries.append(Entry(device=dkey, kind="exclusive"))
        self.ledger.add(Record(claim=key, allocation=allocation, node=_node_of(allocation), entries=entries))
        return problems

    def release(self, claim_key: str) -> bool:
        """Free the claim's devices, capacity and counters. False if it held nothing."""
        return self.ledger.remove(claim_key) is not None

    def reserve(self, devices: int) -> None:
        """Hold devices (a bitset of device ids, 0: none) for claims that wait: from now on every
        claim tries nodes without a held device first and takes one only when nothing else fits
        (placement.py `Placement.reserve`). Who holds what is the caller's book (gang.py
        `reservation_for` finds the devices closest to fitting a claim)."""
        self.placement.reserve(devices)

    def plan_moves(
        self,
        claims: Sequence[ResourceClaim],
        movable: Mapping[str, ResourceClaim],
        *,
        domain_label: str | None = None,
        lost: Mapping[str, float] | None = None,
        together: bool = False,
        node: str | None = None,
    ) -> MovePlan | None:
        """A plan to make room for `claims` (one, a gang's members, or with `together` a Pod's claims,
        all on one node; with `node`, on that node only) by re-placing claims of `movable` that are in
        the way, fewest first (then, with `lost`, least cost); None if none. Changes nothing (moves.py `plan`)."""
        return moves.plan(self, claims, movable, domain_label=domain_label, lost=lost, together=together, node=node)

    def apply_moves(self, plan: MovePlan) -> list[Outcome]:
        """Commit a plan of `plan_moves` all or nothing (moves.py `apply`; raises moves.StalePlan)."""
        return moves.apply(self, plan)

    def allocation_of(self, claim_key: str) -> AllocationResult | None:
        record = self.ledger.claims.get(claim_key)
        return record.allocation if record is not None else None

    # --- allocation ----------------------------------------------------------------------

    def allocate(
        self,
        claims: Sequence[ResourceClaim],
        *,
        node: str | None = None,
        together: bool = False,
        explain: bool = False,
        within: int | None = None,
    ) -> list[Outcome]:
        """One Outcome per claim, in order; allocated ones are committed.

        A claim that already holds an allocation gets it back unchanged.
        `explain` attaches an Explanation to every outcome (unsatisfiable ones
        always get one). `within`: the node ranks (a bitset of `Inventory.node_rank`)
        the engine may pick from when it picks the node (None: every node; a gang's
        domain, see gang.py); ignored when `node` is given."""
        if not together:
            # checked claim by claim, in order: a key listed twice gets its first allocation back
            return [self._existing(claim) or self._allocate_unit([self._plan(claim)], node, explain, within)[0] for claim in claims]
        outcomes: dict[int, Outcome] = {}
        pending: list[tuple[int, ClaimPlan]] = []
        seen: set[str] = set()
        for i, claim in enumerate(claims):
            existing = self._existing(claim)
            if existing is not None:
                outcomes[i] = existing
            elif claim.key in seen:
                outcomes[i] = Outcome(claim=claim.key, status="error", message=f"claim {claim.key} is listed twice in one unit")
            else:
                seen.add(claim.key)
                pending.append((i, self._plan(claim)))
        if pending:
            for (i, _), outcome in zip(pending, self._allocate_unit([p for _, p in pending], node, explain, within)):
                outcomes[i] = outcome
        return [outcomes[i] for i in range(len(claims))]

    def _existing(self, claim: ResourceClaim) -> Outcome | None:
        record = self.ledger.claims.get(claim.key)
        if record is None:
            return None
        return Outcome(claim=claim.key, status="allocated", node=record.node, allocation=record.allocation, message="already allocated")

    def _plan(self, claim: ResourceClaim) -> ClaimPlan:
        return self.planner.plan(claim, self.inventory.classes, self.inventory.class_versions)

    def snapshot(self, *, fleet: bool = False) -> EngineSnapshot:
        """A read-only picture for observers (snapshot.py): who holds what, and with `fleet` the free
        devices per node and class. Taken by the engine's owner between its own calls (never from
        another thread while it works); the result is immutable and may then be read anywhere."""
        if self._observer is None:
            self._observer = Observer(self.inventory, self.ledger)
        return self._observer.take(fleet=fleet)

    def warm(self, seconds: float) -> bool:
        """Idle work for about `seconds`: each class's reach (the nodes a walk for it may skip), on
        which no device taken depends (`Verdicts.warm`); True while some is left (after an
        inventory change there is more). Then the node topologies not built since their node changed
        (`Topology.warm`) and last the multi-node domains (`Topology.domains`, worked out again after
        a Node object or a node's clique changed: ~21 ms at 31,250 nodes), which a scored walk
        reads on every claim."""
        end = time.perf_counter() + seconds
        topology = self.placement.topology
        if self.verdicts.warm(seconds) or topology.warm(end):
            return True
        topology.domain_union()
        return False

    def interrupt(self) -> None:
        """Abandon the allocation in progress (another thread: the process stops). It raises
        `verdicts.Interrupted`, and so does every later one: the engine is done with."""
        self.verdicts.interrupt()

    def _allocate_unit(self, plans: list[ClaimPlan], node: str | None, explain: bool, within: int | None) -> list[Outcome]:
        for plan in plans:
            if plan.error:
                return [Outcome(claim=p.key, status="error", message=plan.error) for p in plans]
        self.verdicts.begin(self.cel_budget, self.cel_seconds)
        try:
            return self._place_unit(plans, node, explain, within)
        except SelectorBudgetExceeded as exc:
            return [Outcome(claim=p.key, status="error", message=f"claim {p.key}: {exc}") for p in plans]
        finally:
            self.verdicts.begin(None)

    def _place_unit(self, plans: list[ClaimPlan], node: str | None, explain: bool, within: int | None) -> list[Outcome]:
        steps = [0]
        reasons: list[tuple[str | None, str]] = []
        cel_failure = ""
        tried: list[str | None] = []
        try:
            nodes = [node] if node is not None else self._candidate_nodes(plans, within, skip_misfits=not explain)
            for candidate in nodes:
                tried.append(candidate)
                try:
                    slots_by_claim = self._place(plans, candidate, steps)
                except _Failure as failure:
                    if failure.why is Why.UNIT_ERROR or (failure.why is Why.CEL_ERROR and node is not None):
                        return [Outcome(claim=p.key, status="error", message=failure.message) for p in plans]
                    if failure.why is Why.CEL_ERROR:
                        # the engine picks the node: a node where a selector fails is not used
                        cel_failure = cel_failure or failure.message
                    reasons.append((candidate, failure.message))
                    continue
                return self._commit(plans, candidate, slots_by_claim, explain)
        except BudgetExceeded:
            message = f"search budget of {self.budget} steps exhausted before an answer was found; the claims are too hard to place (simplify constraints or give fewer alternatives)"
            return [Outcome(claim=p.key, status="error", message=message) for p in plans]
        if cel_failure:
            return [Outcome(claim=p.key, status="error", message=cel_failure) for p in plans]
        message = _unsatisfiable_message(plans, node, reasons)
        # the explanation (every node's verdict, what a waiting claim would hold) is work for
        # `dralloc explain`; a refusal the allocator makes needs only the message
        explanation = explain_failure(self, plans, node, tried, reasons) if explain else None
        return [Outcome(claim=p.key, status="unsatisfiable", message=message, explanation=explanation) for p in plans]

    # --- nodes ---------------------------------------------------------------------------

    def _candidate_nodes(self, plans: list[ClaimPlan], within: int | None, *, skip_misfits: bool = True) -> Iterator[str | None]:
        """Known nodes in order, lazily, minus those that cannot host the unit and those
        outside the `within` ranks (None: no such limit); with `skip_misfits`, minus those where
        the unit is remembered to fail (misfits.py `known`; `explain` visits them to report them).

        Without network-attached devices a node is skipped when, for some
        request, it is known (from earlier evaluations, or from its class's reach
        worked out at idle: `Verdicts.class_reach`) to have no device any
        alternative matches or fails on; without shared devices also when it
        has fewer free devices than the unit's smallest demand.

        Worked out when called (a function returning the walk, not a generator around it: a
        generator still suspended when a node fits is closed by a GeneratorExit thrown
        through it, per claim)."""
        inv = self.inventory
        if not inv.node_known:
            return iter((None,))
        confined = -1 if within is None else within  # every rank, or a gang's domain
        if inv.nonlocal_bits:
            return self.placement.order_nodes(plans, confined)
        viable = confined
        need = 0
        for plan in plans:
            for request in plan.requests:
                reach = 0
                smallest = None
                for alt in request.alts:
                    seen, hit = self.verdicts.get(alt, 0).nodes(inv.version, alt.learn_key)
                    reach |= hit | (~seen & self.verdicts.class_reach(alt))
                    demand = 0 if alt.admin else (1 if alt.all_mode else alt.count)
                    smallest = demand if smallest is None else min(smallest, demand)
                viable &= reach
                need += smallest or 0
        if need > 0 and not inv.multi_bits:
            free_ge = self.ledger.free_ge
            viable &= free_ge[need] if need < len(free_ge) else 0
        skipped = viable & self.misfits.known(plans) if skip_misfits else 0
        order = self.placement.order_nodes(plans, viable ^ skipped, skip_short=skip_misfits)
        if skipped:  # nothing else fit: one of them, so that the refusal still says why (a recall)
            return itertools.chain(order, (inv.node_names[(skipped & -skipped).bit_length() - 1],))
        return order

    # --- CEL errors ----------------------------------------------------------------------

    def _cel_errors(self, plans: list[ClaimPlan], scope: int, memo: dict[int, Verdict]) -> str | None:
        """dralloc's order-independent rule for CEL runtime errors (see verdicts.py):
        the first failure on a device of `scope` any alternative could otherwise take."""
        used = self.ledger.used_bits
        inv = self.inventory
        for plan in plans:
            for request in plan.requests:
                for alt in request.alts:
                    verdict = self._verdict(memo, alt, scope)
                    if not verdict.failed:
                        continue  # the usual case, without two fleet-sized ANDs
                    failed = verdict.failed & scope & inv.live
                    if not (alt.admin or alt.all_mode):
                        failed ^= failed & used
                    if failed:
                        first = min(iter_bits(failed), key=lambda i: inv.devices[i].order)  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)
                        text = verdict.errors[first]
                        if text.startswith("class "):
                            return text
                        return f"claim {plan.key}, request {alt.result_name}: {text}"
        return None

    def _verdict(self, memo: dict[int, Verdict], alt: Alt, mask: int) -> Verdict:
        """`verdicts.get(alt, mask)` once per alternative and node try (`memo`, by the alternative's
        identity): the CEL error check, the match memory and the filters all read it."""
        verdict = memo.get(id(alt))
        if verdict is None:
            verdict = memo[id(alt)] = self.verdicts.get(alt, mask)
        return verdict

    # --- one node ------------------------------------------------------------------------

    def _learn(self, plans: list[ClaimPlan], node: str, mask: int, memo: dict[int, Verdict] | None = None) -> None:
        """Remember per verdict whether this node has devices that match (or fail),
        so later units skip nodes that cannot serve a request without evaluating them."""
        inv = self.inventory
        rank = inv.node_rank.get(node)
        if rank is None:
            return  # a node no object names (`allocate(node=...)` with an unknown name): nothing to remember
        bit = 1 << rank
        memo = {} if memo is None else memo
        # without network-attached devices the node's mask is its own devices: the verdict's part
        # of it is placement's per-node copy (`local_verdict`, shifted by `lo`), read without the
        # fleet-sized `& mask` operations (each ~10 us at 250,000 GPUs, per node and alternative)
        local = not inv.nonlocal_bits
        for plan in plans:
            for request in plan.requests:
                for alt in request.alts:
                    known = self.verdicts.known(alt) if local else None
                    verdict = known if known is not None else self._verdict(memo, alt, mask)
                    info = verdict.nodes(inv.version, alt.learn_key)
                    if info[0] & bit:
                        continue
                    info[0] |= bit
                    topo = self.placement.topology.node(node) if local else None
                    if topo is not None:
                        matched, hit = self.placement.local_verdict(topo, alt)  # (evaluates it there if not yet)
                        lo = topo.lo
                    else:
                        verdict = self._verdict(memo, alt, mask)  # evaluated on the node's devices
                        hit = verdict.failed & mask
                        matched, lo = (verdict.matched & mask if not hit else 0), 0
                    if not hit:
                        if alt.group:
                            hit = self._learn_groups(verdict, alt, matched, bit, lo, topo)
                        elif alt.constraint_attributes:
                            hit = any(all(inv.devices[i + lo].attribute(a) is not None for a in alt.constraint_attributes) for i in iter_bits(matched))  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)
                        else:
                            hit = matched
                    if hit:
                        info[1] |= bit

    def _learn_groups(self, verdict: Verdict, alt: Alt, matched: int, bit: int, lo: int = 0, topo: NodeTopology | None = None) -> bool:
        """Whether the node (`bit`) has a group of `alt.group` of its `matched` devices (ids
        shifted down by `lo`; `topo`: the node's topology when they are its own), with the
        same answer noted for the other group sizes of the verdict's node memory that read the same
        attributes and have not seen the node (a node without a pair has no group of 4 or 8 either):
        the claims of those sizes then skip it without a try of their own."""
        siblings = [
            (key[2], info)
            for key, info in verdict.node_info.items()
            if key[2] and key[2] != alt.group and key[0] == alt.constraint_attributes and key[1] == alt.match_attributes and not info[0] & bit
        ]
        groups = [alt.group, *(g for g, _ in siblings)]
        # a device adds one to a value at most: with fewer matching devices no group is reached
        largest = 0 if matched.bit_count() < min(groups) else _largest_group(self.inventory, matched, alt, max(groups), lo, topo)
        for group, info in siblings:
            info[0] |= bit
            if largest >= group:
                info[1] |= bit
        return largest >= alt.group

    def _place(self, plans: list[ClaimPlan], node: str | None, steps: list[int]) -> list[list[Slot]]:
        """Find devices for the whole unit on `node`, or raise _Failure."""
        mask, order = node_devices(self.inventory, node)
        # a failure remembered for this shape and node state (misfits.py) is answered before the
        # CEL error check and the match memory: both were done when it was first found, and
        # neither has anything new to say until the node or the inventory changes
        known = self.misfits.recall(plans, node)
        if known is not None:
            if steps[0] + known.steps > self.budget:
                raise BudgetExceeded  # where the search itself would have run out
            steps[0] += known.steps
            raise _Failure(known.message(plans[0].key), known.why)
        before = steps[0]
        memo: dict[int, Verdict] = {}
        try:
            error = self._cel_errors(plans, mask, memo)
            if error:
                raise _Failure(error, Why.CEL_ERROR)
            if node is not None:
                self._learn(plans, node, mask, memo)
            return self._place_search(plans, node, (mask, order), steps, memo)
        except _Failure as failure:
            # the key after the failure is the key before it: a failed try changes no state
            if node is None or node in self.inventory.node_rank:  # (not a name no object gave: nothing to key it by)
                self.misfits.put(self.misfits.key(plans, node), plans[0], failure.message, failure.why, steps[0] - before)
            raise

    def _place_search(
        self, plans: list[ClaimPlan], node: str | None, devices: tuple[int, list[int]], steps: list[int], memo: dict[int, Verdict]
    ) -> list[list[Slot]]:
        """`_place` after the CEL error check: candidates per request, then the search."""
        options: list[list[tuple[int, Alt, list[DeviceRec], dict[int, dict[str, int]]]]] = []  # per request: feasible alternatives
        infeasible = ""
        for ci, plan in enumerate(plans):
            minimum = 0
            for request in plan.requests:
                feasible = []
                smallest = None
                why = ""
                for alt in request.alts:
                    found = candidates(self.inventory, self.ledger, plan, alt, self._verdict(memo, alt, devices[0]), devices, node)
                    size = len(found.recs) if alt.all_mode else alt.count
                    smallest = size if smallest is None else min(smallest, size)
                    if found.problem:
                        why = why or f"request {alt.result_name}: {found.problem}"
                        continue
                    feasible.append((ci, alt, found.recs, found.consumed))
                minimum += smallest or 0
                if not feasible:
                    infeasible = infeasible or f"claim {plan.key}, {why}"
                options.append(feasible)
            # the device limit is checked before any search, as Kubernetes does: an error, not a misfit
            if minimum > ALLOCATION_RESULTS_MAX:
                raise _Failure(f"claim {plan.key}: number of requested devices {minimum} exceeds the claim limit of {ALLOCATION_RESULTS_MAX}", Why.UNIT_ERROR)
        if infeasible:
            raise _Failure(infeasible)
        last = "no combination of the candidate devices satisfies the constraints, counters and capacity together"
        if len(plans) == 1 and len(options) == 1 and len(options[0]) == 1:
            if not plans[0].constraints:
                quick = self._take_first(options[0][0], node, steps)
                if quick is not None:
                    return [quick]
            elif len(plans[0].constraints) == 1:
                if self._no_group(options[0][0], plans[0].constraints[0], steps):
                    raise _Failure(last)
                grouped = self._take_group(options[0][0], plans[0].constraints[0], node, steps)
                if grouped is not None:
                    return [grouped]
        for choice in itertools.product(*options):
            totals: dict[int, int] = {}
            for ci, alt, cands, _ in choice:
                totals[ci] = totals.get(ci, 0) + (len(cands) if alt.all_mode else alt.count)
            if any(t > ALLOCATION_RESULTS_MAX for t in totals.values()):
                continue
            slots: list[Slot] = []
            matches = []
            cid = 0
            for ci, plan in enumerate(plans):
                first = len(slots)
                for c_ci, alt, cands, consumed in choice:
                    if c_ci == ci:
                        slots.append(Slot(claim=ci, alt=alt, cands=list(cands), consumed=consumed))
                for constraint in plan.constraints:
                    covered = [i for i in range(first, len(slots)) if constraint.covers(slots[i].alt)]
                    if constraint.match:
                        if covered:
                            matches.append((constraint, covered))
                    else:
                        for i in covered:
                            slots[i].distinct.append((cid, constraint))
                    cid += 1
            rank = self.placement.order_slots(slots, node)
            search = Search(self.ledger, slots, matches, self.budget - steps[0], rank)
            try:
                solved = search.run()
            finally:
                steps[0] += search.steps
            if solved:
                return [[s for s in slots if s.claim == ci] for ci in range(len(plans))]
        raise _Failure(last)

    def _take_first(self, option: tuple[int, Alt, list[DeviceRec], dict[int, dict[str, int]]], node: str | None, steps: list[int]) -> list[Slot] | None:
        """The usual unit: one claim, one request, one feasible alternative, no constraints. When
        the candidates are `independent` (none shared, none drawing on another's counter set: whole
        GPUs, MIG-capable ones too), every candidate can be taken whatever else is
        taken, so the search would take the first `count` in placement's order, one step each:
        that answer without building the search. So too for one device (a MIG slice, a share):
        each candidate passed the filters' counter and capacity tests against the ledger alone,
        which is all the search checks its first take against (its counter bound then holds as
        well: the least a counter's candidates consume is at most what the first one does). None:
        the search is needed (or the step budget would run out on the way, where the search raises it)."""
        _, alt, cands, consumed = option
        count = alt.count
        if alt.all_mode or steps[0] + count > self.budget or (count > 1 and not independent(cands)):
            return None
        slot = Slot(claim=0, alt=alt, cands=list(cands), consumed=consumed)
        self.placement.order_slots([slot], node)
        slot.chosen = slot.cands[:count]
        steps[0] += count
        return [slot]

    def _take_group(
        self, option: tuple[int, Alt, list[DeviceRec], dict[int, dict[str, int]]], constraint: Constraint, node: str | None, steps: list[int]
    ) -> list[Slot] | None:
        """The usual multi-device unit: one claim, one request, one feasible alternative of a count,
        one matchAttribute over it, `independent` candidates (so any of them can be taken with
        any other) and a group known to exist (`_no_group` said so). The
        search would try the attribute's values in placement's order (`order_slots`' rank, then
        candidate order), one step each, and take the first `count` candidates of the first value
        held by that many, one step each: that answer, with those steps, without building the
        search. None: the search is needed (or the step budget would run out on the way, where
        the search raises it)."""
        _, alt, cands, consumed = option
        count = alt.count
        if not constraint.match or alt.all_mode or alt.admin or not constraint.covers(alt) or not independent(cands):
            return None
        slot = Slot(claim=0, alt=alt, cands=list(cands), consumed=consumed)
        rank = self.placement.order_slots([slot], node)
        attribute = constraint.attribute
        groups: dict[AttrValue, list[DeviceRec]] = {}
        for rec in slot.cands:
            for value in elements(rec, attribute):
                groups.setdefault(value, []).append(rec)
        # the search tries values in the order their first candidate comes by rank, and the rank is
        # each candidate's place in the order `order_slots` left (one slot): the groups' own order
        values = groups if rank else dict.fromkeys(v for rec in sorted(slot.cands, key=lambda r: r.order) for v in elements(rec, attribute))
        for tried, value in enumerate(values, 1):
            kept = groups[value]
            if len(kept) >= count:
                if steps[0] + tried + count > self.budget:
                    return None
                steps[0] += tried + count
                slot.cands = kept
                slot.chosen = kept[:count]
                return [slot]
        return None

    def _no_group(self, option: tuple[int, Alt, list[DeviceRec], dict[int, dict[str, int]]], constraint: Constraint, steps: list[int]) -> bool:
        """The usual misfit of a multi-device claim: one request, one feasible alternative, one
        matchAttribute over it, candidates none of which draws on another's counter set
        (`independent`, shared ones allowed: the search's counter bound, which runs first and may
        end it with no step, then holds), and no value of the attribute held by `count` of them (an
        NVLink pair for a claim of four). The search would try each value once (one step each) and
        fail: True, with those steps charged. False: the search decides (a group exists, or the
        step budget would run out on the way, where it raises)."""
        _, alt, cands, _ = option
        if not constraint.match or alt.all_mode or not constraint.covers(alt):
            return False
        counts: dict[AttrValue, int] = {}
        attribute, need = constraint.attribute, alt.count
        for rec in cands:
            for value in elements(rec, attribute):
                n = counts[value] = counts.get(value, 0) + 1
                if n >= need:
                    return False
        if steps[0] + len(counts) > self.budget or not independent(cands, shared=True):
            return False
        steps[0] += len(counts)
        return True

    # --- results -------------------------------------------------------------------------

    def _commit(self, plans: list[ClaimPlan], node: str | None, slots_by_claim: list[list[Slot]], explain: bool) -> list[Outcome]:
        # explanations first: their filter counts describe the state the search saw
        explanations = [explain_success(self, plan, node, slots) for plan, slots in zip(plans, slots_by_claim)] if explain else [None] * len(plans)
        outcomes = []
        for plan, slots, explanation in zip(plans, slots_by_claim, explanations):
            allocation, entries = self._result(plan, node, slots)
            self.ledger.add(Record(claim=plan.key, allocation=allocation, node=node, entries=entries))
            outcomes.append(Outcome(claim=plan.key, status="allocated", node=node, allocation=allocation, explanation=explanation))
        return outcomes

    def _result(self, plan: ClaimPlan, node: str | None, slots: list[Slot]) -> tuple[AllocationResult, list[Entry]]:
        results: list[DeviceRequestAllocationResult] = []
        entries: list[Entry] = []
        shares: dict[int, int] = {}
        chosen: list[DeviceRec] = []
        slices = self.inventory.slices
        for slot in slots:
            alt = slot.alt
            for rec in slot.chosen:
                chosen.append(rec)
                result = DeviceRequestAllocationResult(
                    request=alt.result_name,
                    driver=rec.driver,
                    pool=rec.pool,
                    device=rec.name,
                    admin_access=True if alt.admin else None,
                    tolerations=list(alt.tolerations),
                    binding_conditions=list(rec.spec.binding_conditions),
                    binding_failure_conditions=list(rec.spec.binding_failure_conditions),
                    # its slice's (1.37 DRAOptionalNodeOperations); none: the inventory's shared empty list
                    skip_node_operations=list(skip) if (skip := slices[rec.slice].spec.skip_node_operations) else skip,
                )
                if rec.multi:
                    # every allocation of a multi-allocatable device has a shareID, under admin
                    # access too (as Kubernetes writes it); admin access still consumes nothing
                    n = shares[rec.id] = shares.get(rec.id, 0) + 1
                    share = str(uuid.uuid5(uuid.NAMESPACE_URL, f"dralloc:{plan.key}:{plan.claim.metadata.uid or ''}:{rec.label}:{n}"))
                    used = slot.consumed[rec.id]
                    result.share_id = share
                    result.consumed_capacity = {rec.capacity[fq].name: format_quantity(v) for fq, v in used.items()}
                    entries.append(Entry(device=rec.key, kind="admin") if alt.admin else Entry(device=rec.key, kind="share", share=share, consumed=dict(used)))
                else:
                    entries.append(Entry(device=rec.key, kind="admin" if alt.admin else "exclusive"))
                results.append(result)
        allocation = AllocationResult(
            devices=DeviceAllocationResult(results=results, config=_configs(plan, slots)),
            node_selector=_node_selector(chosen, node),
        )
        return allocation, entries


def _largest_group(inv: Inventory, matched: int, alt: Alt, cap: int, lo: int = 0, topo: NodeTopology | None = None) -> int:
    """The largest group, counted up to `cap`, of the `matched` devices (ids shifted down by `lo`;
    free or not) that have
    every constraint attribute: for each match attribute the most of them sharing one value, the
    least of those over the attributes (`cap` without match attributes). A group of `alt.group`
    exists when this reaches it: a matchAttribute over NVLink domains of two cannot hold a claim
    for four, however free the node is. `topo`: the node's topology, when `matched` are its own
    devices (shifted by its `lo`); one match attribute is then counted from its value bitsets
    (`value_bits`: a bitset operation per value, where the loop below looks up each device's
    attributes, ~25 us a node of 8 GPUs on gpu-fleet-10k): the same answer below `cap`, and `cap`
    where the loop reaches it (the callers compare it with groups of at most `cap`)."""
    attributes = alt.match_attributes
    if not attributes:
        return cap
    if topo is not None and len(attributes) == 1:
        for name in alt.constraint_attributes:
            matched &= value_bits(inv, topo, name)[0]
        return min(cap, max(((matched & bits).bit_count() for bits in value_bits(inv, topo, attributes[0])[1]), default=0))
    counts: list[dict[object, int]] = [{} for _ in attributes]
    best = [0] * len(attributes)
    left = len(attributes)
    for i in iter_bits(matched):
        rec = inv.devices[i + lo]
        if rec is None or any(rec.attribute(a) is None for a in alt.constraint_attributes):
            continue
        for n, attribute in enumerate(attributes):
            per = counts[n]
            for value in rec.values(attribute) or ():
                c = per[value] = per.get(value, 0) + 1
                if c > best[n]:
                    best[n] = c
                    if c == cap:
                        left -= 1
        if not left:
            return cap  # every attribute has a group of `cap` already: the rest cannot undo it
    return min(best)


def _configs(plan: ClaimPlan, slots: list[Slot]) -> list[DeviceAllocationConfiguration]:
    """The result's configs as Kubernetes 1.37 writes them: each class's configs once (in
    request order), naming every request served by that class; then the claim's configs
    that apply to an allocated request (or to all), copied as written; finally, a config
    that names every request of the claim (the chosen subrequest standing for its request)
    carries no `requests` at all, since empty means all."""
    if not plan.claim.spec.devices.config:
        for slot in slots:  # (a loop: this runs per allocation)
            if slot.alt.cls.spec.config:
                break
        else:
            return []  # the usual claim: nothing to write (and nothing below would add an entry)
    chosen: dict[str, Alt] = {}
    for slot in slots:
        chosen.setdefault(slot.alt.base, slot.alt)
    served = [chosen[r.name] for r in plan.requests if r.name in chosen]
    out: list[DeviceAllocationConfiguration] = []
    by_class: dict[str, list[DeviceAllocationConfiguration]] = {}
    for alt in served:
        name = alt.cls.metadata.name
        if name in by_class:
            for entry in by_class[name]:
                entry.requests.append(alt.result_name)
            continue
        entries = [DeviceAllocationConfiguration(source="FromClass", requests=[alt.result_name], opaque=c.opaque) for c in alt.cls.spec.config]
        by_class[name] = entries
        out += entries
    names = {alt.base for alt in served} | {alt.result_name for alt in served}
    for config in plan.claim.spec.devices.config:
        if not config.requests or any(r in names for r in config.requests):
            out.append(DeviceAllocationConfiguration(source="FromClaim", requests=list(config.requests), opaque=config.opaque))
    for entry in out:
        if entry.requests and all(alt.base in entry.requests or alt.result_name in entry.requests for alt in served):
            entry.requests = []
    return out


def _node_selector(chosen: list[DeviceRec], node: str | None) -> NodeSelector | None:
    """What Kubernetes writes: the node's name when any device is node-local (or
    binds to the node), else the union of the devices' single-term selectors,
    else nothing (usable from every node)."""
    fields: list[NodeSelectorRequirement] = []
    expressions: list[NodeSelectorRequirement] = []
    for rec in chosen:
        if rec.local_node is not None or rec.binds_to_node:
            return _pin(node)
        selector = rec.node_selector
        if selector is None or not selector.node_selector_terms:
            continue
        if len(selector.node_selector_terms) > 1:
            return _pin(node) if node is not None else selector
        term = selector.node_selector_terms[0]
        for source, target in ((term.match_fields, fields), (term.match_expressions, expressions)):
            for requirement in source:
                if not any(r.key == requirement.key and r.operator == requirement.operator and set(r.values) == set(requirement.values) for r in target):
                    target.append(requirement)
    if fields or expressions:
        return NodeSelector(node_selector_terms=[NodeSelectorTerm(match_fields=fields, match_expressions=expressions)])
    return None


def _pin(node: str | None) -> NodeSelector:
    """The selector naming one node (a new object per result: results are not shared)."""
    return NodeSelector(node_selector_terms=[NodeSelectorTerm(match_fields=[NodeSelectorRequirement(key="metadata.name", operator="In", values=[node or ""])])])


def _node_of(allocation: AllocationResult) -> str | None:
    selector = allocation.node_selector
    if selector is None or len(selector.node_selector_terms) != 1:
        return None
    for requirement in selector.node_selector_terms[0].match_fields:
        if requirement.key == "metadata.name" and requirement.operator == "In" and len(requirement.values) == 1:
            return requirement.values[0]
    return None


def _unsatisfiable_message(plans: list[ClaimPlan], node: str | None, reasons: list[tuple[str | None, str]]) -> str:
    who = "the claim" if len(plans) == 1 else f"all {len(plans)} claims together"
    if node is not None:
        why = reasons[0][1] if reasons else "no candidate devices"
        return f"cannot allocate {who} on node {node}: {why}"
    if not reasons:
        return f"cannot allocate {who}: no node has enough free devices that match the requests{grouped(plans)}"
    first_node, why = reasons[0]
    if first_node is None:
        return f"cannot allocate {who}: no node is known (no Node objects, no node-local slices), and {why}"
    more = f" ({len(reasons)} nodes tried)" if len(reasons) > 1 else ""
    return f"cannot allocate {who} on any node{more}; on node {first_node}: {why}"
