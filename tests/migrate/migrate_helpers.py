"""Shared by the migrate tests: run the command in-process, allocate its output on a simulated fleet,
and count GPUs per container before (extended resources) and after (claims)."""

from __future__ import annotations

import functools
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec
import yaml

from dralloc.allocator.engine import Engine
from dralloc.discovery.fleet import build_fleet
from dralloc.manifests import load_paths
from dralloc.migrate.command import Result, run
from dralloc.migrate.podspecs import find_pod_specs
from dralloc.migrate.resources import GpuResource, classify, count
from dralloc.schemas.resource import ResourceClaim

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples" / "migrate"
FLEET = [("h100-sxm-mig", 2), ("l40s-pcie", 1), ("a100-pcie", 1)]


def migrate(text: str, **options) -> Result:
    """`dralloc migrate -f -` on `text`."""
    return run(["-"], stdin_text=text, **options)


def documents(text: str) -> list[dict]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def objects(docs: Iterable[dict]) -> list[dict]:
    """Documents with List items flattened."""
    out = []
    for d in docs:
        out.extend(d["items"] if d.get("kind") == "List" else [d])
    return out


def gpus_before(docs: Iterable[dict]) -> dict[tuple[str, str, str], int]:
    """(object, pod spec path, container) -> devices the device plugin would give it."""
    counts = {}
    for obj in objects(docs):
        for path, spec in find_pod_specs(obj):
            for key in ("initContainers", "containers"):
                for c in spec.get(key) or []:
                    limits = {**((c.get("resources") or {}).get("requests") or {}), **((c.get("resources") or {}).get("limits") or {})}
                    n = sum(count(v) for k, v in limits.items() if isinstance(classify(str(k)), GpuResource))
                    if n:
                        counts[(obj["metadata"]["name"], str(path), c["name"])] = n
    return counts


def template_counts(docs: Iterable[dict]) -> dict[tuple[str, str, str], int]:
    """(object, pod spec path, container) -> devices its claim references ask for (the templates' exactly.count)."""
    objs = objects(docs)
    templates = {(t["metadata"].get("namespace"), t["metadata"]["name"]): t for t in objs if t["kind"] == "ResourceClaimTemplate"}
    counts = {}
    for obj in objs:
        if obj["kind"] == "ResourceClaimTemplate":
            continue
        for path, spec in find_pod_specs(obj):
            claims = {c["name"]: templates[(obj["metadata"].get("namespace"), c["resourceClaimTemplateName"])] for c in spec.get("resourceClaims") or []}
            for key in ("initContainers", "containers"):
                for c in spec.get(key) or []:
                    n = 0
                    for ref in (c.get("resources") or {}).get("claims") or []:
                        requests = claims[ref["name"]]["spec"]["spec"]["devices"]["requests"]
                        request = next(r for r in requests if r["name"] == ref["request"])
                        # a right-sized request: MIG slice or whole GPU, one device either way
                        n += request["exactly"]["count"] if "exactly" in request else request["firstAvailable"][0]["count"]
                    if n:
                        counts[(obj["metadata"]["name"], str(path), c["name"])] = n
    return counts


@functools.cache
def _inventory(fleet: tuple) -> tuple:
    classes = [o.obj for o in load_paths([REPO / "examples" / "deviceclasses.yaml"]).objects]
    return classes, build_fleet(list(fleet))


def engine(fleet: Iterable[tuple[str, int]] = FLEET) -> Engine:
    """A fresh engine over a simulated fleet with NVIDIA's device classes."""
    classes, nodes = _inventory(tuple(fleet))
    e = Engine()
    e.inventory.register_nodes([name for name, _ in nodes])
    for cls in classes:
        e.apply(cls)
    for _, slices in nodes:
        for s in slices:
            e.apply(s)
    return e


def allocate(docs: Iterable[dict], fleet: Iterable[tuple[str, int]] = FLEET) -> dict[tuple[str, str, str], tuple[int, str | None, list[str]]]:
    """Allocate one claim per migrated pod spec (from its template) on the fleet; per container:
    (devices allocated to its requests, node, the devices' names). Fails on an unallocated claim."""
    objs = objects(docs)
    templates = {(t["metadata"].get("namespace"), t["metadata"]["name"]): t for t in objs if t["kind"] == "ResourceClaimTemplate"}
    e = engine(fleet)
    out = {}
    for obj in objs:
        if obj["kind"] == "ResourceClaimTemplate":
            continue
        for path, spec in find_pod_specs(obj):
            results: dict[str, list[str]] = {}
            node = None
            for pod_claim in spec.get("resourceClaims") or []:
                template = templates[(obj["metadata"].get("namespace"), pod_claim["resourceClaimTemplateName"])]
                claim = msgspec.convert(
                    {
                        "apiVersion": "resource.k8s.io/v1",
                        "kind": "ResourceClaim",
                        "metadata": {
                            "name": f"{obj['metadata']['name']}-{abs(hash(str(path)))}-{pod_claim['name']}",
                            "namespace": obj["metadata"].get("namespace") or "default",
                        },
                        "spec": template["spec"]["spec"],
                    },
                    ResourceClaim,
                )
                (outcome,) = e.allocate([claim])
                assert outcome.status == "allocated", outcome.message
                node = outcome.node
                for r in outcome.allocation.devices.results:
                    results.setdefault(r.request.split("/")[0], []).append(r.device)  # "<request>/<subrequest>"
            for key in ("initContainers", "containers"):
                for c in spec.get(key) or []:
                    devices = [d for ref in (c.get("resources") or {}).get("claims") or [] for d in results.get(ref["request"], [])]
                    if devices:
                        out[(obj["metadata"]["name"], str(path), c["name"])] = (len(devices), node, devices)
    return out


def pod_objects(obj: Mapping) -> list[dict]:
    """Each pod spec of an object as a v1 Pod (what Kubernetes would create from it), for schema validation."""
    return [{"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"p{i}"}, "spec": spec} for i, (_, spec) in enumerate(find_pod_specs(obj))]
