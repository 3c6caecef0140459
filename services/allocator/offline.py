"""`dralloc allocate` / `dralloc explain`: the engine fed from manifest files.

Reads the inputs (services.manifests), expands Pods and workloads into the
claims they stand for (dralloc.pods: `<pod>-<entry>`, `<pod>-extended-resources`),
loads the engine in a deterministic order (nodes by name, classes, slices by
driver/pool/name, existing allocations), then allocates in input order: a
Pod's claims as one unit (all-or-nothing, one node), the claims of one gang
(`dralloc.dev/gang`) as one, all-or-nothing inside one topology domain as the
allocator does, every other pending claim on its own (CLI-CONTRACT.md). I/O
stays here; the engine is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dralloc.allocator import evicting, moving
from dralloc.allocator.engine import Engine, Outcome
from dralloc.allocator.engine.explanations import Explanation
from dralloc.allocator.engine.gang import allocate_gang, gang_of, reservation_for
from dralloc.manifests import Manifests, Source, expand_paths, load_paths
from dralloc.pods import EXTENDED_RESOURCES_ENTRY, PodError, is_workload, offline_claim_name, pod_claims, workload_pods
from dralloc.schemas.resource import DeviceClass, DeviceTaintRule, Node, Object, Pod, ResourceClaim, ResourceClaimTemplate, ResourceSlice
from dralloc.schemas.validation import validate

EXPLAIN_NODES = 512
"""`dralloc explain` reports (and groups) up to this many nodes for a claim that is not allocated."""

NO_NODE_HINT = "add --profile h100-sxm:4 or --fleet FILE (simulated nodes; `dralloc discover --list-profiles`)"


class InputError(Exception):
    """The inputs could not be read or decoded (exit code 2)."""


@dataclass(slots=True)
class Run:
    engine: Engine
    outcomes: list[Outcome]
    warnings: list[str] = field(default_factory=list)
    pods: dict[str, str] = field(default_factory=dict)
    """claim `namespace/name` -> the Pod (`namespace/name`) it was allocated for."""
    nodes: int = 0
    """How many nodes were known (from Node objects, slices, --profile, --fleet)."""
    holders: dict[str, dict[str | None, list[str]]] = field(default_factory=dict)
    """With explain: for each claim not allocated, the claims holding devices on each node when it was decided."""


@dataclass(slots=True)
class _Unit:
    """What is allocated as one: a Pod's claims, or one claim no Pod uses."""

    pod: Pod | None
    claims: list[ResourceClaim]
    referenced: list[str] = field(default_factory=list)  # claims the Pod names by resourceClaimName
    errors: list[str] = field(default_factory=list)
    gang: tuple[str, int, str | None] | None = None
    """The claims are one gang: (name, size, domain label), `gang.gang_of`."""


def load(paths: Sequence[str | Path]) -> Manifests:
    if not paths:
        raise InputError("no input: give at least one -f FILE or directory")
    for path in paths:
        if not Path(path).exists():
            raise InputError(f"{path}: no such file or directory")
    manifests = load_paths(paths)
    if manifests.errors:
        raise InputError("\n".join(str(e) for e in manifests.errors))
    return manifests


def _in_order(paths: Sequence[str | Path], manifests: Manifests) -> tuple[list[tuple[Source, Object]], list[str]]:
    """Every object in input order, workloads expanded into their Pods; other kinds are warnings."""
    rank = {str(p): i for i, p in enumerate(expand_paths(paths))}
    items: list[tuple[tuple[int, int, int], Source, Object]] = [
        ((rank.get(item.source.path, 0), item.source.document, 0), item.source, item.obj) for item in manifests.objects
    ]
    warnings: list[str] = []
    for skipped in manifests.skipped:
        if not is_workload(skipped.doc):
            warnings.append(str(skipped))
            continue
        try:
            pods = workload_pods(skipped.doc)
        except PodError as exc:
            raise InputError(f"{skipped.source}: {skipped.kind}/{skipped.name}: {exc}") from None
        key = (rank.get(skipped.source.path, 0), skipped.source.document)
        items += [((*key, i), skipped.source, pod) for i, pod in enumerate(pods)]
    items.sort(key=lambda item: item[0])
    return [(source, obj) for _, source, obj in items], warnings


def run(
    paths: Sequence[str | Path],
    *,
    node: str | None = None,
    together: bool = False,
    explain: bool = False,
    extra: Sequence[Node | ResourceSlice] = (),
) -> Run:
    """Allocate the inputs' pending claims and Pods; `extra`: simulated nodes and their slices (--profile, --fleet)."""
    manifests = load(paths)
    objects, warnings = _in_order(paths, manifests)
    return allocate_objects(objects, node=node, together=together, explain=explain, extra=extra, warnings=warnings)


@dataclass(slots=True)
class Loaded:
    """What `load_engine` leaves besides the engine it fed."""

    pending: dict[str, ResourceClaim]
    """Claims without an allocation, by `namespace/name`, in input order (the first of a name wins)."""
    warnings: list[str]
    """Validation problems, what the engine refused or adjusted, allocations it could not restore."""
    nodes: int
    """How many node names are known (Node objects, slices' and devices' nodeName)."""


def load_engine(engine: Engine, objects: Sequence[tuple[Source | None, Object]]) -> Loaded:
    """Feed `engine` the inputs in `dralloc allocate`'s deterministic order: node names sorted (also those
    known only from a slice or device), Nodes by name, DeviceClasses, DeviceTaintRules, ResourceSlices by
    (driver, pool, name), then the allocations of allocated claims in input order.

    `objects`: in input order, each with where it came from (None: simulated, named by kind/name only).
    The one loading path of the CLI, the conformance table and the upstream-verdict corpus; other kinds
    (Pods, templates, workloads) are left to the caller."""
    every = [obj for _, obj in objects]
    nodes = sorted((o for o in every if isinstance(o, Node)), key=lambda n: n.metadata.name)
    classes = [o for o in every if isinstance(o, DeviceClass)]
    rules = [o for o in every if isinstance(o, DeviceTaintRule)]  # taint the devices they select, as slice taints do
    slices = sorted((o for o in every if isinstance(o, ResourceSlice)), key=lambda s: (s.spec.driver, s.spec.pool.name, s.metadata.name))
    # nodes are tried in name order, also those known only from a slice's or device's nodeName
    names = {n.metadata.name for n in nodes}
    for s in slices:
        names.update(x for x in [s.spec.node_name, *(d.node_name for d in s.spec.devices)] if x)
    engine.inventory.register_nodes(sorted(names))
    warnings: list[str] = []
    inventory: list[Node | DeviceClass | DeviceTaintRule | ResourceSlice] = [*nodes, *classes, *rules, *slices]
    for item in inventory:
        for problem in validate(item):
            warnings.append(f"{item.kind}/{item.metadata.name}: {problem}")
        warnings += engine.apply(item)
    pending: dict[str, ResourceClaim] = {}
    for source, obj in objects:
        if isinstance(obj, ResourceClaim):
            if obj.status is not None and obj.status.allocation is not None:
                where = f"{source}: " if source is not None else ""
                warnings += [f"{where}{p}" for p in engine.restore(obj)]
            else:
                pending.setdefault(obj.key, obj)
    return Loaded(pending=pending, warnings=warnings, nodes=len(names))


def allocate_objects(
    objects: Sequence[tuple[Source, Object]],
    *,
    node: str | None = None,
    together: bool = False,
    explain: bool = False,
    extra: Sequence[Node | ResourceSlice] = (),
    warnings: Sequence[str] = (),
    scoring: bool = True,
) -> Run:
    """`run` after reading: `objects` (decoded, in input order, workloads expanded) loaded by `load_engine`,
    then allocated in input order (a Pod's claims as one unit, every other pending claim on its own, or all
    as one with `together`). `warnings`: the reader's, reported first. `scoring`: placement scoring (the
    CLI's default); off, Kubernetes' first-fit order."""
    engine = Engine(scoring=scoring)
    if explain:
        engine.explain_nodes = EXPLAIN_NODES  # explain groups the nodes by verdict: report many,
        engine.explain_untried = True  # and say why the nodes not tried could not hold the claim
    loaded = load_engine(engine, [*objects, *((None, obj) for obj in extra)])
    warnings = [*warnings, *loaded.warnings]
    classes = [obj for _, obj in objects if isinstance(obj, DeviceClass)]
    templates: dict[tuple[str, str], ResourceClaimTemplate] = {}
    invalid: set[tuple[str, str]] = set()
    for source, obj in objects:
        if isinstance(obj, ResourceClaimTemplate):
            key = (obj.metadata.namespace or "default", obj.metadata.name)
            if problems := validate(obj):
                invalid.add(key)
                warnings += [f"{source}: ResourceClaimTemplate/{obj.metadata.name}: {p}" for p in problems]
            else:
                templates[key] = obj
    pending = loaded.pending
    units = _units(objects, pending, templates, invalid, classes)
    result = Run(engine=engine, outcomes=[], warnings=warnings, nodes=loaded.nodes)
    for unit in units:
        if unit.pod is not None:
            pod_key = f"{unit.pod.metadata.namespace or 'default'}/{unit.pod.metadata.name}"
            result.pods.update({c.key: pod_key for c in unit.claims})
    if together:
        claims = [c for unit in units for c in unit.claims]
        failed = [e for unit in units for e in unit.errors]
        result.outcomes = _errors(claims, failed) if failed else engine.allocate(claims, node=node, together=True, explain=explain)
        _note_holders(result, result.outcomes, explain)
    else:
        gangs_of_pods: dict[str, list[tuple[ResourceClaim, Outcome]]] = {}
        for unit in units:
            outcomes = _allocate_unit(engine, unit, node, explain)
            _note_holders(result, outcomes, explain)
            if explain and node is None and unit.pod is None:
                _note_moves(engine, unit, outcomes, result.outcomes, pending, objects)
            elif explain and node is None and unit.pod is not None:
                _note_evictions(engine, unit, outcomes, objects, gangs_of_pods)
            result.outcomes += outcomes
    if not loaded.nodes:
        for outcome in result.outcomes:
            if outcome.status == "unsatisfiable" and "no node is known" in outcome.message:
                outcome.message = f"{outcome.message.rstrip('.')}; {NO_NODE_HINT}"
    return result


def _note_holders(result: Run, outcomes: Sequence[Outcome], explain: bool) -> None:
    """Who held what when these claims were decided (what explain names as blocking them)."""
    if explain and any(o.status != "allocated" for o in outcomes):
        snapshot = result.engine.snapshot().holders_by_node()  # explain reads a snapshot, not the live ledger
        for outcome in outcomes:
            if outcome.status != "allocated":
                result.holders[outcome.claim] = snapshot


def _note_moves(
    engine: Engine,
    unit: _Unit,
    outcomes: Sequence[Outcome],
    before: Sequence[Outcome],
    pending: dict[str, ResourceClaim],
    objects: Sequence[tuple[Source, Object]],
) -> None:
    """A large unit that does not fit: what moves would do for it (moving.py) among the claims that came
    allocated and those this run placed before it, as the allocator would move its committed claims."""
    if not any(o.status == "unsatisfiable" for o in outcomes):
        return
    came = _came_allocated(objects)
    placed = [pending[o.claim] for o in before if o.status == "allocated" and o.claim in pending]
    domain = unit.gang[2] if unit.gang is not None else None
    # (as the allocator: the Pods in its way are evicted only when no move in place makes room)
    notes = moving.describe(engine, unit.claims, [*came, *placed], domain) or evicting.describe_unit(engine, unit.claims, came, domain)
    _add_notes(outcomes, notes)


def _note_evictions(
    engine: Engine,
    unit: _Unit,
    outcomes: Sequence[Outcome],
    objects: Sequence[tuple[Source, Object]],
    gangs_of_pods: dict[str, list[tuple[ResourceClaim, Outcome]]],
) -> None:
    """A large Pod that does not fit: the evictions the allocator would ask for with moves on
    (evicting.py), among the claims that came allocated and reserved for Pods (`status.reservedFor`:
    as the cluster shows them). A Pod whose one claim is a gang member is kept in `gangs_of_pods`
    (gang -> its members' claims and outcomes so far) until its gang is complete, as the allocator
    collects it; then, none of it placed, every member is told the gang's evictions."""
    gang = gang_of(unit.claims[0]) if len(unit.claims) == 1 and not unit.referenced else None
    if gang is not None and gang[1] > 1:
        members = gangs_of_pods.setdefault(gang[0], [])
        members += zip(unit.claims, outcomes)
        if len(members) != gang[1] or any(o.status != "unsatisfiable" for _, o in members):
            return  # not complete yet (or too many: not the allocator's gang), or a member placed
        claims = [c for c, _ in members]
        _add_notes([o for _, o in members], evicting.describe_gang(engine, gang[0], claims, _came_allocated(objects), gang[2]))
        return
    if not any(o.status == "unsatisfiable" for o in outcomes) or any(c.key in engine.ledger.claims for c in unit.claims):
        return
    # (as the allocator: the claims it names placed already, shared, tie it to their node: room is made there)
    named = {o.key: o for _, o in objects if isinstance(o, ResourceClaim)}
    placed = [named[k] for k in unit.referenced if k in named and k in engine.ledger.claims]
    nodes = {node for c in placed if (node := engine.ledger.claims[c.key].node) is not None}
    if len(nodes) <= 1:
        _add_notes(outcomes, evicting.describe(engine, list(unit.claims), _came_allocated(objects), placed, next(iter(nodes), None)))


def _came_allocated(objects: Sequence[tuple[Source, Object]]) -> list[ResourceClaim]:
    """The claims the inputs hold allocated already (as the cluster shows them)."""
    return [o for _, o in objects if isinstance(o, ResourceClaim) and o.status is not None and o.status.allocation is not None]


def _add_notes(outcomes: Sequence[Outcome], notes: list[str]) -> None:
    """Add `notes` to the explanation of each of `outcomes` that is unsatisfiable."""
    for outcome in outcomes:
        if notes and outcome.status == "unsatisfiable":
            outcome.explanation = outcome.explanation or Explanation()
            outcome.explanation.notes += notes


def _units(
    objects: Sequence[tuple[Source, Object]],
    pending: dict[str, ResourceClaim],
    templates: dict[tuple[str, str], ResourceClaimTemplate],
    invalid: set[tuple[str, str]],
    classes: Sequence[DeviceClass],
) -> list[_Unit]:
    """Units in input order: each Pod with its claims (made and named), then claims no Pod names at their place."""
    pod_units: list[tuple[Source, _Unit]] = []
    named: set[str] = set()
    for source, obj in objects:
        if not isinstance(obj, Pod):
            continue
        resolved = pod_claims(obj, templates, invalid=invalid, classes=classes)
        unit = _Unit(pod=obj, claims=list(resolved.made), errors=[str(e) for e in resolved.errors])
        for key in resolved.existing:
            named.add(key)
            if key in pending:
                unit.claims.append(pending[key])
            else:
                unit.referenced.append(key)
        if unit.errors and not unit.claims:
            unit.claims = _placeholders(obj)
        pod_units.append((source, unit))
    units: list[_Unit] = []
    gangs: dict[str, _Unit] = {}
    taken: set[str] = set()
    pods_at = {id(pod_unit.pod): pod_unit for _, pod_unit in pod_units}
    for _, obj in objects:
        if isinstance(obj, Pod):
            unit = pods_at[id(obj)]
            # a claim two Pods share is allocated with the first; the second finds it allocated
            shared = [c for c in unit.claims if c.key in taken]
            unit.referenced += [c.key for c in shared]
            unit.claims = [c for c in unit.claims if c.key not in taken]
            taken.update(c.key for c in unit.claims)
            units.append(unit)
        elif isinstance(obj, ResourceClaim) and obj.key in pending and obj.key not in named and obj.key not in taken:
            taken.add(obj.key)
            claim = pending[obj.key]
            gang = gang_of(claim)
            if gang is None:
                units.append(_Unit(pod=None, claims=[claim]))
            elif gang[0] in gangs:
                gangs[gang[0]].claims.append(claim)  # a gang is one unit, where its first member is
            else:
                gangs[gang[0]] = _Unit(pod=None, claims=[claim], gang=gang)
                units.append(gangs[gang[0]])
    return units


def _placeholders(pod: Pod) -> list[ResourceClaim]:
    """Claims that stand for a Pod whose entries could not be resolved, so that its error has a row."""
    from dralloc.schemas.resource import ObjectMeta

    namespace = pod.metadata.namespace or "default"
    entries = [e.name for e in pod.spec.resource_claims] or [EXTENDED_RESOURCES_ENTRY]
    return [ResourceClaim(metadata=ObjectMeta(name=offline_claim_name(pod, entry), namespace=namespace)) for entry in entries]


def _errors(claims: Sequence[ResourceClaim], errors: Sequence[str]) -> list[Outcome]:
    message = "; ".join(errors)
    return [Outcome(claim=c.key, status="error", message=message) for c in claims]


def _allocate_unit(engine: Engine, unit: _Unit, node: str | None, explain: bool) -> list[Outcome]:
    if unit.gang is not None and node is None:
        return _allocate_gang(engine, unit.claims, unit.gang, explain)
    if unit.pod is None:
        return engine.allocate(unit.claims, node=node, explain=explain)
    pod = f"Pod {unit.pod.metadata.namespace or 'default'}/{unit.pod.metadata.name}"
    if unit.errors:
        return _errors(unit.claims, [f"{pod}: {e}" for e in unit.errors])
    fixed: set[str] = set()
    for key in unit.referenced:
        record = engine.ledger.claims.get(key)
        if record is None:
            return _errors(unit.claims, [f"{pod}: claim {key} (resourceClaimName) is neither in the inputs nor allocated"])
        if record.node is not None:
            fixed.add(record.node)
    if not unit.claims:
        return []
    if len(fixed) > 1 or (fixed and node is not None and node not in fixed):
        where = " and ".join(sorted(fixed | ({node} if node else set())))
        message = f"{pod}: its claims are already allocated on different nodes ({where}); a Pod runs on one node"
        return [Outcome(claim=c.key, status="unsatisfiable", message=message) for c in unit.claims]
    target = next(iter(fixed)) if fixed else node
    return engine.allocate(unit.claims, node=target, together=True, explain=explain)


def _allocate_gang(engine: Engine, claims: list[ResourceClaim], gang: tuple[str, int, str | None], explain: bool) -> list[Outcome]:
    """A gang's claims all-or-nothing inside one domain (gang.py, as the allocator does). With
    `explain`, a gang that does not fit says how many of its members the inputs hold and what
    the allocator would hold for it while it waits (the domain's nodes closest to holding it)."""
    name, size, domain = gang
    outcomes = allocate_gang(engine, claims, name=name, domain_label=domain, explain=explain)
    if explain and any(o.status == "unsatisfiable" for o in outcomes):
        notes = [] if len(claims) >= size else [f"gang {name}: {len(claims)} of its {size} claims are in the inputs; the allocator waits for all {size}"]
        held = reservation_for(engine, claims, domain_label=domain)
        notes += engine.placement.describe_wait(held, subject=f"gang {name}") or [
            f"gang {name}: no domain could hold all its claims even with every device free; nothing is held for it while it waits"
        ]
        for outcome in outcomes:
            if outcome.status == "unsatisfiable" and outcome.explanation is None:
                outcome.explanation = Explanation(notes=notes)
    return outcomes


def exit_code(outcomes: Sequence[Outcome]) -> int:
    return 0 if all(o.status == "allocated" for o in outcomes) else 1
