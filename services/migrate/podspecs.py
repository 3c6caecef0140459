"""Where the pod specs of an object sit, whatever the object's kind.

"A PodSpec is an object with a `containers` list of objects that have a `name`"
(MIGRATE-CONTRACT.md): so a Deployment's `spec.template.spec`, a CronJob's
`spec.jobTemplate.spec.template.spec`, a PyTorchJob's replica templates, a
RayCluster's head and worker groups and a JobSet's nested Job templates are all
found the same way, without a list of kinds. Works on plain mappings (dicts,
ruamel's round-trip maps); nothing here mutates.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

Path = tuple[str | int, ...]

# Path keys that say nothing about which pod spec this is (a Deployment's `spec.template.spec`).
_GENERIC = {"spec", "template", "jobtemplate", "podspec", "podtemplate", "leaderworkertemplate", "items"}
_SUFFIXES = ("groupspecs", "groupspec", "replicaspecs", "specs", "spec", "templates", "template")


def is_pod_spec(value: Any) -> bool:
    """True for a mapping whose `containers` is a non-empty list of mappings that all have a string `name`."""
    if not isinstance(value, Mapping):
        return False
    containers = value.get("containers")
    return (
        isinstance(containers, list)
        and bool(containers)
        and all(isinstance(c, Mapping) and isinstance(c.get("name"), str) for c in containers)
    )


def find_pod_specs(obj: Any, path: Path = ()) -> Iterator[tuple[Path, Mapping]]:
    """Every pod spec in `obj`, depth first in document order; a pod spec's own fields are not searched further."""
    if is_pod_spec(obj):
        yield path, obj
        return
    if isinstance(obj, Mapping):
        for key, value in obj.items():
            if isinstance(value, (Mapping, list)):
                yield from find_pod_specs(value, (*path, str(key)))
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            if isinstance(value, (Mapping, list)):
                yield from find_pod_specs(value, (*path, i))


def mappings(obj: Any, path: Path = (), skip: frozenset[int] = frozenset()) -> Iterator[tuple[Path, Mapping]]:
    """Every mapping in `obj` (itself included) with its path, not entering those whose id() is in `skip`."""
    if id(obj) in skip:
        return
    if isinstance(obj, Mapping):
        yield path, obj
        for key, value in obj.items():
            if isinstance(value, (Mapping, list)):
                yield from mappings(value, (*path, str(key)), skip)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            if isinstance(value, (Mapping, list)):
                yield from mappings(value, (*path, i), skip)


def dotted(path: Path) -> str:
    """`spec.template.spec.containers[0]`: a path as people write field references."""
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else part)
    return text


def role(obj: Any, path: Path) -> str:
    """What distinguishes the pod spec at `path` from the object's other pod specs, for names:
    the nearest named list item (`workerGroupSpecs[0]` with `groupName: gpu-group` -> `gpu-group`)
    or meaningful key (`Worker`, `headGroupSpec` -> `head`, `leaderTemplate` -> `leader`);
    empty for the one pod template of core workloads (`spec.template.spec`)."""
    nodes: list[Any] = [obj]
    for part in path:
        nodes.append(nodes[-1][part])
    for depth in range(len(path) - 1, -1, -1):
        part = path[depth]
        if isinstance(part, int):
            item = nodes[depth + 1]
            for field in ("name", "groupName"):
                if isinstance(item, Mapping) and isinstance(item.get(field), str) and item[field]:
                    return item[field]
            continue
        lowered = part.lower()
        if lowered in _GENERIC:
            continue
        for suffix in _SUFFIXES:
            if lowered.endswith(suffix) and len(lowered) > len(suffix):
                return part[: -len(suffix)]
        return part
    return ""
