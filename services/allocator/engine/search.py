"""The backtracking search for one allocation unit on one node.

Input: one `Slot` per chosen request alternative (claim order, then request
order), each with its candidate devices already filtered by everything that
does not depend on the other choices (selectors, node, in use, taints,
capacity policy, counter room). The search picks devices so that, together,
no exclusive device is taken twice, shared devices stay within capacity,
counters stay within their sets, and every matchAttribute /
distinctAttribute constraint holds over every device it covers.

- matchAttribute is solved by enumerating the value first (candidates are
  restricted to devices with that value), which turns the constraint into a
  filter instead of a source of backtracking. With list attributes (KEP-5491)
  a device's attribute is a set (a scalar a one-element set) and the devices
  must share one value: a device is kept for value v when its set contains v,
  so trying every value is trying every possible common element.
- distinctAttribute needs pairwise-disjoint sets: the values taken are
  counted per element, a device fits when none of its elements is counted.
- Devices of one request are chosen as combinations in candidate order,
  never as permutations; a device serves one request at most once (a shared
  device may serve several requests and claims).
- Every change to the search state is undone exactly on backtrack.
- A step budget bounds the work; running out raises `BudgetExceeded`.

The seam for placement scoring is `Slot.cands`: the search takes candidates
in that order and returns the first complete answer, so an ordering hook that
sorts candidates (or nodes) changes the preference without touching this code.
"""

from __future__ import annotations

from dataclasses import dataclass

from dralloc.allocator.engine.inventory import AttrValue, CounterKey, CounterSetKey, DeviceRec
from dralloc.allocator.engine.ledger import Ledger
from dralloc.allocator.engine.plan import Alt, Constraint


class BudgetExceeded(Exception):
    pass


@dataclass(slots=True, eq=False)
class Slot:
    claim: int  # index of the claim in the unit
    alt: Alt
    cands: list[DeviceRec]
    consumed: dict[int, dict[str, int]]  # device id -> capacity consumed (shared devices)
    distinct: list[tuple[int, Constraint]]  # (constraint id, constraint)
    chosen: list[DeviceRec]

    def __init__(self, claim: int, alt: Alt, cands: list[DeviceRec], consumed: dict[int, dict[str, int]]) -> None:
        # written out (one per request of each claim): mypyc compiles it, not the interpreted one `@dataclass` generates
        self.claim = claim
        self.alt = alt
        self.cands = cands
        self.consumed = consumed
        self.distinct = []
        self.chosen = []


class Search:
    def __init__(self, ledger: Ledger, slots: list[Slot], matches: list[tuple[Constraint, list[int]]], budget: int, rank: dict[int, int] | None = None) -> None:
        self.ledger = ledger
        self.inv = ledger.inv
        self.slots = slots
        self.matches = matches  # (constraint, indices of the slots it covers)
        self.budget = budget
        self.rank = rank  # device id -> preference (placement.py): the order matchAttribute values are tried in
        self.steps = 0
        self.busy: dict[int, list[int]] = {}  # device id -> claims holding it exclusively in this unit
        self.charged: dict[int, int] = {}  # device id -> non-admin takes in this unit (exclusive or shared)
        self.holders: dict[int, list[tuple[int, bool]]] = {}  # device id -> (claim, admin access) that took it in this unit
        self.counters: dict[CounterKey, int] = {}
        self.cap: dict[int, dict[str, int]] = {}
        self.distinct: dict[int, dict[object, int]] = {}

    # --- entry ---------------------------------------------------------------------------

    def run(self) -> bool:
        # pigeonhole: a distinctAttribute needs as many values as the devices it covers
        wanted: dict[int, tuple[Constraint, int, set[AttrValue]]] = {}
        for slot in self.slots:
            for cid, constraint in slot.distinct:
                _, need, values = wanted.setdefault(cid, (constraint, 0, set()))
                # disjoint non-empty sets: N devices need N distinct elements at least
                values.update(v for rec in slot.cands for v in rec.values(constraint.attribute) or ())
                wanted[cid] = (constraint, need + (len(slot.cands) if slot.alt.all_mode else slot.alt.count), values)
        if any(len(values) < need for _, need, values in wanted.values()):
            return False
        if not self._counters_can_fit():
            return False
        return self._match(0, [s.cands for s in self.slots])

    def _counters_can_fit(self) -> bool:
        """A lower bound: the unit needs N devices, so each counter must have room for
        the N smallest amounts its candidates consume (shared or already active
        devices count as free, which keeps the bound safe).

        Per counter the candidates are one list of costs: the explicit ones (devices
        not yet active that consume it) and zeros (shared picks, active devices, devices
        that do not consume it); one pass over the candidates gathers them all."""
        if not any(rec.consume_totals for slot in self.slots for rec in slot.cands):
            return True  # the usual unit (whole GPUs without partitions): no counter to bound
        union: dict[int, DeviceRec] = {}
        free_picks = 0  # a shared device can serve every request it is a candidate for, for nothing extra
        need = 0
        for slot in self.slots:
            if slot.alt.admin:
                continue
            need += len(slot.cands) if slot.alt.all_mode else slot.alt.count
            for rec in slot.cands:
                if rec.multi:
                    free_picks += 1
                else:
                    union[rec.id] = rec
        costs: dict[CounterKey, list[int]] = {}  # counter -> explicit costs
        holds: dict[CounterKey, int] = {}  # counter -> what it holds (its pool's, read once)
        ledger = self.ledger
        for rec in union.values():
            if not rec.consume_totals:
                continue
            active = ledger.active(rec)  # (a method call, not a bound method held: native to native)
            for key, amount in rec.consume_totals:
                explicit = costs.get(key)
                if explicit is None:
                    explicit = costs[key] = []
                    holds[key] = self.inv.pool_of(rec).counters.get(key, 0)
                if not active:
                    explicit.append(amount)
        if not costs:
            return True
        entries = free_picks + len(union)
        counter_used = self.ledger.counter_used
        for key, explicit in costs.items():
            explicit.sort()
            zeros = entries - len(explicit)
            # the `need` smallest of explicit + [0] * zeros: negatives, then zeros, then the rest
            negatives = 0
            while negatives < len(explicit) and explicit[negatives] < 0:
                negatives += 1
            take = min(negatives, need)
            total = sum(explicit[:take])
            rest = need - take - min(zeros, need - take)
            if rest > 0:
                total += sum(explicit[negatives : negatives + rest])
            if total > holds[key] - counter_used.get(key, 0):
                return False
        return True

    def _tick(self) -> None:
        self.steps += 1
        if self.steps > self.budget:
            raise BudgetExceeded

    def _match(self, k: int, cands: list[list[DeviceRec]]) -> bool:
        if k == len(self.matches):
            for slot, c in zip(self.slots, cands):
                slot.cands = c
            return self._slot(0)
        constraint, covered = self.matches[k]
        attr = constraint.attribute
        forced: set[AttrValue] | None = None  # an All request takes every candidate: the common value is among their shared elements
        for i in covered:
            if self.slots[i].alt.all_mode:
                for rec in cands[i]:
                    values = rec.values(attr)
                    if values is None:
                        return False
                    forced = set(values) if forced is None else forced & set(values)
                if not forced:
                    return False
        seen: dict[AttrValue, None] = {}
        rank = self.rank
        merged = sorted((rec for i in covered for rec in cands[i]), key=(lambda r: (rank.get(r.id, len(rank)), r.order)) if rank else (lambda r: r.order))
        for rec in merged:
            for v in elements(rec, attr):
                if forced is None or v in forced:
                    seen.setdefault(v, None)
        order = list(seen)
        saved = list(cands)
        # each covered slot's candidates grouped by value in one pass (candidate order kept in
        # each group): a device is kept for value v when its elements contain v
        groups: dict[int, dict[AttrValue, list[DeviceRec]]] = {}
        for i in covered:
            by_value: dict[AttrValue, list[DeviceRec]] = {}
            for rec in saved[i]:
                for v in elements(rec, attr):
                    by_value.setdefault(v, []).append(rec)
            groups[i] = by_value
        for value in order:
            self._tick()
            ok = True
            for i in covered:
                kept = groups[i].get(value, [])
                slot = self.slots[i]
                if not slot.alt.all_mode and not _enough(kept, slot.alt.count):
                    ok = False
                    break
                cands[i] = kept
            if ok and self._match(k + 1, cands):
                return True
            cands[:] = saved
        return False

    # --- devices ---------------------------------------------------------------------------

    def _slot(self, i: int) -> bool:
        if i == len(self.slots):
            return True
        slot = self.slots[i]
        if slot.alt.all_mode:
            taken: list[DeviceRec] = []
            for rec in slot.cands:
                self._tick()
                if not self._can_take(slot, rec):
                    break
                self._take(slot, rec)
                taken.append(rec)
            else:
                if self._slot(i + 1):
                    return True
            for rec in reversed(taken):
                self._undo(slot, rec)
            return False
        return self._choose(i, slot, slot.alt.count, 0)

    def _choose(self, i: int, slot: Slot, need: int, start: int) -> bool:
        if need == 0:
            return self._slot(i + 1)
        cands = slot.cands
        n = len(cands)
        # a device serves one request once, even a shared one (as Kubernetes does);
        # other requests, and other claims, may take more shares of it
        for j in range(start, n - need + 1):
            rec = cands[j]
            self._tick()
            if not self._can_take(slot, rec):
                continue
            self._take(slot, rec)
            if self._choose(i, slot, need - 1, j + 1):
                return True
            self._undo(slot, rec)
        return False

    def _active(self, rec: DeviceRec) -> bool:
        """Whether the device already consumes its counters (in the ledger or in this unit)."""
        return self.charged.get(rec.id, 0) > 0 or self.ledger.active(rec)

    def _can_take(self, slot: Slot, rec: DeviceRec) -> bool:
        rid = rec.id
        admin = slot.alt.admin
        for claim, by_admin in self.holders.get(rid, ()):
            if claim == slot.claim and (admin or by_admin):
                return False  # admin access: never the same device twice in one claim
        if rec.multi:
            if not admin:
                consumed = slot.consumed.get(rid)
                if consumed is None:
                    return False
                total = self.ledger.cap_used.get(rid, {})
                unit = self.cap.get(rid, {})
                caps = rec.capacity
                for name, amount in consumed.items():
                    if total.get(name, 0) + unit.get(name, 0) + amount > caps[name].value:
                        return False
        elif self.busy.get(rid) and not admin:
            return False
        if rec.consumes and not admin and not self._active(rec):
            pool = self.inv.pool_of(rec)
            used = self.ledger.counter_used
            for key, amount in rec.consumes:
                if used.get(key, 0) + self.counters.get(key, 0) + amount > pool.counters.get(key, 0):
                    return False
        for cid, constraint in slot.distinct:
            seen = self.distinct.get(cid)
            if seen and any(v in seen for v in elements(rec, constraint.attribute)):
                return False
        return True

    def _take(self, slot: Slot, rec: DeviceRec) -> None:
        rid = rec.id
        self.holders.setdefault(rid, []).append((slot.claim, slot.alt.admin))
        if not slot.alt.admin:
            # admin access consumes nothing: no counters, no capacity (it only watches the device)
            if rec.consumes and not self._active(rec):
                for key, amount in rec.consumes:
                    self.counters[key] = self.counters.get(key, 0) + amount
            self.charged[rid] = self.charged.get(rid, 0) + 1
            if rec.multi:
                unit = self.cap.setdefault(rid, {})
                for name, amount in slot.consumed[rid].items():
                    unit[name] = unit.get(name, 0) + amount
        if not rec.multi:
            # Kubernetes: a device taken in this unit, even for admin access, is busy for the unit's other claims
            self.busy.setdefault(rid, []).append(slot.claim)
        for cid, constraint in slot.distinct:
            seen = self.distinct.setdefault(cid, {})
            for value in elements(rec, constraint.attribute):
                seen[value] = seen.get(value, 0) + 1
        slot.chosen.append(rec)

    def _undo(self, slot: Slot, rec: DeviceRec) -> None:
        rid = rec.id
        slot.chosen.pop()
        holders = self.holders[rid]
        holders.pop()
        if not holders:
            del self.holders[rid]
        for cid, constraint in slot.distinct:
            seen = self.distinct[cid]
            for value in elements(rec, constraint.attribute):
                seen[value] -= 1
                if not seen[value]:
                    del seen[value]
        if not rec.multi:
            busy = self.busy[rid]
            busy.pop()
            if not busy:
                del self.busy[rid]
        if not slot.alt.admin:
            if rec.multi:
                unit = self.cap[rid]
                for name, amount in slot.consumed[rid].items():
                    unit[name] -= amount
            left = self.charged[rid] - 1
            if left:
                self.charged[rid] = left
            else:
                del self.charged[rid]
            if rec.consumes and not self._active(rec):
                for key, amount in rec.consumes:
                    left = self.counters[key] - amount
                    if left:
                        self.counters[key] = left
                    else:
                        del self.counters[key]


LIST_KINDS = frozenset(("strings", "ints", "bools", "versions"))


def elements(rec: DeviceRec, attr: str) -> tuple[AttrValue, ...]:
    """The typed values a device's attribute holds: one for a scalar (without the cached set
    lookup: scalars are the common case), a list's distinct entries, none when it lacks it."""
    a = rec.attribute(attr)
    if a is None:
        return ()
    return rec.values(attr) if a[0] in LIST_KINDS else (a,)  # type: ignore[return-value]  # values is None only when the attribute is absent: `a` says it is present


def independent(cands: list[DeviceRec], *, shared: bool = False) -> bool:
    """Whether any of a request's `cands` (the filters' candidates: each had counter room beside the
    ledger alone) can be taken with any others of them as far as the search checks: none is shared
    (their capacity adds up; `shared`: allowed, the caller's concern), and each that consumes
    counters draws on one counter set no other candidate draws on (what one takes leaves every
    other's room as it was: the search's counter bound holds and no take fails on counters)."""
    sets: set[CounterSetKey] = set()
    for rec in cands:
        if rec.multi and not shared:
            return False
        if rec.consumes:
            counter_set = rec.counter_set
            if counter_set is None or counter_set in sets:
                return False
            sets.add(counter_set)
    return True


def _enough(cands: list[DeviceRec], count: int) -> bool:
    return len(cands) >= count
