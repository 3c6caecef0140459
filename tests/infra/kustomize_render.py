"""Render a kustomize base the way `kubectl kustomize` does, for the features infra/ uses.

There is no kubectl here, so the tests render in Python. Only the
transformations infra/ uses are implemented (`resources`, `namespace`,
`labels` without selectors, `images`); a kustomization using anything else is
an error, so the renderer can never silently drop a transformation that
`kubectl kustomize` would apply.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

SUPPORTED = {"apiVersion", "kind", "namespace", "labels", "resources", "images"}

CLUSTER_SCOPED = {"Namespace", "ClusterRole", "ClusterRoleBinding", "DeviceClass", "ResourceSlice",
                  "CustomResourceDefinition", "PriorityClass", "StorageClass"}

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
    return objects


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
