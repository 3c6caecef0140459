"""Where the pod specs of an object sit, whatever the object's kind.

"A PodSpec is an object with a `containers` list of objects that have a `name`"
(MIGRATE-CONTRACT.md): so a Deployment's `spec.template.spec`, a CronJob's
`spec.jobTemplate.spec.template.spec`, a PyTorchJob's replica templates, a
RayCluster's head and worker groups and a JobSet's nested Job templates are all
found the same way, without a list of kinds (`dralloc.pods` finds them). Works on
plain mappings (dicts, ruamel's round-trip maps); nothing here mutates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any

from dralloc.pods import find_pod_specs as _find_pod_specs

Path = tuple[str | int, ...]

# Path keys that say nothing about which pod spec this is (a Deployment's `spec.template.spec`).
_GENERIC = {"spec", "template", "jobtemplate", "podspec", "podtemplate", "leaderworkertemplate", "items"}
_SUFFIXES = ("groupspecs", "groupspec", "replicaspecs", "specs", "spec", "templates", "template")


def find_pod_specs(obj: Any) -> Iterator[tuple[Path, Mapping]]:
    """Every pod spec in `obj`, depth first in document order, with its path as keys and indices.

    The finding is `dralloc.pods.find_pod_specs` (one definition of a PodSpec for the
    project); its `spec.workers[1].template.spec` paths are resolved back against `obj`
    here, so keys that hold dots stay whole."""
    for text, spec in _find_pod_specs(obj):
        yield _resolve(obj, text, spec), spec


_TOKEN = re.compile(r"\[(\d+)\]|([^.\[]+)")


def _resolve(obj: Any, text: str, spec: Mapping) -> Path:
    tokens = [int(i) if i else key for i, key in _TOKEN.findall(text)]
    path: list[str | int] = []
    node = obj
    k = 0
    while k < len(tokens):
        token = tokens[k]
        if isinstance(token, int) and isinstance(node, list) and token < len(node):
            node = node[token]
            path.append(token)
            k += 1
            continue
        # a mapping key may itself hold dots: take the shortest run of tokens that names a key
        found = False
        for end in range(k + 1, len(tokens) + 1):
            if not isinstance(tokens[end - 1], str) or not isinstance(node, Mapping):
                break
            key = ".".join(map(str, tokens[k:end]))  # (all str: checked as `end` grew)
            if key in node:
                node, found, k = node[key], True, end
                path.append(key)
                break
        if not found:
            return ()
    return tuple(path) if node is spec else ()


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
