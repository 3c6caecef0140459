"""`dralloc allocate` / `dralloc explain`: the engine fed from manifest files.

Reads the inputs (services.manifests), loads the engine in a deterministic
order (nodes by name, classes, slices by driver/pool/name, existing
allocations), allocates the pending claims in input order and returns the
outcomes. I/O stays here; the engine is pure.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from dralloc.allocator.engine import Engine, Outcome
from dralloc.manifests import Manifests, load_paths
from dralloc.schemas.resource import DeviceClass, Node, ResourceClaim, ResourceSlice
from dralloc.schemas.validation import validate


class InputError(Exception):
    """The inputs could not be read or decoded (exit code 2)."""


@dataclass(slots=True)
class Run:
    engine: Engine
    outcomes: list[Outcome]
    warnings: list[str] = field(default_factory=list)


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


def run(paths: Sequence[str | Path], *, node: str | None = None, together: bool = False, explain: bool = False) -> Run:
    manifests = load(paths)
    warnings = [str(s) for s in manifests.skipped]
    engine = Engine()
    objects = [(item.source, item.obj) for item in manifests.objects]
    nodes = sorted((o for _, o in objects if isinstance(o, Node)), key=lambda n: n.metadata.name)
    classes = [o for _, o in objects if isinstance(o, DeviceClass)]
    slices = sorted((o for _, o in objects if isinstance(o, ResourceSlice)), key=lambda s: (s.spec.driver, s.spec.pool.name, s.metadata.name))
    # nodes are tried in name order, also those known only from a slice's or device's nodeName
    names = {n.metadata.name for n in nodes}
    for s in slices:
        names.update(x for x in [s.spec.node_name, *(d.node_name for d in s.spec.devices)] if x)
    engine.inventory.register_nodes(sorted(names))
    for obj in [*nodes, *classes, *slices]:
        for problem in validate(obj):
            warnings.append(f"{obj.kind}/{obj.metadata.name}: {problem}")
        warnings += engine.apply(obj)
    pending: list[ResourceClaim] = []
    for source, obj in objects:
        if not isinstance(obj, ResourceClaim):
            continue
        if obj.status is not None and obj.status.allocation is not None:
            warnings += [f"{source}: {p}" for p in engine.restore(obj)]
        else:
            pending.append(obj)
    outcomes = engine.allocate(pending, node=node, together=together, explain=explain)
    return Run(engine=engine, outcomes=outcomes, warnings=warnings)


def exit_code(outcomes: Sequence[Outcome]) -> int:
    return 0 if all(o.status == "allocated" for o in outcomes) else 1
