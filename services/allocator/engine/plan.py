"""A claim, checked and flattened into what the search needs.

`plan_claim` validates the claim as the API server would (limits named),
resolves device classes, compiles every CEL selector, parses capacity
requests, and turns each request into its alternatives: one for `exactly`, one
per `firstAvailable` subrequest, tried in order. Problems become a message for
an `error` outcome, never an exception.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dralloc.allocator.engine.inventory import NOT_YET, Capacity
from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import (
    AllocationMode,
    CapacityRequirements,
    DeviceClass,
    DeviceSelector,
    DeviceToleration,
    ResourceClaim,
)
from dralloc.schemas.validation import ALLOCATION_RESULTS_MAX, DNS_SUBDOMAIN, is_dns_label, validate

VerdictKey = str
"""(device class, its version, selector expressions) as one string (`verdict_key`): what a set of
selector verdicts is cached under. A string keeps its hash; a tuple is hashed again item by item at
every lookup, and placement looks a claim's key up on every node it passes."""


def verdict_key(class_name: str, version: int, exprs: tuple[str, ...]) -> VerdictKey:
    """The VerdictKey of a class at a version with selector expressions: a JSON array, so that no
    two of them make one key, whatever the names and expressions hold."""
    return msgspec.json.encode((class_name, version, exprs)).decode()


@dataclass(slots=True, eq=False)
class Alt:
    """One way to satisfy a request: the request itself or one of its subrequests."""

    result_name: str  # "req" or "req/sub", as written into the result
    base: str  # the request's name
    sub: str | None
    cls: DeviceClass
    class_version: int
    selectors: tuple[str, ...]  # the request's own CEL expressions
    all_mode: bool
    count: int
    admin: bool
    tolerations: list[DeviceToleration]
    capacity: dict[str, int] | None  # requested capacity, nano-units, by name as written
    verdict_key: VerdictKey = ""  # (class, class version, selectors): the selector-verdict cache key
    class_key: VerdictKey = ""  # (class, class version, no selectors): the class's own verdicts
    constraint_attributes: tuple[str, ...] = ()  # attributes every device of this alternative must have
    match_attributes: tuple[str, ...] = ()  # those of them a matchAttribute constraint asks to be equal
    group: int = 0
    """Devices that must share one value of each match attribute (its count, when it asks for
    several and not All): a node without such a group cannot serve it, whatever is free."""
    learn_key: tuple[Any, ...] = ()  # (constraint_attributes, match_attributes, group): the engine's per-node match memory key
    uses: dict[int, tuple[Any, str, dict[str, int] | None]] = field(default_factory=dict)
    """With capacity requests: id of a device's published capacity map -> (the map, the device's
    driver, what taking the device consumes): `consumed_capacity`'s answer, which depends on those
    two alone, for every device publishing that map (a fleet's namesakes share one, repeats.py).
    The plan's alternatives are shared by the claims of one spec (`Planner`), so this outlives a
    claim: placement asks it of every shared device of every node it passes."""


@dataclass(slots=True, eq=False)
class Request:
    name: str
    alts: list[Alt]


@dataclass(slots=True, eq=False)
class Constraint:
    attribute: str
    match: bool  # matchAttribute (True) or distinctAttribute (False)
    requests: frozenset[str]  # empty: every request of the claim

    def covers(self, alt: Alt) -> bool:
        return not self.requests or alt.base in self.requests or alt.result_name in self.requests


@dataclass(slots=True, eq=False)
class ClaimPlan:
    claim: ResourceClaim
    key: str
    requests: list[Request]
    constraints: list[Constraint]
    error: str | None
    shape: int | None  # the number of its shape (`Misfits.shape`), once asked

    def __init__(
        self,
        claim: ResourceClaim,
        key: str,
        requests: list[Request] | None = None,
        constraints: list[Constraint] | None = None,
        error: str | None = None,
        shape: int | None = None,
    ) -> None:
        # written out (one per claim): mypyc compiles it, not the interpreted one `@dataclass` generates
        self.claim = claim
        self.key = key
        self.requests = [] if requests is None else requests
        self.constraints = [] if constraints is None else constraints
        self.error = error
        self.shape = shape


def plan_claim(
    claim: ResourceClaim, classes: dict[str, DeviceClass], class_versions: dict[str, int], compile_selector: Any, compile_error: type[Exception]
) -> ClaimPlan:
    key = claim.key
    plan = ClaimPlan(claim=claim, key=key)
    problems = validate(claim)
    if problems:
        plan.error = f"claim {key}: invalid: " + "; ".join(str(p) for p in problems[:5])
        return plan
    for request in claim.spec.devices.requests:
        alts: list[Alt] = []
        # (result name, subrequest, class, selectors, mode, count, admin access, tolerations, capacity)
        bodies: list[
            tuple[str, str | None, str, list[DeviceSelector], AllocationMode | None, int | None, bool, list[DeviceToleration], CapacityRequirements | None]
        ]
        if request.exactly is not None:
            e = request.exactly
            bodies = [(request.name, None, e.device_class_name, e.selectors, e.allocation_mode, e.count, bool(e.admin_access), e.tolerations, e.capacity)]
        else:
            bodies = [
                (f"{request.name}/{s.name}", s.name, s.device_class_name, s.selectors, s.allocation_mode, s.count, False, s.tolerations, s.capacity)
                for s in request.first_available
            ]
        for result_name, sub, class_name, selectors, mode, count, admin, tolerations, capacity in bodies:
            cls = classes.get(class_name)
            if cls is None:
                plan.error = f"claim {key}, request {result_name}: device class {class_name!r} not found"
                return plan
            for i, sel in enumerate(cls.spec.selectors):
                error = _compile(sel.cel.expression if sel.cel else "", compile_selector, compile_error)
                if error:
                    plan.error = f"class {class_name}: selector #{i}: {error}"
                    return plan
            exprs = tuple(s.cel.expression for s in selectors if s.cel is not None)
            for i, expr in enumerate(exprs):
                error = _compile(expr, compile_selector, compile_error)
                if error:
                    plan.error = f"claim {key}, request {result_name}: selector #{i}: {error}"
                    return plan
            wanted: dict[str, int] | None = None
            if capacity is not None and capacity.requests:
                try:
                    wanted = {name: parse_quantity(v) for name, v in capacity.requests.items()}
                except ValueError as exc:
                    plan.error = f"claim {key}, request {result_name}: capacity: {exc}"
                    return plan
            version = class_versions.get(class_name, 0)
            alts.append(
                Alt(
                    result_name=result_name,
                    base=request.name,
                    sub=sub,
                    cls=cls,
                    class_version=version,
                    selectors=exprs,
                    all_mode=mode == "All",
                    count=1 if count is None else count,
                    admin=admin,
                    tolerations=list(tolerations),
                    capacity=wanted,
                    verdict_key=verdict_key(class_name, version, exprs),
                    class_key=verdict_key(class_name, version, ()),
                )
            )
        plan.requests.append(Request(name=request.name, alts=alts))
    for c in claim.spec.devices.constraints:
        attribute = c.match_attribute if c.match_attribute is not None else c.distinct_attribute
        plan.constraints.append(Constraint(attribute=attribute or "", match=c.match_attribute is not None, requests=frozenset(c.requests)))
    for planned in plan.requests:
        for alt in planned.alts:
            alt.constraint_attributes = tuple(sorted({c.attribute for c in plan.constraints if c.covers(alt)}))
            alt.match_attributes = tuple(sorted({c.attribute for c in plan.constraints if c.match and c.covers(alt)}))
            alt.group = alt.count if alt.match_attributes and not alt.all_mode and alt.count > 1 else 0
            alt.learn_key = (alt.constraint_attributes, alt.match_attributes, alt.group)
    exact = sum(min(a.count for a in r.alts if not a.all_mode) if all(not a.all_mode for a in r.alts) else 0 for r in plan.requests)
    if exact > ALLOCATION_RESULTS_MAX:
        plan.error = f"claim {key}: number of requested devices {exact} exceeds the claim limit of {ALLOCATION_RESULTS_MAX}"
    return plan


PLAN_MEMORY = 1024
"""Specs whose plan is remembered (`Planner`): a fleet's claims come from a few templates, and a
stream of distinct specs (hostile or not) keeps at most this many."""


@dataclass(slots=True, eq=False)
class _Template:
    origin: ClaimPlan  # the plan made afresh; its shape (misfits.py) is shared too once computed
    classes: tuple[tuple[str, int, DeviceClass], ...]  # (name, version, object) of each class it resolved


class Planner:
    """`plan_claim` with a memory of the last PLAN_MEMORY specs: a claim whose spec (encoded) was
    planned before without error, while its classes are the same objects at the same versions,
    gets that plan's requests and constraints (read-only after planning, so shared) with only its
    metadata checked; anything else is planned afresh. Same plans, same messages."""

    def __init__(self, compile_selector: Any, compile_error: type[Exception]) -> None:
        self._compile = compile_selector
        self._error = compile_error
        self._memory: OrderedDict[bytes, _Template] = OrderedDict()
        self._namespaces: set[str] = set()  # namespaces found valid (`_names_valid`)

    def plan(self, claim: ResourceClaim, classes: dict[str, DeviceClass], class_versions: dict[str, int]) -> ClaimPlan:
        """The claim's plan, as `plan_claim(claim, classes, class_versions, ...)` makes it."""
        spec = msgspec.msgpack.encode(claim.spec)
        known = self._memory.get(spec)
        if known is not None and self._fresh(known, classes, class_versions) and self._names_valid(claim):
            self._memory.move_to_end(spec)
            origin = known.origin
            return ClaimPlan(claim=claim, key=claim.key, requests=origin.requests, constraints=origin.constraints, shape=origin.shape)
        plan = plan_claim(claim, classes, class_versions, self._compile, self._error)
        if plan.error is None:
            resolved = {alt.cls.metadata.name: (alt.class_version, alt.cls) for r in plan.requests for alt in r.alts}
            self._memory[spec] = _Template(plan, tuple((n, v, c) for n, (v, c) in resolved.items()))
            if len(self._memory) > PLAN_MEMORY:
                self._memory.popitem(last=False)
        return plan

    @staticmethod
    def _fresh(known: _Template, classes: dict[str, DeviceClass], class_versions: dict[str, int]) -> bool:
        """Whether every class the template resolved is the same object at the same version."""
        for name, version, cls in known.classes:  # noqa: SIM110 - a loop: this runs per claim (all(<genexpr>) costs a generator)
            if classes.get(name) is not cls or class_versions.get(name, 0) != version:
                return False
        return True

    def _names_valid(self, claim: ResourceClaim) -> bool:
        """`not metadata_errors(claim)` for a claim: its name a DNS subdomain, its namespace (if
        any) a DNS label; valid namespaces remembered (a fleet has few, each claim checks one)."""
        meta = claim.metadata
        if DNS_SUBDOMAIN.match(meta.name) is None:  # (`is_dns_subdomain`'s pattern called here: no Python frame per claim)
            return False
        namespace = meta.namespace
        if not namespace or namespace in self._namespaces:
            return True
        if not is_dns_label(namespace):
            return False
        if len(self._namespaces) >= PLAN_MEMORY:
            self._namespaces.clear()
        self._namespaces.add(namespace)
        return True


def _compile(expr: str, compile_selector: Any, compile_error: type[Exception]) -> str | None:
    try:
        compile_selector(expr)
    except compile_error as exc:
        return f"CEL compile error: {exc}"
    return None


def tolerated(taint: Any, tolerations: list[DeviceToleration]) -> bool:
    """Kubernetes' ToleratesTaint, for device taints."""
    for t in tolerations:
        if t.effect and t.effect != taint.effect:
            continue
        if t.key and t.key != taint.key:
            continue
        if (t.operator or "Equal") == "Exists":
            return True
        if (t.value or "") == (taint.value or "") and t.key:
            return True
    return False


def consumed_capacity(alt: Alt, rec: Any) -> dict[str, int] | None:
    """What taking `rec` for `alt` consumes of each device capacity (fully-qualified
    names), or None when the device cannot serve the request: a requested capacity
    the device lacks, or a value its request policy forbids or its total cannot hold.
    Read-only: without capacity requests the answer depends on the device alone and is
    kept on it (`DeviceRec.default_use`); with them, on the alternative per capacity map (`Alt.uses`)."""
    if not alt.capacity:
        known = rec.default_use  # (NOT_YET until first asked: no dict, so not typed as one)
        if known is NOT_YET:
            known = rec.default_use = _consumed(alt, rec)
        use: dict[str, int] | None = known  # (no `cast` call on this per-device path)
        return use
    published = rec.spec.capacity
    if not published:
        return _consumed(alt, rec)  # (an empty map may be a new one each time: nothing to key by)
    uses = alt.uses
    known = uses.get(id(published))
    if known is not None and known[0] is published and known[1] == rec.driver:
        return known[2]
    use = _consumed(alt, rec)
    if len(uses) >= USES_KEPT:
        uses.clear()
    uses[id(published)] = (published, rec.driver, use)  # (the map kept: its id is not given to another meanwhile)
    return use


USES_KEPT = 1024
"""Capacity maps an alternative keeps `consumed_capacity`'s answer for (`Alt.uses`) before it
starts over: a fleet's shared devices publish a few; this bounds what a hostile one costs."""


def _consumed(alt: Alt, rec: Any) -> dict[str, int] | None:
    caps = rec.capacity
    resolved: dict[str, int] = {}
    if alt.capacity:
        prefix = rec.driver + "/"
        for name, value in alt.capacity.items():
            if name in rec.spec.capacity:
                fq = name if "/" in name else prefix + name
            elif "/" in name:
                domain, _, ident = name.partition("/")
                if domain != rec.driver or ident not in rec.spec.capacity:
                    return None
                fq = name
            elif prefix + name in rec.spec.capacity:
                fq = prefix + name
            else:
                return None
            if fq in resolved:
                return None
            resolved[fq] = value
    out: dict[str, int] = {}
    for fq, cap in caps.items():
        want = resolved.get(fq)
        consumed = _round(want, cap)
        if consumed < 0 or _violates(consumed, cap) or consumed > cap.value:
            return None
        out[fq] = consumed
    return out


def _round(want: int | None, cap: Capacity) -> int:
    if want is None:
        return cap.default if cap.default is not None else cap.value
    if not cap.has_policy:
        return want
    if cap.range_min is not None:
        if want < cap.range_min:
            return cap.range_min
        if cap.range_step is None:
            return want
        steps = -(-(want - cap.range_min) // cap.range_step)
        return cap.range_min + steps * cap.range_step
    if cap.valid_values:
        for v in cap.valid_values:
            if want <= v:
                return v
    return want


def _violates(consumed: int, cap: Capacity) -> bool:
    if not cap.has_policy:
        return False
    if cap.default is not None and consumed == cap.default:
        return False
    if cap.range_min is not None:
        too_big = cap.range_max is not None and consumed > cap.range_max
        off_step = cap.range_step is not None and (consumed - cap.range_min) % cap.range_step != 0
        return too_big or off_step
    if cap.valid_values:
        return consumed not in cap.valid_values
    return False
