"""Render a kustomize base the way `kubectl kustomize` does, for the features infra/ uses.

There is no kubectl here, so the tests render in Python. Only the
transformations infra/ uses are implemented (`resources`, `namespace`,
`labels` without selectors, `images`, `patches` as inline JSON 6902 operations on a
kind/name target); a kustomization using anything else is
an error, so the renderer can never silently drop a transformation that
`kubectl kustomize` would apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "namespace", "labels", "resources", "images", "patches"}

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ResourceSlice", "CustomResourceDefinition", "PriorityClass", "StorageClass"}

POD_TEMPLATE_KINDS = {"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"}


class KustomizeError(Exception):
    pass


def render(directory: Path) -> list[dict[str, Any]]:
    kustomization = yaml.safe_load((directory / "kustomization.yaml").read_text())
    unknown = set(kustomization) - SUPPORTED
    if unknown:
        raise KustomizeError(f"{directory}/kustomization.yaml uses {sorted(unknown)}, which this renderer does not apply")
    objects: list[dict[str, Any]] = []
    for entry in kustomization.get("resources", []):
        path = directory / entry
        if path.is_dir():
            objects += render(path)
        elif path.is_file():
            objects += [doc for doc in yaml.safe_load_all(path.read_text()) if doc is not None]
        else:
            raise KustomizeError(f"{directory}/kustomization.yaml: resource {entry!r} does not exist")
    namespace = kustomization.get("namespace")
    for obj in objects:
        if namespace and obj.get("kind") not in CLUSTER_SCOPED:
            obj.setdefault("metadata", {})["namespace"] = namespace
        if namespace and obj.get("kind") in ("RoleBinding", "ClusterRoleBinding"):
            for subject in obj.get("subjects", []):
                if subject.get("kind") == "ServiceAccount":
                    subject["namespace"] = namespace
        for group in kustomization.get("labels", []):
            if set(group) - {"pairs"}:
                raise KustomizeError(f"labels options {sorted(set(group) - {'pairs'})} are not supported")
            obj.setdefault("metadata", {}).setdefault("labels", {}).update(group["pairs"])
        for container in containers(obj):
            for image in kustomization.get("images", []):
                name, _, tag = container["image"].partition(":")
                if name == image["name"]:
                    container["image"] = f"{image.get('newName', name)}:{image.get('newTag', tag or 'latest')}"
    for patch in kustomization.get("patches", []):
        if set(patch) != {"target", "patch"} or set(patch["target"]) - {"kind", "name"}:
            raise KustomizeError(f"only inline JSON 6902 patches with a kind/name target are supported: {patch}")
        kind, name = patch["target"].get("kind"), patch["target"].get("name")
        targets = [o for o in objects if kind in (None, o.get("kind")) and name in (None, o["metadata"]["name"])]
        if not targets:
            raise KustomizeError(f"patch target {patch['target']} matches nothing")
        for target in targets:
            for op in yaml.safe_load(patch["patch"]):
                _apply_op(target, op)
    return objects


def _apply_op(obj: dict[str, Any], op: dict[str, Any]) -> None:
    *parents, last = op["path"].lstrip("/").split("/")
    node: Any = obj
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if op["op"] == "add" and isinstance(node, list):
        node.insert(len(node) if last == "-" else int(last), op["value"])
    elif op["op"] in ("add", "replace"):
        node[int(last) if isinstance(node, list) else last] = op["value"]
    elif op["op"] == "remove":
        del node[int(last) if isinstance(node, list) else last]
    else:
        raise KustomizeError(f"unsupported patch operation {op['op']!r}")


def containers(obj: dict[str, Any]) -> list[dict[str, Any]]:
    if obj.get("kind") not in POD_TEMPLATE_KINDS:
        return []
    spec = obj["spec"]["template"]["spec"]
    return [*spec.get("initContainers", []), *spec.get("containers", [])]


def find(objects: list[dict[str, Any]], kind: str, name: str) -> dict[str, Any]:
    for obj in objects:
        if obj.get("kind") == kind and obj["metadata"]["name"] == name:
            return obj
    raise KeyError(f"{kind}/{name} not in the rendered manifests")


def granted(objects: list[dict[str, Any]], service_account: str) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) granted to a ServiceAccount by the rendered RBAC."""
    rules: set[tuple[str, str, str]] = set()
    for binding in objects:
        if binding.get("kind") not in ("ClusterRoleBinding", "RoleBinding"):
            continue
        if not any(s.get("kind") == "ServiceAccount" and s["name"] == service_account for s in binding.get("subjects", [])):
            continue
        role = find(objects, binding["roleRef"]["kind"], binding["roleRef"]["name"])
        for rule in role.get("rules", []):
            for group in rule.get("apiGroups", []):
                for res in rule.get("resources", []):
                    for verb in rule.get("verbs", []):
                        rules.add((group, res, verb))
    return rules
