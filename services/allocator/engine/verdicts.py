"""Selector verdicts per device, cached until the device's slice changes.

A verdict is keyed by (class name, class version, request selectors): the
class selectors run first, in order, then the request's, stopping at the first
`false` as Kubernetes does. Each key keeps three bitsets over device ids:
evaluated, matched, failed (a CEL runtime error), so a device is evaluated at
most once per key. Device ids change when a slice changes, so a changed
device is simply a new, unevaluated id.

The CEL runtime-error rule (dralloc's, documented in `dralloc explain
--help`): a selector that fails at run time on any device the request could
otherwise take on a node (reachable from it, in a usable pool, not held
exclusively by another claim unless the request has admin access or asks for
All) makes that node unusable for the claim. With a given node (`--node`, the
scheduler's view) the claim is an `error`; when the engine picks the node it
uses one without failures and reports the error only if no node fits. Either
way the verdict does not depend on the order the search visits devices in.
Upstream Kubernetes reports such an error only if its search happens to reach
that device.

Budget: each evaluation of a selector on a device is charged the selector's
estimated cost (cel-go's units; the bound of what that evaluation may cost).
The engine gives each allocation unit a budget (`begin`); when a unit's
evaluations have spent it, `SelectorBudgetExceeded` ends the unit (an `error`
outcome). A unit may also be given seconds of evaluation on a clock (the
allocator's time budget, `DRALLOC_CEL_BUDGET_SECONDS`): the reference
interpreter is ~20x slower per cost unit than the fast core, so units alone do
not bound the time; when they are spent the unit ends the same way, looked at
between devices and inside the interpreter. Verdicts already known cost nothing. Selectors of other recent keys
are evaluated along (on environments built anyway) only when they are cheap
(`ALONG_MAX_COST`), on no unit's account: no claim pays for another's selector.

Shared verdicts: a selector whose device reads are listed statically
(`projection.fields_of`) gives the same outcome on every device with the same
values of those fields (`projector.project`). Each key remembers, per
selector, projection -> outcome (match, no match, or the runtime error's reason,
re-rendered to name each device); a device whose projection is known takes that
outcome without a CEL environment, and it costs nothing: a reused outcome is a
verdict already known. Devices Kubernetes cannot represent, and selectors with
no projection, are evaluated on each device. A walk over many nodes (the first
claim of a class, placement's `_settled`) takes each node whose devices all
have known shared outcomes from them (`outcomes`) and adds what it passed to the
verdict in one step (`record`): the same bits a `get` per node would set, with no
evaluation or charge either way.

Class reach (`warm`, `class_reach`): at idle, each class's own selectors are evaluated on every
live device into an entry of their own (on no unit's account, outside the verdicts: no verdict,
charge or shared outcome a claim reads is touched), and the node ranks where the class matches or
fails on a device are kept for the inventory version they were worked out for. A node outside
them has no device any request of the class matches or fails on, so the engine leaves it out of
a walk as it does a node its own walks learned the same of (engine.py `_candidate_nodes`): the
first claim of a new selector of a class that lives on a few nodes (MIG slices) no longer walks
every node of the fleet to learn that.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import islice
from typing import Any

from dralloc.allocator.engine import cel, projection
from dralloc.allocator.engine.cel_eval import OutOfTime
from dralloc.allocator.engine.inventory import DeviceRec, Inventory, bits_of, iter_bits
from dralloc.allocator.engine.plan import Alt, VerdictKey, verdict_key
from dralloc.allocator.engine.projector import Field, Projector

MAX_KEYS = 4096

MAX_SHARED = 1024
"""Projections remembered per (key, selector): a selector that reads a field unique to each device
(a uuid) shares nothing, and its memory stays bounded (fleets have a few dozen device shapes)."""

Outcome = bool | str | tuple[str, str]
"""A shared verdict: matched or not, or a runtime error's reason: as is (it names no device), or
(head, tail) around the ` (device driver/name)` it names."""

ALONG_MAX_COST = 1_000
"""A recent key's selectors are evaluated along on new environments only up to this estimated cost
(together, per device), charged to no unit's budget."""


class SelectorBudgetExceeded(Exception):
    """The allocation unit's selector evaluations spent its budget; ``str(e)`` says which selector."""


class Interrupted(Exception):
    """`Verdicts.interrupt` was called (the process stops): the evaluation was abandoned part way."""


@dataclass(slots=True)
class Verdict:
    evaluated: int = 0
    matched: int = 0
    failed: int = 0
    errors: dict[int, str] = field(default_factory=dict)  # device id -> "selector #i on device ...: ..."
    # shared verdicts: per selector expression, a device's projection -> what the selector gave
    shared: dict[str, dict[tuple[object, ...], Outcome]] = field(default_factory=dict)
    # node prefilter, valid for one inventory version: per `Alt.learn_key` (required attributes,
    # match attributes, group size), [node ranks evaluated, node ranks with a usable match or a failure]
    node_version: int = -1
    node_info: dict[tuple[Any, ...], list[int]] = field(default_factory=dict)

    def nodes(self, version: int, attributes: tuple[Any, ...]) -> list[int]:
        if self.node_version != version:
            self.node_version = version
            self.node_info = {}
        info = self.node_info.get(attributes)
        if info is None:
            info = self.node_info[attributes] = [0, 0]
        return info


@dataclass(slots=True)
class _Reach:
    """A class's own selectors on every live device (`Verdicts.warm`), and the node ranks where they
    match or fail on one: for `version` of the inventory (-1: not worked out for any yet)."""

    entry: Verdict = field(default_factory=Verdict)
    version: int = -1
    ranks: int = 0
    """The ranks of the nodes of the `walked` devices (-1: one is not a node's own): the answer
    once `version` is the inventory's, a walk's progress while it is not. It may still name a node
    whose devices of the class are gone since, a rank a walk tries for nothing, until
    `_reach_ranks` starts over."""
    walked: int = 0
    """The device ids whose node is in `ranks` (kept across inventory changes: ids are never
    reused, so after a change only the devices added need walking)."""
    walking: tuple[int, Iterator[int], int] | None = None
    """The walk in progress across `warm`'s hops: (for which inventory version, the device ids
    left, all of them as a bitset)."""


WARM_STEP = 256
"""Devices `Verdicts.warm` looks at between reads of the clock (~1 ms of work)."""

RECENT_KEYS = 16
"""When a device is evaluated, the most recently used selector sets are evaluated
on it too, so its CEL environment is built once and dropped right after
(environments are large; the verdicts are what is kept)."""


@dataclass(slots=True, frozen=True)
class _Spec:
    key: VerdictKey
    class_key: VerdictKey
    class_name: str
    class_exprs: tuple[str, ...]
    exprs: tuple[str, ...]
    cheap: bool  # every selector's estimated cost together is at most ALONG_MAX_COST


_MemoPlan = list[tuple[str | None, Projector | None, dict[tuple[object, ...], Outcome] | None]]
"""Per selector: the driver of a leading `device.driver == "x"` test, or its projector and shared
outcomes (`Verdicts._memo_plan`)."""


class Verdicts:
    def __init__(self, inventory: Inventory) -> None:
        self.inv = inventory
        self._cache: OrderedDict[VerdictKey, Verdict] = OrderedDict()
        self._recent: OrderedDict[VerdictKey, _Spec] = OrderedDict()
        self._envs: dict[int, cel.DeviceEnv] = {}
        self.budget: int | None = None
        """Cost units the current allocation unit may still spend on evaluations (None: no limit)."""
        self.timer: tuple[Callable[[], float], float] | None = None
        """(clock, seconds) the current unit may still spend evaluating (None: no limit)."""
        self.interrupted = False
        self._reach: dict[VerdictKey, _Reach] = {}
        """Per class key (of the classes known now): what `warm` worked out of it (`class_reach`)."""
        self._projectors: dict[tuple[Field, ...], Projector] = {}
        self.shared_outcomes = 0
        """Shared outcomes remembered so far (it grows with each: `outcomes` may know more since)."""

    def warm(self, seconds: float) -> bool:
        """Idle work for about `seconds` (wall clock): each class's reach (`class_reach`); True while
        some is left. Only which nodes a walk leaves out that could not host it anyway changes: no
        verdict or budget charge a claim reads is made here, so it may run whenever the engine is idle."""
        return self._warm_reach(time.perf_counter() + seconds)

    def class_reach(self, alt: Alt) -> int:
        """The node ranks where `alt`'s class matches or fails on a device, as `warm` worked them out
        for the inventory as it is now; -1 (every node) when it has not (yet, or since a change)."""
        reach = self._reach.get(alt.class_key)
        return reach.ranks if reach is not None and reach.version == self.inv.version else -1

    def _warm_reach(self, end: float) -> bool:
        """`warm`'s second part, until `end` (`time.perf_counter`): each class's selectors on the live
        devices not evaluated for its reach yet, in steps of `WARM_STEP` devices, then its node ranks;
        True while some is left. Reaches of classes changed or gone are dropped."""
        inv = self.inv
        keys = {verdict_key(name, inv.class_versions.get(name, 0), ()): (name, cls) for name, cls in inv.classes.items()}
        for key in [key for key in self._reach if key not in keys]:
            del self._reach[key]
        for key, (name, cls) in keys.items():
            reach = self._reach.setdefault(key, _Reach())
            if reach.version == inv.version:
                continue
            todo = inv.live ^ (inv.live & reach.entry.evaluated)
            if todo:
                exprs = tuple(s.cel.expression if s.cel else "" for s in cls.spec.selectors)
                # lazily: a list of the ids left, made in every hop, was more than a hop at 250,000
                # GPUs (warm to done on the frontier fleet: 53 s of CPU in 2,530 hops; 7.5 s in 356)
                ids = iter_bits(todo)
                budget, timer, self.budget, self.timer = self.budget, self.timer, None, None  # on no unit's account
                try:
                    while step := list(islice(ids, WARM_STEP)):
                        self._evaluate(reach.entry, bits_of(step), exprs, f"class {name}: ", fresh=True)
                        if time.perf_counter() >= end and len(step) == WARM_STEP:
                            return True  # (perhaps none left: the next call says so at once)
                finally:
                    self.budget, self.timer = budget, timer
                    self._envs.clear()  # (built for these alone: no claim's key is evaluated along)
            if not self._reach_ranks(reach, end) or time.perf_counter() >= end:
                return True  # (perhaps none left: the next call says so at once)
        return False

    def _reach_ranks(self, reach: _Reach, end: float) -> bool:
        """Work out the ranks of the nodes of the live devices `reach` matches or fails on (-1, every
        node, if one of them is not a node's own: a network-attached device) until `end`
        (`time.perf_counter`, looked at every `WARM_STEP` devices); True once they are
        `reach.ranks` for the inventory as it is.

        Only the devices not walked before are walked: while slices arrive one by one, each hop
        after each of them walked the whole fleet again (an allocator following `bench pipeline`'s
        fleet of 3,145 nodes onto the bus spent ~27 s of CPU so, and a claim then waited a hop).
        Ranks of devices removed since stay in `ranks` (a walk then tries a node for nothing,
        never leaves one out); once they are half of those walked it starts over."""
        inv = self.inv
        if reach.walking is None or reach.walking[0] != inv.version:
            walked = reach.walked
            gone = walked ^ (walked & inv.live)
            if (gone and gone.bit_count() * 2 > walked.bit_count()) or (reach.ranks == -1 and not inv.nonlocal_bits):
                reach.walked = reach.ranks = 0
            seen = (reach.entry.matched | reach.entry.failed) & inv.live
            todo = seen ^ (seen & reach.walked)
            reach.walking = (inv.version, iter_bits(todo), todo)
        version, ids, todo = reach.walking
        devices, node_rank = inv.devices, inv.node_rank
        ranks = reach.ranks
        done = True
        if ranks != -1:
            for n, i in enumerate(ids, start=1):
                rec = devices[i]
                rank = node_rank.get(rec.local_node) if rec is not None and rec.local_node is not None else None
                if rank is None:
                    ranks = -1
                    break
                ranks |= 1 << rank
                if not n % WARM_STEP and time.perf_counter() >= end:
                    reach.walked |= todo & ((2 << i) - 1)  # (ids come lowest first)
                    done = False
                    break
        reach.ranks = ranks
        if not done:
            return False
        reach.walked |= todo
        reach.walking, reach.version = None, version
        return True

    def begin(self, budget: int | None, timer: tuple[Callable[[], float], float] | None = None) -> None:
        """A new allocation unit: it may spend `budget` cost units and `timer` (clock, seconds) on
        evaluations (None: no limit)."""
        self.budget = budget
        self.timer = timer

    def interrupt(self) -> None:
        """Abandon evaluations from now on (`Interrupted`); safe to call from another thread."""
        self.interrupted = True

    def get(self, alt: Alt, mask: int, low: int = 0) -> Verdict:
        """The verdict for `alt`, evaluated at least on the devices in `mask`. `low`: no device of
        `mask` has a lower id (a node's first, when its mask holds its own devices alone): the ids to
        evaluate are then read from `todo >> low`, a few words, not found from bit 0 of a
        fleet-wide int (that walk was ~5 us per node evaluated at 80,000 GPUs)."""
        spec = self._spec(alt)
        full = self._entry(alt.verdict_key)
        seen = mask & full.evaluated
        if seen == mask:
            # the usual case, and the cheap test: bitsets span the fleet, and `~evaluated`
            # would make a new fleet-sized int on every call
            return full
        todo = (mask ^ seen) & self.inv.live
        if todo:
            try:
                self._ensure(spec, todo, fresh=True, low=low)
                if self._envs:
                    built = bits_of(list(self._envs))
                    low = min(self._envs)
                    budget, timer, self.budget, self.timer = self.budget, self.timer, None, None  # along: on no unit's account
                    try:
                        for other in list(self._recent.values()):
                            if other is not spec and other.cheap:
                                self._ensure(other, built, low=low)
                    finally:
                        self.budget, self.timer = budget, timer
            finally:
                self._envs.clear()
        return full

    def _spec(self, alt: Alt) -> _Spec:
        """`alt`'s selector set, now the most recently used (`RECENT_KEYS`)."""
        spec = self._recent.get(alt.verdict_key)
        if spec is None:
            class_exprs = tuple(s.cel.expression if s.cel else "" for s in alt.cls.spec.selectors)
            spec = _Spec(
                key=alt.verdict_key,
                class_key=alt.class_key,
                class_name=alt.cls.metadata.name,
                class_exprs=class_exprs,
                exprs=alt.selectors,
                cheap=_estimate(class_exprs + alt.selectors) <= ALONG_MAX_COST,
            )
            self._recent[alt.verdict_key] = spec
            if len(self._recent) > RECENT_KEYS:
                self._recent.popitem(last=False)
        else:
            self._recent.move_to_end(alt.verdict_key)
        return spec

    def outcomes(self, alt: Alt, nodes: list[tuple[int, int]]) -> list[tuple[int, int, int] | None]:
        """Per node of `nodes` ((lo, its device ids as a bitset shifted by lo)): (its devices not
        evaluated for the verdict yet, those of them the class selectors match, the node's devices
        the verdict matches), shifted by lo, when each device's outcome is known: evaluated already (for the verdict, or for the class and then the request's
        selectors) or a shared outcome known (a match or none), with no runtime error, so `get`
        would evaluate nothing and charge nothing on the node; None for a node that needs `get`.
        Changes no verdict: `record` adds what a walk passes (a first walk of a selector over the
        fleet: one `get` per node was a few bitset operations as wide as the fleet each, and a
        projection of each device)."""
        out: list[tuple[int, int, int] | None] = [None] * len(nodes)
        if self.interrupted:
            return out
        # (an entry not made yet knows nothing: a driver test may still decide, `record` makes it)
        full, cls = self._cache.get(alt.verdict_key) or Verdict(), self._cache.get(alt.class_key) or Verdict()
        class_plan = self._memo_plan(cls, tuple(s.cel.expression if s.cel else "" for s in alt.cls.spec.selectors))
        request_plan = self._memo_plan(full, alt.selectors)
        if class_plan is None or request_plan is None:
            return out
        base = min(lo for lo, _ in nodes)
        batch = 0
        for lo, bits in nodes:
            batch |= bits << (lo - base)
        # what is known of these devices already, cut down to them and shifted by `base` (the
        # walk's nodes come roughly in id order: a few words; a few operations as wide as the
        # fleet for the batch, not per node)
        known: list[tuple[int, int]] = []
        for entry in (cls, full):
            evaluated = (entry.evaluated >> base) & batch
            if evaluated and (entry.failed >> base) & batch:
                return out  # (a runtime error: `get` copies and renders it)
            known.append((evaluated, (entry.matched >> base) & evaluated if evaluated else 0))
        devices = self.inv.devices
        for n, (lo, bits) in enumerate(nodes):
            at = lo - base
            todo = bits & ~(known[1][0] >> at)  # what `get` evaluates: the devices not evaluated for the verdict
            evaluated, was = (known[0][0] >> at) & todo, (known[0][1] >> at) & todo
            passed = self._known_matches(devices, lo, todo ^ evaluated, class_plan)
            if passed is None:
                continue
            passed |= was
            matched = self._known_matches(devices, lo, passed, request_plan)
            if matched is not None:
                out[n] = (todo, passed, matched | ((known[1][1] >> at) & bits))
        return out

    def record(self, alt: Alt, passed: list[tuple[int, int, int, int]]) -> None:
        """Add to `alt`'s verdict and its class's what `outcomes` gave for the nodes a walk passed,
        in its order: (lo, the devices not evaluated for the verdict before, those the class
        matches, those the verdict matches; bitsets shifted by lo), as a `get` on each in turn
        would have (the entries' recency too)."""
        if not passed:
            return
        self._spec(alt)
        evaluated, class_matched, matched = (_fleet([(lo, parts[k]) for lo, *parts in passed]) for k in range(3))
        if not evaluated:
            self._entry(alt.verdict_key)  # (a `get` of devices known already touches the verdict alone)
            return
        if passed[-1][1]:
            full, cls = self._entry(alt.verdict_key), self._entry(alt.class_key)
        else:  # the last node was known already: its `get` touched the verdict after the class
            cls, full = self._entry(alt.class_key), self._entry(alt.verdict_key)
        cls.evaluated |= evaluated
        full.evaluated |= evaluated
        if class_matched:
            cls.matched |= class_matched
        if matched:
            full.matched |= matched

    def _memo_plan(self, entry: Verdict, exprs: tuple[str, ...]) -> _MemoPlan | None:
        """How `_evaluate` would decide `exprs` on devices from shared outcomes alone: per selector,
        the driver of a `device.driver == "x"` test or its projector and outcomes; None when one has
        no projection (each device is then evaluated)."""
        plan: _MemoPlan = []
        literal = True
        for e in exprs:
            try:
                driver = cel.compile_selector(e).driver if literal else None
                shape = projection.fields_of(e)
            except cel.CelCompileError:
                return None  # (`get` reports it)
            if driver is not None:
                plan.append((driver, None, None))
                continue
            literal = False  # (as `_evaluate`: only the leading ones)
            if shape is None:
                return None
            plan.append((None, self._projector(shape), entry.shared.get(e, {})))
        return plan

    def _known_matches(self, devices: list[DeviceRec | None], lo: int, todo: int, plan: _MemoPlan) -> int | None:
        """The devices of `todo` (ids shifted by `lo`) every selector of `plan` (`_memo_plan`)
        matches, shifted by `lo`, each decided by a test of the driver or a shared outcome already
        known; None when one is not known (or is a runtime error)."""
        if not plan or not todo:
            return todo
        matched = 0
        for j in iter_bits(todo):
            i = lo + j
            rec = devices[i]
            if rec is None:
                return None  # (a node's ids name live devices: `get` if one did not)
            for driver, projector, memo in plan:
                if driver is not None:
                    if rec.driver != driver:
                        break
                    continue
                if not rec.representable:
                    return None
                outcome = memo.get(projector.project(rec.driver, rec.spec))  # type: ignore[union-attr]  # set together with projector
                if outcome is True:
                    continue
                if outcome is False:
                    break
                return None  # not known yet, or a runtime error (it names each device: `get` renders it)
            else:
                matched |= 1 << j
        return matched

    def known(self, alt: Alt) -> Verdict | None:
        """What is known of `alt`'s verdict so far, evaluating nothing (None: nothing yet)."""
        return self._cache.get(alt.verdict_key)

    def _ensure(self, spec: _Spec, todo: int, *, fresh: bool = False, low: int = 0) -> None:
        """Evaluate the key's selectors on the devices of `todo` not evaluated yet for it
        (`fresh`: the caller knows none of them is; `low`: none has a lower id)."""
        full = self._entry(spec.key)
        if not fresh:
            todo ^= todo & full.evaluated  # (not `&= ~evaluated`: `~` makes a fleet-sized int)
        if not todo:
            return
        cls = self._entry(spec.class_key)
        self._evaluate(cls, todo, spec.class_exprs, f"class {spec.class_name}: ", low=low)
        # each `|=` on these makes a new fleet-sized int (~30 us at 2,000,000 device ids, per
        # node evaluated): none where nothing is added
        passed = todo & cls.matched
        failed = todo & cls.failed if cls.failed else 0
        if failed:
            full.failed |= failed
            for i in iter_bits(failed):
                full.errors[i] = cls.errors[i]
        if spec.exprs:
            if passed:
                self._evaluate(full, passed, spec.exprs, "", fresh=True, low=low)  # (passed is part of todo)
        elif passed:
            full.matched |= passed
        full.evaluated |= todo

    def class_only(self, alt: Alt, mask: int) -> Verdict:
        """The verdict of the class selectors alone (for `explain`)."""
        self.get(alt, mask)
        entry = self._entry(alt.class_key)
        try:
            self._evaluate(
                entry, mask & self.inv.live, tuple(s.cel.expression if s.cel else "" for s in alt.cls.spec.selectors), f"class {alt.cls.metadata.name}: "
            )
        finally:
            self._envs.clear()
        return entry

    def _entry(self, key: VerdictKey) -> Verdict:
        entry = self._cache.get(key)
        if entry is None:
            entry = self._cache[key] = Verdict()
            if len(self._cache) > MAX_KEYS:
                self._cache.popitem(last=False)
        else:
            self._cache.move_to_end(key)
        return entry

    def _projector(self, shape: tuple[Field, ...]) -> Projector:
        """The `projector.Projector` of a selector's fields (one per field list, kept while the
        engine lives: a fleet's selectors read a few dozen lists)."""
        projector = self._projectors.get(shape)
        if projector is None:
            if len(self._projectors) >= MAX_KEYS:  # (hostile claims may name many)
                self._projectors.clear()
            projector = self._projectors[shape] = Projector(shape)
        return projector

    def _evaluate(self, entry: Verdict, todo: int, exprs: tuple[str, ...], owner: str, *, fresh: bool = False, low: int = 0) -> None:
        """Evaluate `exprs` on the devices in `todo` not yet evaluated for `entry` (`fresh`: the
        caller knows none is; each test of what is is two fleet-sized int operations; `low`: no
        device of `todo` has a lower id)."""
        if not fresh:
            todo ^= todo & entry.evaluated
        if not todo:
            return
        devices = self.inv.devices
        offset = 0
        # the ids once: `bit_count` and each walk of a bitset as wide as the fleet cost per call (a
        # node's devices sit high in it: ~100 us a `bit_count` at 250,000 GPUs, per node evaluated)
        ids = [low + i for i in iter_bits(todo >> low)] if low else list(iter_bits(todo))
        compiled = [cel.compile_selector(e) for e in exprs]
        while compiled and (driver := compiled[0].driver) is not None:
            # `device.driver == "x"`, the usual class selector: no CEL environment needed
            keep = [i for i in ids if devices[i].driver == driver]  # type: ignore[union-attr]  # ids from a live bitset name live devices (None marks only a removed id)
            exprs, compiled = exprs[1:], compiled[1:]
            offset += 1
            kept = todo if len(keep) == len(ids) else bits_of(keep)  # (usually every device: no new bitset)
            if not exprs:
                entry.evaluated |= todo
                entry.matched |= kept
                return
            entry.evaluated |= todo ^ kept
            todo, ids = kept, keep
        projectors = [None if (shape := projection.fields_of(e)) is None else self._projector(shape) for e in exprs]
        memos = [None if projector is None else entry.shared.setdefault(e, {}) for e, projector in zip(exprs, projectors)]
        envs = self._envs
        matched: list[int] = []
        failed: list[int] = []
        done: list[int] = []
        timer = self.timer
        deadline: cel.Deadline | None = None
        if timer is not None:
            began = timer[0]()
            deadline = (timer[0], began + timer[1])
        try:
            for i in ids:
                if self.interrupted:
                    raise Interrupted("selector evaluation interrupted")
                if deadline is not None and deadline[0]() > deadline[1]:
                    raise SelectorBudgetExceeded(_out_of_time(owner, len(done)))
                rec: DeviceRec = devices[i]  # type: ignore[assignment]  # ids from a live bitset name live devices (None marks only a removed id)
                env = envs.get(i)
                ok = True
                for n, selector in enumerate(compiled):
                    memo, projector, seen = memos[n], projectors[n], None
                    if memo is not None and projector is not None and rec.representable:
                        seen = projector.project(rec.driver, rec.spec)
                        outcome = memo.get(seen)
                        if outcome is not None:  # a device that looked the same had it: a verdict already known
                            if outcome is True:
                                continue
                            ok = False
                            if outcome is not False:
                                failed.append(i)
                                entry.errors[i] = f"{owner}selector #{n + offset} on device {rec.label}: CEL runtime error: {_render(outcome, rec)}"
                            break
                    if env is None:
                        env = envs[i] = cel.device_env(rec.driver, rec.spec)
                    if self.budget is not None:
                        if selector.cost > self.budget:
                            raise SelectorBudgetExceeded(
                                f"{owner}selector #{n + offset} ({_short(selector.expression)}) may cost up to "
                                f"{selector.cost:,} per device; this claim's evaluation budget has {max(0, self.budget):,} "
                                f"cost units left after {len(done)} devices here: simplify the selector "
                                "(fewer or shorter loops) or narrow it with cheap tests first"
                            )
                        self.budget -= selector.cost
                    try:
                        result = selector.matches(env, deadline=deadline)
                    except OutOfTime:
                        raise SelectorBudgetExceeded(_out_of_time(f"{owner}selector #{n + offset} ({_short(selector.expression)}): ", len(done))) from None
                    except cel.CelRuntimeError as exc:
                        failed.append(i)
                        entry.errors[i] = f"{owner}selector #{n + offset} on device {rec.label}: CEL runtime error: {exc}"
                        if seen is not None and memo is not None and len(memo) < MAX_SHARED:
                            reason = _reason(str(exc), rec)
                            if reason is not None:
                                memo[seen] = reason
                                self.shared_outcomes += 1
                        ok = False
                        break
                    if seen is not None and memo is not None and len(memo) < MAX_SHARED:
                        memo[seen] = result
                        self.shared_outcomes += 1
                    if not result:
                        ok = False
                        break
                if ok:
                    matched.append(i)
                done.append(i)
        finally:  # what was evaluated stays known, also when the budget ends the unit part way
            if timer is not None:
                self.timer = (timer[0], timer[1] - (timer[0]() - began))
            whole = len(done) == len(ids)
            entry.evaluated |= todo if whole else bits_of(done)
            if matched:
                entry.matched |= todo if whole and len(matched) == len(done) else bits_of(matched)
            if failed:
                entry.failed |= bits_of(failed)


def _fleet(parts: list[tuple[int, int]]) -> int:
    """The fleet-wide bitset of nodes' parts (lo, bits shifted by lo; no id in two), built in one
    buffer: a part's bytes copied in where no other part's ids lie between its first and last
    (a node's pools are usually handed neighbouring ids), else its bits one by one."""
    parts = sorted(part for part in parts if part[1])
    if not parts:
        return 0
    low = parts[0][0] & ~7
    ends = [lo + bits.bit_length() for lo, bits in parts]
    buf = bytearray(((max(ends) - low) >> 3) + 1)
    reach = 0  # the furthest end of the parts before
    for n, (lo, bits) in enumerate(parts):
        at = lo - low
        inside, reach = reach > lo or (n + 1 < len(parts) and ends[n] > parts[n + 1][0]), max(reach, ends[n])
        if inside:
            for i in iter_bits(bits):  # (another part's ids inside its span)
                i += at
                buf[i >> 3] |= 1 << (i & 7)
            continue
        chunk = (bits << (at & 7)).to_bytes(((bits.bit_length() + (at & 7)) >> 3) + 1, "little")
        start, end = at >> 3, (at >> 3) + len(chunk)
        buf[start] |= chunk[0]  # (the first and last bytes may hold a neighbour's bits too)
        if len(chunk) > 1:
            buf[start + 1 : end - 1] = chunk[1:-1]
            buf[end - 1] |= chunk[-1]
    return int.from_bytes(buf, "little") << low


def _reason(message: str, rec: DeviceRec) -> Outcome | None:
    """A runtime error's reason as devices that look the same share it: with the ` (device
    driver/name)` the evaluator ends it with (before its hint) cut out, or as is when it names no
    device; None (not shared) when it names the device anywhere else. (The driver may show: every
    device sharing the reason has the same one, `projector.project` keys by it.)"""
    named = f" (device {rec.driver}/{rec.spec.name})"
    at = message.rfind(named)
    if at >= 0 and message[at + len(named) :] in ("", cel._MISSING_KEY_HINT):  # what Selector.evaluate appends
        return (message[:at], message[at + len(named) :])
    if rec.spec.name in message:
        return None
    return message


def _render(reason: str | tuple[str, str], rec: DeviceRec) -> str:
    """A shared runtime error's reason naming `rec`, as evaluating on it would have."""
    if isinstance(reason, str):
        return reason
    return f"{reason[0]} (device {rec.driver}/{rec.spec.name}){reason[1]}"


def _estimate(exprs: tuple[str, ...]) -> int:
    """The selectors' estimated cost together (an expression that does not compile: unbounded)."""
    total = 0
    for expression in exprs:
        try:
            total += cel.compile_selector(expression).cost
        except cel.CelCompileError:
            return 2**63
    return total


def _out_of_time(what: str, devices: int) -> str:
    return (
        f"{what}this claim's selector evaluation ran out of its time budget after {devices} devices here: "
        "simplify the selectors (fewer or shorter loops) or narrow them with cheap tests first"
    )


def _short(expression: str, limit: int = 80) -> str:
    return expression if len(expression) <= limit else expression[: limit - 3] + "..."
