"""Placement scoring: among the valid answers, the closest and best-fitting one.

Kubernetes' allocator takes the first valid answer. The engine's search does
too (search.py): it takes nodes and candidate devices in the order it is
given. Placement changes only that order, so every answer stays one the
search validated, and with scoring off the order is Kubernetes' (nodes by
rank, devices by driver/pool/slice/name).

Two hooks:

- `order_nodes(plans, viable)`: the nodes to try, best first. Best fit:
  nodes already partly used (of the claim's kind: GPUs for a GPU claim, not
  the node's NICs) before whole free ones, so a claim fills a hole before it
  breaks a node that an 8-GPU claim or a gang member could take; in each,
  the fewest free devices of the kind first (among equally full ones the
  node with the most claims: it drains last anyway, so one more claim there
  delays a whole node least); nodes outside multi-node
  domains first, then domain by domain, the fullest domain (NVLink clique or
  rack) first, so whole domains stay free for gangs; then rank. The counts are
  kept per node and kind as the ledger changes (`KindIndex`), so the order
  costs nothing per node. A claim for one device tries nodes without NVLink
  first: it gains nothing from NVLink, and NVLink capacity stays for the
  claims that need several GPUs close together. For a unit that needs
  several devices the nodes are also scored for locality: the tightest
  level (one NVLink domain, PCIe switch, PCIe root, NUMA node, node) at
  which one group of the node has enough free devices for every request.
  The scan walks nodes in best-fit order and stops at the first node that
  reaches the best level its hardware can give, so the usual cost is a few
  nodes, not the fleet (at most SCAN_LIMIT).
- `order_slots(slots, node)`: each request's candidates on the chosen node,
  best first: devices in groups that can hold the whole unit at the tightest
  level first (same NVLink domain > same PCIe switch > same PCIe root > same
  NUMA node), then best fit inside (the fullest group that still fits:
  partitioned GPUs before whole ones for MIG, partly used switches and NUMA
  nodes before free ones), then Kubernetes' order. Several requests of a
  unit (a GPU and a NIC) are scored together, so they land under one switch
  or root. Cost: one pass over the candidates per level.

Same input, same order: every tie ends in group index (by device id) and the
device's Kubernetes order.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from itertools import chain
from typing import TYPE_CHECKING

from dralloc.allocator.engine.filters import room_for
from dralloc.allocator.engine.inventory import DeviceKind, DeviceRec, Inventory, Pool, iter_bits
from dralloc.allocator.engine.keep_whole import Group, KeepWhole, drain_last, held_whole
from dralloc.allocator.engine.ledger import Ledger
from dralloc.allocator.engine.partitions import Partitions
from dralloc.allocator.engine.topology import (
    GPU,
    GROUP_LEVELS,
    NODE,
    NUMA,
    NVLINK,
    ROOT,
    SWITCH,
    NodeTopology,
    Topology,
    level_of,
    value_bits,
)

if TYPE_CHECKING:
    from dralloc.allocator.engine.plan import Alt, ClaimPlan, VerdictKey
    from dralloc.allocator.engine.search import Slot
    from dralloc.allocator.engine.verdicts import Verdicts

SCAN_LIMIT = 256
"""Nodes scored for locality per unit before the best one seen is taken (bounds the work on huge fleets)."""

WALK_BATCH = 64
"""Nodes whose verdicts a first walk of a selector settles together at most (`Placement._settled`)."""

WALK_DEVICES = 1024
"""Devices a batch of `_settled` stops at: a walk that stops at the next node (one of a few nodes
with hundreds of MIG partitions each, say) has looked at few devices past it in vain."""

PARTITION_WORDS = (
    "partition: of the node's free placements, the one that blocks the fewest free partitions of the kinds"
    " in use now (each counted as many times as its kind is in use fleet-wide), the topology order breaking ties"
)
"""`dralloc explain`'s line for a MIG slice's placement (partitions.py)."""

Demand = list[tuple["Alt", int]]
DemandKey = tuple[tuple["VerdictKey", tuple[str, ...], int], ...]
"""A demand as a cache key: (verdict key, constraint attributes, count) per alternative (`_demand_key`)."""
_SortKey = tuple[tuple[int, ...], int, tuple[int, ...], int]
"""A candidate's place in `_slot_order`: (free-group vector, fit, coarse totals, tightest group)."""
_PER_DEVICE = object()


class Placement:
    def __init__(
        self,
        inventory: Inventory,
        ledger: Ledger,
        verdicts: Verdicts,
        *,
        scoring: bool = True,
        learn: Callable[[list[ClaimPlan], str, int], None] | None = None,
    ) -> None:
        self.inv = inventory
        self.ledger = ledger
        self.verdicts = verdicts
        self.scoring = scoring
        self.learn = learn
        """The engine's per-node match memory (`learn(plans, node, mask)`): nodes scored here
        are remembered as the engine's own attempts are, so later units skip those that cannot serve."""
        self.note_misfit: Callable[[list[ClaimPlan], int], None] | None = None
        """The engine's memory of failures (`Misfits.note`): a node `order_nodes` leaves out as
        one the unit must fail on is remembered as such."""
        self.topology = Topology(inventory)
        self.topology.eager = scoring
        self.keep_whole = KeepWhole()
        """Whole nodes kept for large claims in proportion to recent large demand (keep_whole.py;
        off until its `factor` is set)."""
        self.kinds = KindIndex(inventory, ledger, self.keep_whole, self._shape)
        self.partitions = Partitions(inventory, ledger)
        """Partitions in use per kind and which partitions overlap: a MIG slice's best fit (partitions.py)."""
        self._groups: dict[Group, tuple[int, int, int]] = {}
        """Group -> (inventory version, its node ranks, devices of the kind per node) (`_group`)."""
        self._static: dict[tuple[str, tuple[int] | None, DemandKey], int | None] = {}
        self._slot_orders: dict[tuple[object, ...], list[tuple[int, ...]]] = {}  # (node shape, per slot its count, groups, multi)
        self.reserved = 0
        """Device ids (a bitset) held for claims that wait (`reserve`): their nodes are tried last."""
        self.reserved_nodes = 0
        """Node ranks (a bitset) holding a reserved device."""
        self.held_rules = True
        """The held-node rules (keep_whole.py `held_whole`, `drain_last`); off with moves on at the
        wait's end (moving.py: there a wait ends in a move, and small claims refused cost more)."""

    # --- reservations ----------------------------------------------------------------------

    def reserve(self, devices: int) -> None:
        """Hold `devices` (a bitset of device ids) for what waits: every unit tries the nodes
        without a reserved device first and those with one last (a preference, never a refusal:
        a claim takes reserved devices when nothing else fits). 0 ends every reservation. The
        caller leaves out the reservation of the claim it allocates next (it is that claim's)."""
        self.reserved = devices
        ranks = 0
        if devices:
            inv = self.inv
            nodes = {inv.devices[i].local_node for i in iter_bits(devices) if inv.devices[i] is not None}  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)
            for node in nodes:
                if node is not None and node in inv.node_rank:
                    ranks |= 1 << inv.node_rank[node]
        self.reserved_nodes = ranks

    def closest(self, plans: list[ClaimPlan], members: int = 1, domains: dict[str, list[str]] | None = None, avoid: int = 0) -> int:
        """The devices to reserve for a unit that does not fit now (a bitset; 0: none can ever
        hold it): the node closest to fitting, among those with enough devices its first request
        matches: the fewest claims holding them (the departures it waits for), then the most
        free. For a gang of `members` such units inside one of the `domains` (name -> nodes):
        the domain whose `members` closest nodes wait for the fewest claims, then have the most
        free, and those nodes. Nodes of the `avoid` ranks (held for an earlier claim) are not
        taken. Every matching device of a chosen node is reserved, free or not, so what its
        running claims give back is held too. Ties: the lowest rank."""
        demand = _demand(plans)
        if not demand:
            return 0
        alt, count = demand[0]
        inv, ledger = self.inv, self.ledger
        used, holder = ledger.used_bits, ledger.exclusive
        rank = inv.node_rank
        devices = inv.devices

        def score(node: str, beat: tuple[int, int] | None = None) -> tuple[int, int, int, int] | None:
            """(claims to wait for, -free, rank, matching devices) of a node that could hold the
            demand when free; None for one that never could, or is held for an earlier claim, or
            cannot come before `beat` (the best (claims, -free) of a lower rank; a speed-up:
            the claims are counted only where the cheap bound, one if any device is taken, can)."""
            if node not in inv.node_known or (avoid >> rank[node]) & 1:
                return None
            mask = inv.node_bits(node)
            verdict = self.verdicts.known(alt)
            if verdict is None or mask & verdict.evaluated != mask:  # the rest are known: no lookup per node
                verdict = self.verdicts.get(alt, mask)
            matched = verdict.matched & mask
            if matched.bit_count() < count:
                return None
            taken = matched & used
            if beat is not None and (1 if taken else 0, taken.bit_count() - matched.bit_count()) >= beat:
                return None
            holders = {holder.get(devices[i].key) for i in iter_bits(taken) if devices[i] is not None}  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)
            return (len(holders), taken.bit_count() - matched.bit_count(), rank[node], matched)

        if members <= 1:
            best: tuple[int, int, int, int] | None = None
            for node in inv.node_names:  # rank order: an equal score of a later node never wins
                s = score(node, best[:2] if best is not None else None)
                if s is not None and (best is None or s < best):
                    best = s
            return best[3] if best is not None else 0
        choice: tuple[tuple[int, int, int], int] | None = None
        for nodes in (domains or {}).values():
            closest = sorted(s for n in nodes if (s := score(n)) is not None)[:members]
            if len(closest) < members:
                continue
            key = (sum(c[0] for c in closest), sum(c[1] for c in closest), min(c[2] for c in closest))
            if choice is None or key < choice[0]:
                bits = 0
                for c in closest:
                    bits |= c[3]
                choice = (key, bits)
        return choice[1] if choice is not None else 0

    def held_whole(self, plans: list[ClaimPlan]) -> int:
        """The held node ranks the unit may not take (keep_whole.held_whole): whole again (every
        device of its kind free) and with more devices of the kind than it takes. 0: none, or
        the unit's kind not known yet."""
        if not self.reserved_nodes or not self.held_rules:
            return 0
        demand = _demand(plans)
        kind = self._kind(demand)
        if kind is None:
            return 0
        return held_whole(self.reserved_nodes, self.kinds.whole.get(kind, 0), self.kinds.total.get(kind, {}), self.inv.node_names, demand[0][1])

    def _held_order(self, plans: list[ClaimPlan], ranks: int) -> Iterator[str]:
        """Held nodes of `ranks` in the order to try them: for a unit smaller than a node of its
        kind (scoring on) the least likely to drain first (keep_whole.drain_last), else the usual order."""
        demand = _demand(plans)
        kind = self._kind(demand) if self.scoring and ranks and self.held_rules else None
        totals = self.kinds.total.get(kind, {}) if kind is not None else {}
        if kind is None or not totals or demand[0][1] >= max(totals.values()):
            return self._order_later(plans, ranks)
        return iter(drain_last(ranks, self.inv.node_names, self.inv.node_known, self.kinds.claims, self.kinds.free.get(kind, {})))

    def _order_later(self, plans: list[ClaimPlan], ranks: int) -> Iterator[str]:
        """`_order_nodes(plans, ranks)` worked out when the walk reaches it (after the nodes before
        it were tried, as their evaluations may tell the unit's kind), not when it is called."""
        yield from self._order_nodes(plans, ranks)

    # --- whole nodes kept for large claims ---------------------------------------------------

    def _shape(self, node: str) -> int:
        topo = self.topology.node(node)
        return topo.shape if topo is not None else -1

    def _group(self, group: Group) -> tuple[int, int]:
        """(node ranks, devices of the kind on each) of a group: the nodes of its shape with
        devices of its kind; worked out again when the inventory changes."""
        version = self.inv.version
        hit = self._groups.get(group)
        if hit is None or hit[0] != version:
            kind, shape = group
            totals = self.kinds.total.get(kind, {})
            ranks, size = 0, 0
            for node, total in totals.items():
                if total and node in self.inv.node_rank and self._shape(node) == shape:
                    ranks |= 1 << self.inv.node_rank[node]
                    size = max(size, total)
            hit = self._groups[group] = (version, ranks, size)
        return hit[1], hit[2]

    def kept_whole(self, plans: list[ClaimPlan]) -> int:
        """The node ranks the unit may not take because they are kept whole for large claims
        (keep_whole.py): per group of the unit's device kind that keeps some, the whole nodes
        of the group with the highest ranks (best fit breaks the lowest first), when the unit
        takes fewer devices than a node of the group has. 0: none (always, when it is off)."""
        demand = _demand(plans)
        kind = self._kind(demand)
        if kind is None:
            return 0
        need = demand[0][1]
        whole = self.kinds.whole.get(kind, 0)
        kept = 0
        for group, count in self.keep_whole.groups(kind):
            ranks, size = self._group(group)
            if need >= size:
                continue  # a large unit itself: what is kept is for it
            free = whole & ranks
            while count and free:
                top = 1 << (free.bit_length() - 1)
                kept |= top
                free ^= top
                count -= 1
        return kept

    def describe_kept(self, plans: list[ClaimPlan]) -> list[str]:
        """The whole nodes the unit may not take because they are kept for large claims, in words
        for `dralloc explain` ([] when none: always, when keep_whole is off)."""
        if self.keep_whole.factor <= 0 or not self.scoring:
            return []
        kept = self.kept_whole(plans)
        if not kept:
            return []
        return [
            f"kept whole for large claims: {nodes_in_words([self.inv.node_names[r] for r in iter_bits(kept)])} (in proportion to "
            "the large claims placed on nodes of their kind recently; a smaller claim does not break them, and waits)"
        ]

    # --- nodes -------------------------------------------------------------------------

    def order_nodes(self, plans: list[ClaimPlan], viable: int, *, skip_short: bool = False) -> Iterator[str]:
        """Known nodes among the `viable` ranks (-1: all), in the order to try them.

        `skip_short`: leave out the nodes where the unit must fail at the candidate filters
        (`_short`: too few free matching devices), yielding only the first of them, last, so
        that a refusal still says why; each is noted as a misfit (`note_misfit`), so later
        units of the same shape leave it out too until it changes. The order of the rest, and
        so the node taken, is the same: a node left out is one the engine would have tried and
        failed on. Not for `explain`, which reports every node."""
        inv = self.inv
        names = inv.node_names
        viable &= (1 << len(names)) - 1
        if self.keep_whole.factor > 0 and self.scoring:
            viable ^= viable & self.kept_whole(plans)
        order: Iterator[str]
        if self.reserved_nodes & viable:
            # nodes holding devices reserved for a waiting claim last: a claim takes them only
            # when nothing else fits; one whole again only a unit as large as it, and a smaller
            # unit the one least likely to drain first (keep_whole.py: held_whole, drain_last)
            viable ^= viable & self.held_whole(plans)
            order = chain(self._order_nodes(plans, viable ^ (viable & self.reserved_nodes)), self._held_order(plans, viable & self.reserved_nodes))
        else:
            order = self._order_nodes(plans, viable)
        alt = _single(plans) if skip_short and not inv.nonlocal_bits else None
        if alt is None:
            yield from order
            return
        first_short = None
        rank, short = inv.node_rank, 0  # the short nodes not noted yet: noted together before the next yield
        try:
            for name in order:
                topo = self.topology.node(name)
                if topo is not None and self._short(topo, alt):
                    short |= 1 << rank[name]
                    first_short = first_short or name
                    continue
                if short:
                    self._note_short(plans, short)
                    short = 0
                yield name
        finally:  # (also when an evaluation in `_short` ends the unit: those passed are noted, as one by one)
            if short:
                self._note_short(plans, short)
        if first_short is not None:
            yield first_short

    def _note_short(self, plans: list[ClaimPlan], ranks: int) -> None:
        """Note the nodes of `ranks` as misfits of the unit (`note_misfit`), if anyone listens."""
        if self.note_misfit is not None:
            self.note_misfit(plans, ranks)

    def _short(self, topo: NodeTopology, alt: Alt) -> bool:
        """Whether a unit of the one request `alt` (`_single`) must fail on the node at the
        candidate filters: fewer of its own devices match, are not in use and pass the counter
        and capacity filters than it wants (the other filters only narrow that list), and no
        selector fails on any of them (a CEL error there is another outcome). The node's verdict
        is the one the walk read already. Only shared and counter-consuming devices are tested
        one by one (`filters.room_for`), and only until enough pass: on a MIG node whose counters
        a slice holds, or an L40S node whose memory shares hold, most node tries failed there."""
        matched, failed = self.local_verdict(topo, alt)
        if failed:
            return False
        free = matched & ~self.kinds.used_on(topo.node, topo.lo)
        need = alt.count
        if free.bit_count() < need:
            return True
        special = free & topo.special
        if not special:
            return False
        need -= (free ^ special).bit_count()  # plain devices: the counter and capacity filters keep them
        if need <= 0:
            return False
        devices, ledger, lo = self.inv.devices, self.ledger, topo.lo
        for off in iter_bits(special):
            rec = devices[off + lo]
            if rec is not None and room_for(ledger, alt, rec):
                need -= 1
                if not need:
                    return False
        return True

    def _order_nodes(self, plans: list[ClaimPlan], viable: int) -> Iterator[str]:
        """Known nodes among the `viable` ranks, in the order to try them. Worked out when called
        and walked lazily: a function returning the walk, not a generator around it (a generator
        still suspended when a node fits is closed by a GeneratorExit thrown through it, per claim)."""
        inv = self.inv
        names = inv.node_names
        if not self.scoring:
            return (names[rank] for rank in iter_bits(viable) if names[rank] in inv.node_known)
        demand = _demand(plans)
        if not demand or (len(demand) == 1 and demand[0][1] < 2):
            # one device of the class, any: it gains nothing from NVLink, so nodes without it
            # first and NVLink capacity stays for the claims that need several devices close
            # together. (Not for a claim with its own selectors: those often exclude the
            # non-NVLink nodes, and trying them all first would cost an evaluation each.)
            nvlink = self.topology.nvlink_ranks if demand and not demand[0][0].selectors else 0
            kind = self._kind(demand)
            order = (
                chain(self._fit_order(viable ^ (viable & nvlink), kind), self._fit_order(viable & nvlink, kind))
                if viable & nvlink
                else self._fit_order(viable, kind)
            )
            if demand and kind is None:
                return self._full_last(plans, demand[0][0], order)
            # with the kind known, the buckets only hold nodes with a free device of that kind
            return map(names.__getitem__, order)
        return self._locality_order(plans, demand, viable)

    def _full_last(self, plans: list[ClaimPlan], alt: Alt, order: Iterator[int]) -> Iterator[str]:
        """The nodes of `order` (ranks), those where `alt` (the unit's first request, its kind not
        known yet: the buckets counted every kind) has no free device last."""
        names = self.inv.node_names
        if not self.inv.nonlocal_bits:
            order = self._settled(order, alt)
        later = []
        for rank in order:
            name = names[rank]
            if not self._any_free(name, alt):
                if self.learn is not None:  # the engine does not try it now: remember what it matches
                    self.learn(plans, name, self.inv.node_bits(name))
                later.append(name)  # full for this request: tried last (another alternative may fit)
            else:
                yield name
        yield from later

    def _settled(self, ranks: Iterator[int], alt: Alt) -> Iterator[int]:
        """`ranks`, each node's verdict for `alt` (`local_verdict`) settled as it is yielded: where
        no device of the node needs an evaluation (`Verdicts.outcomes`: each takes a shared
        outcome known already, asked for a batch of nodes at a time: `_batch`), from those outcomes, added
        to the fleet-wide verdict (`Verdicts.record`) for all such nodes together, before a node
        that needs an evaluation or may be taken is yielded and when the walk is left; else by
        `local_verdict`'s `get` as before. The same verdicts, evaluations and charges as a
        `get` per node, without its few bitset operations as wide as the fleet and a projection
        of each device: the first claim of a class walks the fleet so (its kind not known yet)."""
        key, kinds = alt.verdict_key, self.kinds
        passed: list[tuple[int, int, int, int]] = []
        queue: list[int] = []
        known: dict[int, tuple[NodeTopology, tuple[int, int, int]]] = {}
        learned = 0
        try:
            while True:
                if not queue:
                    queue = self._batch(ranks)
                    if not queue:
                        return
                    known, learned = self._outcomes(queue, alt), self.verdicts.shared_outcomes
                rank = queue.pop()
                hit = known.get(rank)
                if hit is not None:
                    topo, (todo, class_matched, matched) = hit
                    topo.verdicts[key] = (matched, 0)
                    passed.append((topo.lo, todo, class_matched, matched & todo))
                    if not matched & ~kinds.used_on(topo.node, topo.lo):
                        yield rank  # (full for it: the walk passes it)
                        continue
                self.verdicts.record(alt, passed)  # the nodes passed, in walk order, before a node's own `get` or the engine's try
                passed.clear()
                yield rank
                if hit is None and queue and learned != self.verdicts.shared_outcomes:
                    # the node's evaluation found outcomes the rest may share
                    known, learned = self._outcomes(queue, alt), self.verdicts.shared_outcomes
        finally:
            self.verdicts.record(alt, passed)

    def _batch(self, ranks: Iterator[int]) -> list[int]:
        """The next ranks of `ranks`, up to WALK_BATCH nodes or WALK_DEVICES devices, last first."""
        names, topology, batch, devices = self.inv.node_names, self.topology, [], 0
        for rank in ranks:
            batch.append(rank)
            topo = topology.node(names[rank])
            devices += topo.span.bit_count() if topo is not None else 1
            if len(batch) >= WALK_BATCH or devices >= WALK_DEVICES:
                break
        return batch[::-1]

    def _outcomes(self, ranks: list[int], alt: Alt) -> dict[int, tuple[NodeTopology, tuple[int, int, int]]]:
        """Rank -> (topology, `Verdicts.outcomes`) of the nodes of `ranks` whose verdict for `alt`
        is not settled yet and is known from shared outcomes alone."""
        names, key = self.inv.node_names, alt.verdict_key
        todo = [(rank, topo) for rank in ranks if (topo := self.topology.node(names[rank])) is not None and key not in topo.verdicts]
        if not todo:
            return {}
        hits = self.verdicts.outcomes(alt, [(topo.lo, topo.span) for _, topo in todo])
        return {rank: (topo, hit) for (rank, topo), hit in zip(todo, hits) if hit is not None}

    def _kind(self, demand: Demand) -> DeviceKind | None:
        """The kind of device the unit's first request takes (from a device it is known to match)."""
        if not demand:
            return None
        known = self.verdicts.known(demand[0][0])
        matched = known.matched if known is not None else 0
        rec = self.inv.devices[matched.bit_length() - 1] if matched else None
        return rec.kind if rec is not None else None

    def _fit_order(self, viable: int, kind: DeviceKind | None = None, need: int = 1) -> Iterator[int]:
        """Known node ranks in best-fit order.

        Nodes already partly used (of the claim's `kind`: GPUs for a GPU claim,
        not its node's NICs) first, the fewest free first: a claim fills a hole
        before it breaks a whole node, so whole nodes stay for 8-GPU claims and
        gang members. Then the whole free nodes, the smallest first. In each,
        nodes outside any multi-node domain first, then domain by domain, the
        fullest domain first (fewest free devices): small claims concentrate
        where a domain is already broken, so whole cliques and racks stay free
        for gangs. With the kind not known yet, free devices of every kind are
        counted and nothing is known whole. `need`: the devices of the kind the unit takes;
        among partly used nodes those it would leave with a useful hole come first (`_hole_order`)."""
        whole = 0
        of, _ = self.topology.domains()
        counted: DeviceKind | None = None
        if kind is not None and kind in self.kinds.ge:
            free_ge, free = self.kinds.ge[kind], self.kinds.free[kind]
            whole = self.kinds.whole.get(kind, 0)
            # the free devices per domain are kept as the ledger changes (`KindIndex.domain_free`):
            # summing every member's count per claim was a pass over every node in a domain
            counted = kind
        else:
            free_ge, free = self.ledger.free_ge, self.ledger.free_local
        union = self.topology.domain_union() if of else 0
        order: list[str] = []  # the domains, fullest first: worked out by `_domain_parts` when first needed

        walks: tuple[tuple[int, bool], ...]  # (ranks, with_none) per walk
        if whole:
            # partly used nodes, then whole ones (the buckets take only nodes with a free device
            # of the kind: the parts hold no others), then those with none free
            free_ranks = viable & free_ge[1]
            walks = ((free_ranks ^ (free_ranks & whole), False), (viable & whole, False))
        else:
            walks = ((viable, True),)
        # each walk by buckets: the nodes outside any domain, then domain by domain (a loop here,
        # not a generator per walk: the usual claim takes the first node, and each generator
        # level left suspended is made and closed for it)
        for ranks, with_none in walks:
            inside = ranks & union
            yield from self._buckets(ranks ^ inside, free_ge, free, need, with_none=with_none)
            if inside:
                for part in self._domain_parts(inside, order, counted, free):
                    yield from self._buckets(part, free_ge, free, need, with_none=with_none)
        if whole:
            yield from self._known(viable ^ (viable & free_ge[1]) if len(free_ge) > 1 else viable)

    def _domain_parts(self, ranks: int, order: list[str], kind: DeviceKind | None, free: dict[str, int]) -> Iterator[int]:
        """`_fit_order`'s domains' parts of `ranks`, fullest domain first, lazily: only once a walk
        gets past the nodes outside any domain (the usual claim stops there), and only until
        `ranks` is used up (each part is a bitset operation as wide as the fleet's ranks: walking
        all 100 NVL72 racks at 250,000 GPUs for a claim whose candidates were in a few of them, or
        in none, was most of its time). `order` holds the domains in that order once worked out
        (empty before: one walk's calls share it); `kind`: the claim's kind when the free devices
        per domain are kept for it (`KindIndex.domain_free`, in `domain_order`, kept while their
        free counts stay), else None and `free` (per node) is summed. A method, not a closure in
        `_fit_order`: compiled, a closure and its frame point at each other, and every claim's
        walk was left to the cyclic collector."""
        if not order:
            of, members = self.topology.domains()
            rank = self.inv.node_rank
            if kind is not None:
                order.extend(self.kinds.domain_order(kind, of, members, rank))
            else:
                order.extend(sorted(members, key=lambda d: (sum(free.get(n, 0) for n in members[d]), rank[members[d][0]])))
        bits = self.topology.domain_bits()
        for d in order:
            part = ranks & bits[d]
            if part:
                yield part
                ranks ^= part
                if not ranks:
                    return

    def _buckets(self, viable: int, free_ge: list[int], free: dict[str, int], need: int = 1, *, with_none: bool = True) -> Iterator[int]:
        """Known node ranks of `viable` by free exclusive devices (buckets: free_ge[k] holds
        the nodes with at least k free, `free` their counts by node) in `_hole_order(need)`, then
        the most claims holding devices there (`KindIndex.by_claims`), then rank; lazily.
        `with_none`: then the nodes with none free (they may still have shared devices).
        At most one node with a free device (the usual walk: best fit fills one node at a time)
        is the whole order, whatever its count and claims: answered without a generator (one
        suspended when a node fits is closed by a GeneratorExit thrown through it, per claim)."""
        top = len(free_ge)
        # the nodes with a free device not yielded yet: the buckets stop once it is empty (each
        # is one bitset operation as wide as the fleet's ranks, per part of the walk)
        left = viable & free_ge[1] if top > 1 else 0
        if left & (left - 1):
            return self._by_buckets(viable, left, free_ge, free, need, with_none)
        rank = left.bit_length() - 1
        first = (rank,) if left and self.inv.node_names[rank] in self.inv.node_known else ()
        return chain(first, self._known(viable ^ (viable & free_ge[1]) if top > 1 else viable)) if with_none else iter(first)

    def _by_buckets(self, viable: int, left: int, free_ge: list[int], free: dict[str, int], need: int, with_none: bool) -> Iterator[int]:
        """`_buckets` for two nodes or more with a free device (`left`)."""
        top = len(free_ge)
        by_claims, by_claims_first = self.kinds.by_claims, self.kinds.most_claims_first
        names, known = self.inv.node_names, self.inv.node_known
        order: tuple[int, ...] | list[int] = _hole_order(need, top)
        groups: dict[int, int] | None = None
        if len(order) > 32 and left.bit_count() * 4 < len(order):
            # counts reach the hundreds for MIG slices (a node's 400 partitions are devices of one
            # kind): with fewer nodes than counts to scan, the nodes' own counts (`free`, by name)
            # are grouped instead of one bitset test per count (a few counts: the scan is cheaper)
            found: dict[int, int] = {}
            for rank in iter_bits(left):
                k = free[names[rank]]
                found[k] = found.get(k, 0) | (1 << rank)
            groups, order = found, sorted(found, key=_hole_place(need, top).__getitem__)
        for k in order:  # lazily: the first bucket usually holds the node taken
            if not left:
                break
            if groups is not None:
                bucket = groups[k]
            else:
                at_least = left & free_ge[k]
                if not at_least:
                    continue
                bucket = at_least ^ (at_least & free_ge[k + 1]) if k + 1 < top else at_least
            left ^= bucket
            # equally full: the node with the most claims first. It drains last anyway (every claim
            # on it must leave before it is whole again), so one more claim there delays a whole
            # node least; a node with few claims is the next to become whole for a large claim.
            # (0: the bucket's nodes that no claim holds a device of.) In each part the lowest
            # rank first, lazily: the first node usually fits.
            for n in (*by_claims_first, 0):
                part = bucket & by_claims[n] if n else bucket
                if not part:
                    continue
                bucket ^= part
                while part:
                    low = part & -part
                    part ^= low
                    r = low.bit_length() - 1
                    if names[r] in known:
                        yield r
                if not bucket:
                    break
        if with_none:
            yield from self._known(viable ^ (viable & free_ge[1]) if top > 1 else viable)

    def _known(self, ranks: int) -> Iterator[int]:
        names, known = self.inv.node_names, self.inv.node_known
        return (r for r in iter_bits(ranks) if names[r] in known)

    def _any_free(self, node: str, alt: Alt) -> bool:
        topo = self.topology.node(node) if not self.inv.nonlocal_bits else None
        if topo is not None:
            return bool(self.local_verdict(topo, alt)[0] & ~self.kinds.used_on(node, topo.lo))
        mask, _ = self.inv.node_mask(node)
        matched = self.verdicts.get(alt, mask).matched & mask
        return matched != matched & self.ledger.used_bits

    def local_verdict(self, topo: NodeTopology, alt: Alt) -> tuple[int, int]:
        """(matched, failed): the devices of `alt`'s selector verdict among the node's own
        (node-local) devices, shifted by `topo.lo`; evaluated on the node's devices if they
        were not yet. Kept on the node's topology (`NodeTopology.verdicts`): the verdict's
        bitsets span the fleet, and cutting the node's part out of them (`& mask`) cost a
        fleet-wide operation per node and claim; this is one per node and selector set."""
        hit = topo.verdicts.get(alt.verdict_key)
        if hit is None:
            mask = self.inv.node_bits(topo.node)
            # (the node's own devices alone, unless some are reachable from it: none below its `lo`)
            verdict = self.verdicts.get(alt, mask, 0 if self.inv.nonlocal_bits else topo.lo)
            lo, span = topo.lo, topo.span
            failed = ((verdict.failed & mask) >> lo) & span if verdict.failed else 0
            hit = topo.verdicts[alt.verdict_key] = (((verdict.matched & mask) >> lo) & span, failed)
        return hit

    def _locality_order(self, plans: list[ClaimPlan], demand: Demand, viable: int) -> Iterator[str]:
        names = self.inv.node_names
        topology = self.topology
        key = _demand_key(demand)
        scanned: list[tuple[int, int, str]] = []
        unfit: list[str] = []
        order = self._fit_order(viable, self._kind(demand), demand[0][1])
        for rank in order:
            name = names[rank]
            topo = topology.node(name)
            level = self._level(topo, name, demand, True)
            if level is not None and level <= self._static_level(name, demand, topo, key):
                yield name  # the best its hardware can do, on the fullest such node (the engine learns it)
                break
            if self.learn is not None:  # scored here, perhaps never tried: remember what it matches
                self.learn(plans, name, self.inv.node_bits(name))
            if level is None:
                unfit.append(name)
                continue
            scanned.append((level, len(scanned), name))
            if len(scanned) >= SCAN_LIMIT:
                break
        else:
            order = iter(())
        for _, _, name in sorted(scanned):
            yield name
        for rank in order:
            yield names[rank]
        yield from unfit

    def node_level(self, node: str, demand: Demand, *, free_only: bool = True) -> int | None:
        """The tightest level at which one group of `node` has enough free devices for every
        request of the demand (NODE if only the node as a whole has), None if the node has not."""
        return self._level(self.topology.node(node), node, demand, free_only)

    def _level(self, topo: NodeTopology | None, node: str, demand: Demand, free_only: bool) -> int | None:
        if topo is None or not topo.groups:
            return None
        if len(demand) > 1 or (demand and demand[0][1] >= 2):
            level = self._masked_level(topo, node, demand, free_only)
            if level is not _PER_DEVICE:
                return level  # type: ignore[return-value]  # not the _PER_DEVICE sentinel: an int or None
        counts = self._counts(topo, node, demand, free_only)
        if counts is None:
            return None
        return _tightest(topo, counts, demand)

    def _masked_level(self, topo: NodeTopology, node: str, demand: Demand, free_only: bool) -> int | None | object:
        """`node_level` with bitsets: per group, its free matching devices counted with one
        `&` and `bit_count()` (groups of one device cannot hold a demand of two). A shared
        device does not count one bit (`_counts` counts it as enough alone), nor does a
        counter-consuming one when every item wants one device (`_counts` then also counts
        groups of one device): `_PER_DEVICE` says to count them one by one (`_counts`)."""
        # the node's own bits only (shifted by `lo`): nothing here is as wide as the fleet
        free = topo.span & ~self.kinds.used_on(node, topo.lo) if free_only else topo.span
        items: list[tuple[int, int]] = []
        for alt, count in demand:
            bits = self.local_verdict(topo, alt)[0] & free
            special = bits & topo.special
            if special:
                unfit = self._unfit(topo, special, free_only) if max(n for _, n in demand) >= 2 else None
                if unfit is None:
                    return _PER_DEVICE
                bits ^= unfit
            if alt.constraint_attributes:
                bits &= self._having(topo, alt.constraint_attributes)
            if bits.bit_count() < count:
                return None
            items.append((bits, count))
        named = topo.names[NVLINK]
        for pos in GROUP_LEVELS:
            for gid, _, group in topo.masks[pos]:
                if pos == NVLINK and gid not in named:
                    continue  # devices "alone" on no NVLink domain
                for bits, count in items:
                    if (bits & group).bit_count() < count:
                        break
                else:
                    return pos
        return NODE

    def _unfit(self, topo: NodeTopology, special: int, free_only: bool) -> int | None:
        """Of the node's `special` devices (shifted by `lo`), those `_counts` leaves out: removed,
        or (with `free_only`) short of counter room (`Ledger.counters_fit`); the rest count one
        bit each. None when one of them is shared: it counts as a whole demand item alone."""
        devices, lo, ledger = self.inv.devices, topo.lo, self.ledger
        unfit = 0
        for off in iter_bits(special):
            rec = devices[off + lo]
            if rec is None:
                unfit |= 1 << off
            elif rec.multi:
                return None
            elif free_only and not ledger.counters_fit(rec):  # (a method call: native to native)
                unfit |= 1 << off
        return unfit

    def _having(self, topo: NodeTopology, attributes: tuple[str, ...]) -> int:
        """The node's devices (shifted by `lo`) that have every one of the attributes (a
        matchAttribute or distinctAttribute needs them): from the node's value bitsets
        (`value_bits`, cached on its topology and rebuilt with it)."""
        bits = topo.span
        for attribute in attributes:
            bits &= value_bits(self.inv, topo, attribute)[0]
        return bits

    def _static_level(self, node: str, demand: Demand, topo: NodeTopology | None = None, demand_key: DemandKey | None = None) -> int:
        """The best level the node's hardware could give the demand if it were free (cached).
        `topo`, `demand_key`: the node's topology and `_demand_key(demand)`, when the caller has them."""
        if topo is None:
            topo = self.topology.node(node)
        key = (node, topo.stamp if topo else None, demand_key if demand_key is not None else _demand_key(demand))
        if key not in self._static:
            if len(self._static) > 100_000:
                self._static.clear()
            self._static[key] = self.node_level(node, demand, free_only=False)
        level = self._static[key]
        return NODE if level is None else level

    def _counts(self, topo: NodeTopology, node: str, demand: Demand, free_only: bool) -> list[list[dict[int, int]]] | None:
        """Per demand item, per level: group -> free matching devices (shared devices count as enough)."""
        inv, ledger = self.inv, self.ledger
        lo = topo.lo
        used = self.kinds.used_on(node, lo) if free_only else 0
        out = []
        for alt, count in demand:
            matched = self.local_verdict(topo, alt)[0]
            bits = matched ^ (matched & used)
            needs = alt.constraint_attributes
            per_level: list[dict[int, int]] = [{} for _ in GROUP_LEVELS]
            total = 0
            for off in iter_bits(bits):
                rec = inv.devices[off + lo]
                groups = topo.groups.get(off + lo)
                if rec is None or groups is None:
                    continue
                if free_only and not ledger.counters_fit(rec):
                    continue
                if needs and any(rec.attribute(a) is None for a in needs):
                    continue  # a matchAttribute / distinctAttribute the device lacks
                weight = count if rec.multi else 1
                total += weight
                for pos, gid in enumerate(groups):
                    level = per_level[pos]
                    level[gid] = level.get(gid, 0) + weight
            if total < count:
                return None
            out.append(per_level)
        return out

    # --- devices on one node -----------------------------------------------------------

    def order_slots(self, slots: list[Slot], node: str | None) -> dict[int, int] | None:
        """Sort each slot's candidates best first (in place); returns device id -> rank,
        the order in which matchAttribute values are tried. None: order unchanged. A unit of
        one device from partitions (a MIG slice) then takes the one that blocks the fewest
        partitions in use (partitions.py), the topology order breaking ties."""
        if not self.scoring:
            return None
        demanding = [s for s in slots if not s.alt.all_mode]
        ordered = self._topology_order(demanding, node)
        if len(demanding) == 1 and demanding[0].alt.count == 1 and len(demanding[0].cands) > 1:
            ordered = self.partitions.reorder(demanding[0].cands) or ordered
        if not ordered:
            return None
        rank: dict[int, int] = {}
        for slot in slots:
            for rec in slot.cands:
                rank.setdefault(rec.id, len(rank))
        return rank

    def _topology_order(self, demanding: list[Slot], node: str | None) -> bool:
        """Sort the demanding slots' candidates closest and best fit first (in place); False when
        there is nothing to choose (every candidate is taken, or none shares anything)."""
        topo = self.topology.node(node)
        if topo is None or topo.flat or not demanding or all(len(s.cands) <= s.alt.count for s in demanding):
            return False
        groups = topo.groups
        # The order depends only on the candidates' groups, which are shared and how many each
        # slot needs, and on the node's structure: nodes of one profile in the same state (the
        # usual case in a fleet) reuse it. Candidates come in Kubernetes' order, so the list
        # index stands for the tie-break.
        memo_key = (topo.shape, *((s.alt.count, tuple([groups.get(r.id) for r in s.cands]), tuple([r.multi for r in s.cands])) for s in demanding))
        orders = self._slot_orders.get(memo_key)
        if orders is None:
            orders = self._slot_order(demanding, topo)
            if len(self._slot_orders) > 100_000:
                self._slot_orders.clear()
            self._slot_orders[memo_key] = orders
        for slot, order in zip(demanding, orders):
            cands = slot.cands
            slot.cands[:] = [cands[i] for i in order]
        return True

    def _slot_order(self, demanding: list[Slot], topo: NodeTopology) -> list[tuple[int, ...]]:
        """Per slot, its candidates' indexes best first (see `order_slots`)."""
        groups = topo.groups
        levels = range(len(GROUP_LEVELS))
        totals: list[dict[int, int]] = [{} for _ in levels]
        holds: list[set[int] | None] = [None] * len(GROUP_LEVELS)
        for slot in demanding:
            need = slot.alt.count
            alike: dict[tuple[int, ...], int] = {}  # devices of one GPU/switch/... share a tuple
            for rec in slot.cands:
                g = groups.get(rec.id)
                if g is not None:
                    alike[g] = alike.get(g, 0) + (need if rec.multi else 1)
            for pos in levels:
                counts: dict[int, int] = {}
                for g, n in alike.items():
                    counts[g[pos]] = counts.get(g[pos], 0) + n
                ok = {gid for gid, n in counts.items() if n >= need}
                held = holds[pos]
                holds[pos] = ok if held is None else held & ok
                total = totals[pos]
                for gid, n in counts.items():
                    total[gid] = total.get(gid, 0) + n
        named = topo.names[NVLINK]
        holds[NVLINK] = {gid for gid in holds[NVLINK] or () if gid in named}
        holding = [h if h is not None else set() for h in holds]  # a level no slot demands holds nothing
        far = ((1, 1, 1, 1, 1), 0, (), 0)
        memo: dict[tuple[int, ...], _SortKey] = {}  # a device's groups -> its key (`_group_key`)
        out = []
        # (loops, not closures: compiled, a closure and its frame point at each other, and each
        # call's frame was left to the cyclic collector)
        for slot in demanding:
            heads: list[_SortKey] = []
            for rec in slot.cands:
                g = groups.get(rec.id)
                if g is None:
                    heads.append(far)
                    continue
                head = memo.get(g)
                if head is None:
                    head = memo[g] = _group_key(g, holding, totals)
                heads.append(head)
            out.append(tuple(sorted(range(len(heads)), key=heads.__getitem__)))  # (stable: ties by index)
        return out

    # --- words ---------------------------------------------------------------------------

    def describe(self, node: str | None, chosen: list[DeviceRec], demand: Demand) -> list[str]:
        """The chosen placement's score against the next best, in words (for `dralloc explain`)."""
        if not self.scoring:
            return ["placement: scoring is off; the first valid devices in Kubernetes' order were taken"]
        topo = self.topology.node(node)
        if node is None or topo is None or not chosen:  # (no node: no topology either)
            return []
        ids = [rec.id for rec in chosen]
        lines = [f"placement on node {node}: {self._closeness(topo, ids)}; {self._fullness(node, demand, ids)}"]
        if sum(c for _, c in demand) >= 2:
            level = level_of(topo, ids)
            best = self._static_level(node, demand)
            lines.append(
                f"locality: {_WORDS[level]}"
                + (" (the tightest this node's hardware allows)" if level <= best else f" (the hardware allows {_WORDS[best]}, but not enough of it is free)")
            )
        other = self._next_best(node, demand)
        if other is not None:
            name, level = other
            lines.append(f"next best: node {name}: {_WORDS[level]}; {self._fullness(name, demand, [])}")
        else:
            lines.append("next best: none; no other node could hold it now")
        if demand:
            lines.append(self._hole(node, demand, ids))
        if len(chosen) == 1 and self.partitions.partition(chosen[0]):
            lines.append(PARTITION_WORDS)
        if node is not None and (self.reserved_nodes >> self.inv.node_rank.get(node, 0)) & 1 and node in self.inv.node_rank:
            lines.append(f"reserved: node {node} holds devices reserved for a claim that waits; taken because no node without one could hold this claim")
        return lines

    def describe_wait(self, devices: int, subject: str = "it") -> list[str]:
        """What a claim (or `subject`: a gang) that may wait would hold while it waits, in words for
        `dralloc explain`: per node of `devices` (a reservation, `gang.reservation_for`), its matching
        devices in use and the claims holding them, which it waits for. [] for no reservation."""
        if not devices:
            return []
        inv, ledger = self.inv, self.ledger
        per_node: dict[str, list[DeviceRec]] = {}
        for i in iter_bits(devices):
            rec = inv.devices[i]
            if rec is not None and rec.local_node is not None:
                per_node.setdefault(rec.local_node, []).append(rec)
        parts = []
        for node in sorted(per_node, key=lambda n: inv.node_rank.get(n, 0)):
            recs = per_node[node]
            holders = sorted({h for rec in recs if (h := ledger.exclusive.get(rec.key)) is not None})
            shown = ", ".join(holders[:4]) + (f" and {len(holders) - 4} more" if len(holders) > 4 else "")
            busy = sum(1 for rec in recs if (ledger.used_bits >> rec.id) & 1)
            parts.append(f"node {node} ({busy} of {len(recs)} devices in use" + (f", by {shown})" if holders else ")"))
        return [
            f"if {subject} may wait (dralloc.dev/max-wait), the allocator holds for it what is closest to fitting "
            f"(other claims take it last; {subject} waits for the claims there to leave): {'; '.join(parts)}"
        ]

    def _hole(self, node: str, demand: Demand, chosen: list[int]) -> str:
        """What the choice leaves free on the node of the first request's devices, in words
        (`_hole_order`: a block of a power of two is a useful hole, other sizes awkward)."""
        alt = demand[0][0]
        mask, _ = self.inv.node_mask(node)
        matched = self.verdicts.get(alt, mask).matched & mask
        left = self._free_count(node, alt, matched, chosen) - len([i for i in chosen if (matched >> i) & 1])
        total = matched.bit_count()
        if left <= 0:
            return f"hole left: none (all {total} matching devices of the node in use)"
        useful = left & (left - 1) == 0
        return f"hole left: {left} of {total} matching devices free" + (
            " (a useful block: a power of two)"
            if useful
            else " (awkward: not a power of two; best fit prefers nodes it leaves a power of two free, at equal fullness)"
        )

    def _closeness(self, topo: NodeTopology, ids: list[int]) -> str:
        if len(ids) == 1:
            g = topo.groups.get(ids[0])
            if g is None:
                return "one device"
            parts = [topo.names[level][g[level]] for level in (SWITCH, NUMA) if g[level] in topo.names[level]]
            return "one device" + (f" (on {', '.join(parts)})" if parts else "")
        words = []
        for level, same, differ in (
            (NVLINK, "same NVLink domain", "not all on one NVLink domain"),
            (SWITCH, "same PCIe switch", "{n} PCIe switches"),
            (ROOT, "same PCIe root", "{n} PCIe roots"),
            (NUMA, "same NUMA node", "{n} NUMA nodes"),
        ):
            seen = {topo.groups[i][level] for i in ids if i in topo.groups}
            named = all(topo.groups[i][level] in topo.names[level] for i in ids if i in topo.groups)
            if len(seen) == 1 and named:
                name = topo.names[level][seen.pop()]
                words.append(f"{same} ({name})")
                if level in (SWITCH, ROOT):
                    break  # the coarser PCIe levels follow
            elif level != NVLINK or any(topo.groups[i][NVLINK] in topo.names[NVLINK] for i in ids if i in topo.groups):
                words.append(differ.format(n=len(seen)))
        return ", ".join(words) or "same node"

    def _fullness(self, node: str, demand: Demand, chosen: list[int]) -> str:
        """How full the node was for the demand's first request before the `chosen` devices were
        taken (whether or not they are committed yet): its matching devices in use."""
        if not demand:
            return ""
        alt = demand[0][0]
        mask, _ = self.inv.node_mask(node)
        matched = self.verdicts.get(alt, mask).matched & mask
        total = matched.bit_count()
        if not total:
            return "no matching devices"
        free = self._free_count(node, alt, matched, chosen)
        used = total - free
        return f"node {round(100 * used / total)}% full ({used} of {total} matching devices in use before)"

    def _free_count(self, node: str, alt: Alt, matched: int, chosen: list[int]) -> int:
        ledger = self.ledger
        mine = set(chosen)
        n = 0
        for i in iter_bits(matched):
            rec = self.inv.devices[i]
            if rec is None:
                continue
            if i in mine or ledger.free(rec):
                n += 1
        return n

    def _next_best(self, chosen: str | None, demand: Demand) -> tuple[str, int] | None:
        """The best other node for the same demand now, by (level, best-fit order)."""
        if not demand:
            return None
        total = sum(c for _, c in demand)
        best: tuple[int, int, str] | None = None
        for n, rank in enumerate(self._fit_order(-1 & ((1 << len(self.inv.node_names)) - 1))):
            name = self.inv.node_names[rank]
            if name == chosen:
                continue
            level = self.node_level(name, demand)
            if level is None:
                continue
            if total < 2:
                return name, level
            if best is None or (level, n) < best[:2]:
                best = (level, n, name)
            if n >= SCAN_LIMIT or level <= self._static_level(name, demand):
                break
        return (best[2], best[0]) if best else None


_WORDS = {
    GPU: "one device",
    NVLINK: "same NVLink domain",
    SWITCH: "same PCIe switch",
    ROOT: "same PCIe root",
    NUMA: "same NUMA node",
    NODE: "spread over the node",
}


def nodes_in_words(names: list[str]) -> str:
    """`node a`, or `nodes a, b, c, d and 3 more`: nodes as `explain` names them (at most four)."""
    shown = ", ".join(names[:4]) + (f" and {len(names) - 4} more" if len(names) > 4 else "")
    return f"node{'s' if len(names) > 1 else ''} {shown}"


def _group_key(g: tuple[int, ...], holding: list[set[int]], totals: list[dict[int, int]]) -> _SortKey:
    """`Placement._slot_order`'s key of a device by its groups `g` (per level): the levels where it
    is in a group that holds every slot (0) or not (1), the tightest such level's fit, then best
    fit outward (the fullest NVLink domain, NUMA node, root, switch, GPU), then that group."""
    vector = tuple(0 if g[pos] in holding[pos] else 1 for pos in range(len(GROUP_LEVELS)))
    tight = vector.index(0) if 0 in vector else NODE
    fit = totals[tight][g[tight]] if tight != NODE else 0
    coarse = (
        totals[NVLINK][g[NVLINK]],
        totals[NUMA][g[NUMA]],
        totals[ROOT][g[ROOT]],
        totals[SWITCH][g[SWITCH]],
        totals[GPU][g[GPU]],
    )
    return (vector, fit, coarse, g[tight] if tight != NODE else 0)


class KindIndex:
    """Free exclusive node-local devices per kind and node, and per kind the bitsets of node
    ranks with at least k free (the ledger's `free_ge`, by kind) and of the nodes with every
    device of the kind free (`whole`). Also the claims holding exclusive devices on each node
    (`claims`) and the node ranks by that number (`by_claims`): among equally full nodes best fit
    takes the one with the most claims. Kept in step with the ledger (its `on_charge` hook) and
    with pool rebuilds, so best fit reads it per claim for free."""

    def __init__(self, inventory: Inventory, ledger: Ledger, keep: KeepWhole | None = None, shape: Callable[[str], int] | None = None) -> None:
        self.inv = inventory
        self.ledger = ledger
        self.keep = keep
        """Told of every claim placed and of every large placement (a claim taking every device of
        its kind on a node), while it is on; `shape` names a node's hardware shape for it."""
        self.shape = shape
        self.free: dict[DeviceKind, dict[str, int]] = {}
        self.total: dict[DeviceKind, dict[str, int]] = {}
        self.ge: dict[DeviceKind, list[int]] = {}
        self.whole: dict[DeviceKind, int] = {}
        self.held: dict[int, tuple[str, str]] = {}
        """Device id -> (its node, the claim holding it), for the exclusive node-local devices in use
        (by id, not key: an int hashes for free; a rebuilt pool's devices have new ids, never reused)."""
        self.claims: dict[str, dict[str, int]] = {}
        """Node -> claim -> its exclusive devices there."""
        self.by_claims: dict[int, int] = {}
        """n >= 1 -> the node ranks with exactly n claims holding devices there."""
        self.most_claims_first: list[int] = []
        """The keys of `by_claims` with a node, largest first."""
        self.used_local: dict[str, tuple[int, int]] = {}
        """Node -> (lo, its node-local devices in exclusive use as a bitset shifted by lo): the
        ledger's `used_bits` cut down to the node, kept per charge (`used_on`)."""
        self._domain_of: dict[str, str] | None = None
        self._domain_free: dict[DeviceKind, dict[str, int]] = {}
        """Per kind: multi-node domain -> free devices of the kind on its nodes, for the domains of
        `_domain_of` (`domain_free`); kept in step by `_set`."""
        self._domain_order: dict[DeviceKind, list[str]] = {}
        """Per kind: the domains of `_domain_of` in `domain_order`; dropped when a count changes."""
        ledger.on_charge.append(self._charge)
        inventory.on_pool_rebuilt.append(self._rebuilt)  # after the ledger's own (registered first)

    def used_on(self, node: str, lo: int) -> int:
        """The node's local devices in exclusive use (the ledger's `used_bits` of the node),
        shifted by `lo` (the node's lowest device id): O(the node), not O(the fleet)."""
        hit = self.used_local.get(node)
        if hit is None:
            return 0
        at, bits = hit
        return bits << (at - lo) if at >= lo else bits >> (lo - at)

    def _charge(self, recs: list[DeviceRec], sign: int) -> None:
        """The ledger took (+1) or freed (-1) one record's exclusive devices: each node's and kind's
        free count, and each claim's holding on a node, changes once for them all."""
        keep = self.keep is not None and self.keep.factor > 0 and sign > 0
        if len(recs) == 1:
            self._charge_one(recs[0], sign, keep)
            return
        if keep:
            for rec in recs:  # keep_whole's clock reads each device's charge in turn (`_seen`)
                self._charge_one(rec, sign, keep)
            return
        # runs of devices of one node and kind, and of one node and claim (a record's devices are
        # mostly one run): counted as they come, not in dicts keyed by a tuple per device. A
        # (node, kind) in two runs is set twice, which leaves the counts as once would.
        counts: list[tuple[str, DeviceKind, int]] = []
        holds: list[tuple[str, str, int]] = []
        run_node = run_kind = hold_node = hold_claim = ""
        run_n = hold_n = 0
        exclusive, held, local, used_local = self.ledger.exclusive, self.held, self.inv.local, self.used_local
        # the node's devices in use as one (lo, bits) read and written once per run of devices on
        # it, not a tuple made and stored per device
        at_node: str | None = None
        at = bits = 0
        for rec in recs:
            node = rec.local_node
            if node is None:
                continue
            if node != at_node:
                if at_node is not None:
                    used_local[at_node] = (at, bits)
                at_node = node
                at, bits = used_local.get(node) or (local.span(node)[0], 0)
            if rec.id < at:  # (a node's ids only grow, but keep it right if one did not)
                bits, at = bits << (at - rec.id), rec.id
            bit = 1 << (rec.id - at)
            bits = bits | bit if sign > 0 else bits ^ (bits & bit)
            if rec.multi:
                continue
            kind = rec.kind
            if run_n and node == run_node and kind == run_kind:
                run_n += 1
            else:
                if run_n:
                    counts.append((run_node, run_kind, run_n))
                run_node, run_kind, run_n = node, kind, 1
            # the ledger names the holder before it charges a device and forgets it before it frees one
            if sign > 0:
                claim = exclusive.get(rec.key)
                if claim is None:
                    continue
                held[rec.id] = (node, claim)
                holder = node
            else:
                was = held.pop(rec.id, None)
                if was is None:
                    continue
                holder, claim = was
            if hold_n and holder == hold_node and claim == hold_claim:
                hold_n += 1
            else:
                if hold_n:
                    holds.append((hold_node, hold_claim, hold_n))
                hold_node, hold_claim, hold_n = holder, claim, 1
        if at_node is not None:
            used_local[at_node] = (at, bits)
        if run_n:
            counts.append((run_node, run_kind, run_n))
        if hold_n:
            holds.append((hold_node, hold_claim, hold_n))
        for node, kind, n in counts:
            free = self.free.get(kind)
            self._set(kind, node, (free.get(node, 0) if free is not None else 0) - sign * n)
        for node, claim, n in holds:
            self._hold(node, claim, sign * n)

    def _charge_one(self, rec: DeviceRec, sign: int, keep: bool) -> None:
        """`_charge` of one device (most records hold one): as the loop there does, without its
        dicts of counts and holds and the tuples that key them (a third of a charge's work)."""
        node = rec.local_node
        if node is None:
            return
        used_local = self.used_local
        hit = used_local.get(node)
        at, bits = hit if hit is not None else (self.inv.local.span(node)[0], 0)
        if rec.id < at:  # (a node's ids only grow, but keep it right if one did not)
            bits, at = bits << (at - rec.id), rec.id
        bit = 1 << (rec.id - at)
        used_local[node] = (at, bits | bit if sign > 0 else bits ^ (bits & bit))
        if rec.multi:
            return
        kind = rec.kind
        free = self.free.get(kind)
        self._set(kind, node, (free.get(node, 0) if free is not None else 0) - sign)
        if sign > 0:
            claim = self.ledger.exclusive.get(rec.key)
            if claim is None:
                return
            self.held[rec.id] = (node, claim)
        else:
            was = self.held.pop(rec.id, None)
            if was is None:
                return
            node, claim = was
        self._hold(node, claim, sign)
        if keep:  # (one device: `_seen` reads the counts with it charged)
            self._seen(kind, node, claim)

    def _seen(self, kind: DeviceKind, node: str, claim: str) -> None:
        """A device of `claim` charged on `node`: its first there is a claim placed (a tick of
        keep_whole's clock); the one that leaves no device of the kind free with the claim alone
        on the node, holding all of them, is a large placement of the node's group."""
        keep, on = self.keep, self.claims.get(node, {})
        assert keep is not None
        held = on.get(claim, 0)
        if held == 1:
            keep.placed()
        total = self.total.get(kind, {}).get(node, 0)
        if total and held >= total and len(on) == 1 and self.free[kind].get(node, 0) == 0 and self.shape is not None:
            keep.large((kind, self.shape(node)))

    def _hold(self, node: str, claim: str, sign: int) -> None:
        """`sign` more (> 0) or fewer (< 0) devices of `claim` on `node`; O(1) (two bitset flips when
        the node's number of claims changes)."""
        on = self.claims.setdefault(node, {})
        before = len(on)
        left = on.get(claim, 0) + sign
        if left > 0:
            on[claim] = left
        else:
            on.pop(claim, None)
        after = len(on)
        if after == before:
            return
        bit = 1 << self.inv.rank_of(node)
        by_claims = self.by_claims
        # a count that gains its first node or loses its last is put in or taken out of the list
        # where it goes (filling nodes one by one does so at nearly every claim: sorting the
        # counts again each time was a sort and a generator per claim); in a copy, as before a
        # new list, so that a walk part-way through the old one (`_buckets`) reads it unchanged
        first = None
        if before:
            was = by_claims[before]
            left = by_claims[before] = was ^ (was & bit)  # (`x ^ (x & b)`, not `x & ~b`: a negative int takes CPython's slow path)
            if not left:
                first = self.most_claims_first.copy()
                first.remove(before)
        if after:
            had = by_claims.get(after, 0)
            by_claims[after] = had | bit
            if not had:
                first = self.most_claims_first.copy() if first is None else first
                at = 0  # (the list is short, the largest first: a walk, not `insort` calling a key function)
                while at < len(first) and first[at] > after:
                    at += 1
                first.insert(at, after)
        if first is not None:
            self.most_claims_first = first

    def _rebuilt(self, pool: Pool, old_devices: list[DeviceRec]) -> None:
        if old_devices:
            for node in {rec.local_node for rec in (*pool.devices, *old_devices) if rec.local_node is not None}:
                self._recount(node)
        else:
            # a new pool (how a fleet loads): its devices added to their nodes' counts, not each
            # node's devices counted again (a node's GPU pool again for its NIC pool)
            new: dict[str, list[DeviceRec]] = {}
            for rec in pool.devices:
                if rec.local_node is not None:
                    new.setdefault(rec.local_node, []).append(rec)
            for node, recs in new.items():
                self._added(node, recs)
        # who holds what, again from the ledger: a device gone from its pool is never freed one by one
        for rec in old_devices:
            if (was := self.held.pop(rec.id, None)) is not None:
                self._hold(*was, -1)
        for rec in pool.devices:
            claim = self.ledger.exclusive.get(rec.key)
            if claim is not None and not rec.multi and rec.local_node is not None and rec.id not in self.held:
                self.held[rec.id] = (rec.local_node, claim)
                self._hold(rec.local_node, claim, +1)

    def _recount(self, node: str) -> None:
        """The node's free and total counts per kind and its devices in use, counted device by device."""
        inv, used = self.inv, self.ledger.used_ids
        counts: dict[DeviceKind, int] = {}
        totals: dict[DeviceKind, int] = {}
        lo = inv.local.span(node)[0]
        held = 0  # the node's devices the ledger holds, again (`used_local`)
        for i in inv.local.ids(node):
            if i in used:
                held |= 1 << (i - lo)
            rec = inv.devices[i]
            if rec is not None and not rec.multi:
                kind = rec.kind
                counts[kind] = counts.get(kind, 0) + (i not in used)  # (a set: no fleet-wide shift per device)
                totals[kind] = totals.get(kind, 0) + 1
        self.used_local[node] = (lo, held)
        for kind in set(counts) | {k for k, nodes in self.free.items() if node in nodes}:
            self.total.setdefault(kind, {})[node] = totals.get(kind, 0)
            self._set(kind, node, counts.get(kind, 0), force=True)

    def _added(self, node: str, recs: list[DeviceRec]) -> None:
        """A new pool's devices on `node` counted into the node's counts, as `_recount` would leave
        them (the counts before are those of the node's other devices)."""
        used = self.ledger.used_ids
        lo = self.inv.local.span(node)[0]
        at, held = self.used_local.get(node) or (lo, 0)
        held = held << (at - lo) if at >= lo else held >> (lo - at)  # (based at the node's lowest id, as a recount is)
        counts: dict[DeviceKind, int] = {}
        totals: dict[DeviceKind, int] = {}
        for rec in recs:
            i = rec.id
            if i in used:
                held |= 1 << (i - lo)
            if not rec.multi:
                kind = rec.kind
                counts[kind] = counts.get(kind, 0) + (i not in used)
                totals[kind] = totals.get(kind, 0) + 1
        self.used_local[node] = (lo, held)
        for kind, n in totals.items():
            total = self.total.setdefault(kind, {})
            total[node] = total.get(node, 0) + n
            self._set(kind, node, self.free.get(kind, {}).get(node, 0) + counts[kind], force=True)

    def domain_free(self, kind: DeviceKind, of: dict[str, str]) -> dict[str, int]:
        """Domain -> free devices of `kind` on its nodes, for the domains `of` (node -> domain,
        `Topology.domains`). Summed once per kind and domain map (a new map when the inventory
        changes), then kept by `_set` as devices are taken and freed: O(1) per claim."""
        if self._domain_of is not of:
            self._domain_of, self._domain_free, self._domain_order = of, {}, {}
        sums = self._domain_free.get(kind)
        if sums is None:
            sums = self._domain_free[kind] = {}
            for node, n in self.free.get(kind, {}).items():
                domain = of.get(node)
                if domain is not None:
                    sums[domain] = sums.get(domain, 0) + n
        return sums

    def domain_order(self, kind: DeviceKind, of: dict[str, str], members: dict[str, list[str]], rank: dict[str, int]) -> list[str]:
        """The domains of `members` (`Topology.domains`, with `of`), the fewest free devices of
        `kind` first (`domain_free`), then by their first node's rank. Kept until a domain's free
        count changes (`_set`) or the domain map does: sorting the racks was per claim."""
        sums = self.domain_free(kind, of)
        order = self._domain_order.get(kind)
        if order is None:
            order = self._domain_order[kind] = sorted(members, key=lambda d: (sums.get(d, 0), rank[members[d][0]]))
        return order

    def _set(self, kind: DeviceKind, node: str, new: int, *, force: bool = False) -> None:
        # (get, then set if missing: `setdefault(kind, {})` made a dict per call, on every charge)
        free = self.free.get(kind)
        if free is None:
            free = self.free[kind] = {}
        old = free.get(node, 0)
        free[node] = new
        if new != old and self._domain_of is not None:
            domain = self._domain_of.get(node)
            sums = self._domain_free.get(kind)
            if domain is not None and sums is not None:
                sums[domain] = sums.get(domain, 0) + new - old
                self._domain_order.pop(kind, None)
        if new == old and not force:
            return
        # bitsets over thousands of node ranks: flip a bit only where it changes (each
        # operation makes a new int the size of the fleet)
        bit = 1 << self.inv.rank_of(node)
        totals = self.total.get(kind)
        total = totals.get(node, 0) if totals is not None else 0
        whole = self.whole.get(kind, 0)
        if total and new == total:
            if not whole & bit:
                self.whole[kind] = whole | bit
        elif whole & bit:
            self.whole[kind] = whole ^ bit
        ge = self.ge.get(kind)
        if ge is None:
            ge = self.ge[kind] = [0]
        while len(ge) <= max(new, old):
            ge.append(0)
        if new > old:
            for k in range(old + 1, new + 1):
                ge[k] |= bit
        else:
            for k in range(new + 1, old + 1):
                ge[k] ^= ge[k] & bit  # (not `&= ~bit`: `~` makes a negative int, and `&` with one is CPython's slow path)


_HOLE_ORDERS: dict[tuple[int, int], tuple[int, ...]] = {}


def _hole_order(need: int, top: int) -> tuple[int, ...]:
    """The free counts 1..top-1 of nodes in the order a unit taking `need` devices tries them.

    Best fit (the fewest free first), except that a node the unit would leave with a useful
    hole comes before one it would leave with an awkward hole: none or a power of two left
    (1, 2, 4: the sizes claims come in, a buddy allocator's blocks) before 3, 5, 6, 7. Taking
    1 GPU of a node with 5 free leaves 4, which a 4-GPU claim can still use; taking it from a
    node with 4 free would leave 3 there and 5 on the other, which no 4-GPU claim fits twice.
    Counts below `need` last (those nodes cannot hold it unless other alternatives fit)."""
    key = (need, top)
    order = _HOLE_ORDERS.get(key)
    if order is None:
        fits = sorted(range(max(1, need), top), key=lambda k: ((k - need) & (k - need - 1) != 0, k))
        order = _HOLE_ORDERS[key] = (*fits, *range(1, min(need, top)))
    return order


_HOLE_PLACES: dict[tuple[int, int], dict[int, int]] = {}


def _hole_place(need: int, top: int) -> dict[int, int]:
    """Each free count of `_hole_order(need, top)` -> its place in that order."""
    key = (need, top)
    place = _HOLE_PLACES.get(key)
    if place is None:
        place = _HOLE_PLACES[key] = {k: i for i, k in enumerate(_hole_order(need, top))}
    return place


def _demand(plans: list[ClaimPlan]) -> Demand:
    """What the unit needs, per request: its first alternative and count (All and admin
    requests take what there is and are not scored)."""
    out: Demand = []
    for plan in plans:
        for request in plan.requests:
            alt = request.alts[0]
            if not alt.all_mode and not alt.admin:
                out.append((alt, alt.count))
    return out


def _single(plans: list[ClaimPlan]) -> Alt | None:
    """The unit's only alternative, when it is one claim of one request with one alternative
    that takes a count of devices (not All, not admin access); else None."""
    if len(plans) != 1 or len(plans[0].requests) != 1:
        return None
    alts = plans[0].requests[0].alts
    if len(alts) != 1 or alts[0].all_mode or alts[0].admin:
        return None
    return alts[0]


def _demand_key(demand: Demand) -> DemandKey:
    """What a node's level for the demand depends on besides the node: each alternative's verdict
    key, the attributes its constraints need every device to have (`_having`), and its count."""
    return tuple((alt.verdict_key, alt.constraint_attributes, count) for alt, count in demand)


def demand_of(plans: list[ClaimPlan]) -> Demand:
    return _demand(plans)


def _tightest(topo: NodeTopology, counts: list[list[dict[int, int]]], demand: Demand) -> int:
    named = topo.names[NVLINK]
    for pos in GROUP_LEVELS:
        candidates: set[int] | None = None
        for (_, need), per_level in zip(demand, counts):
            ok = {gid for gid, n in per_level[pos].items() if n >= need}
            candidates = ok if candidates is None else candidates & ok
            if not candidates:
                break
        if pos == NVLINK and candidates:
            candidates = {gid for gid in candidates if gid in named}
        if candidates:
            return pos
    return NODE
