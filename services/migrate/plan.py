"""`dralloc plan`: how many GPUs and nodes the workloads need under the device plugin and under DRA.

Both answers come from the same engine (`dralloc.allocator.engine.Engine`) on the
same simulated fleet (the demo's fleet format, `dralloc.discovery.fleet`):

- device plugin: every GPU ask is whole GPUs (`nvidia.com/mig-*` and
  `nvidia.com/gpu.shared` too: a node's GPUs are not partitioned on demand),
  the GPUs published without MIG partitions, first fit in fleet order (no
  topology, no best fit). The engine says, once per distinct claim and node
  profile, whether and with how many GPUs the claim fits an empty node; the
  pods are then counted onto nodes (`plan_device_plugin.py`), which gives what
  the engine without scoring gives over the whole fleet, in a fraction of the time;
- DRA with dralloc: the workloads as `dralloc migrate` writes them (MIG asks
  as MIG devices, `--usage` right-sizing to MIG slices and GPU shares), the
  MIG-capable GPUs published with their partitions, the GPUs of `sharing`
  entries multi-allocatable by memory, topology- and fragmentation-aware placement.

Each pod (replicas counted: `replicas` and `parallelism` on the way from the
object to its pod template multiply) gets one claim, allocated in input
order. GPUs needed are the distinct physical GPUs holding an allocation (a GPU
with one MIG slice or one share allocated counts as one); nodes the distinct
nodes. Per workload, GPU-equivalents (a MIG slice counts its compute share, `Ng`
of 7; a share the fraction of the GPU's memory it holds) show which workloads
drive the difference. Pods that fit nowhere are counted
per mode, never silently dropped.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from dralloc.allocator.engine import Engine
from dralloc.discovery.fleet import FleetError, FleetSpec, build_fleet, load_fleet
from dralloc.migrate.command import files, load_usage
from dralloc.migrate.documents import InputError, kind_of, plain, read
from dralloc.migrate.plan_device_plugin import FirstFit
from dralloc.migrate.podspecs import Path, find_pod_specs
from dralloc.migrate.rewrite import DecodeError, Names, Report, describe, migrate_object
from dralloc.schemas.quantity import parse_quantity
from dralloc.schemas.resource import DeviceClass, ResourceClaim

MAX_REPLICAS = 10_000
"""Replicas of one pod template beyond this are refused (a typo, or hostile input)."""

CLASSES = [
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'gpu'"}}]},
    },
    {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "mig.nvidia.com"},
        "spec": {"selectors": [{"cel": {"expression": "device.driver == 'gpu.nvidia.com' && device.attributes['gpu.nvidia.com'].type == 'mig'"}}]},
    },
]
"""NVIDIA's DRA driver classes, as `examples/deviceclasses.yaml` defines them and NVIDIA's Helm chart installs them
(k8s-dra-driver-gpu `deployments/helm/dra-driver-nvidia-gpu/templates/deviceclass-gpu.yaml`, `deviceclass-mig.yaml`)."""


@dataclass(slots=True)
class _Pods:
    """One pod template of a workload: its claim spec per mode, and how many pods it makes."""

    replicas: int
    device_plugin: dict | None
    dra: dict | None


@dataclass(slots=True)
class Workload:
    name: str
    """`Kind/namespace/name` (`Kind/name` without a namespace)."""
    templates: list[_Pods] = field(default_factory=list)

    @property
    def pods(self) -> int:
        return sum(t.replicas for t in self.templates)


@dataclass(slots=True)
class ModeResult:
    gpus: set[tuple[str, str]] = field(default_factory=set)
    nodes: set[str] = field(default_factory=set)
    not_fitted: int = 0
    per_workload: dict[str, float] = field(default_factory=dict)
    """GPU-equivalents held per workload."""
    mig_workloads: set[str] = field(default_factory=set)
    share_workloads: set[str] = field(default_factory=set)
    mig_pods: int = 0
    share_pods: int = 0
    seconds: float = 0.0


def load_workloads(paths: Sequence[str], usage_path: str | None, report: Report) -> list[Workload]:
    """Every object asking for NVIDIA GPUs, migrated twice (as the device plugin sees it, and for DRA)."""
    usage = load_usage(usage_path) if usage_path is not None else None
    workloads: list[Workload] = []
    for path in files(paths):
        if path == "-":
            raise InputError("dralloc plan reads files, not standard input")
        source = read(path, fast=True)  # never written back: plain data, the C parser
        for doc in source.documents:
            where = f"{path} (document {doc.number})"
            if doc.data is None:
                continue
            if not isinstance(doc.data, Mapping):
                raise InputError(f"{where}: expected a Kubernetes object (a mapping), got {kind_of(doc.data)}")
            data = plain(doc.data)
            items = data["items"] if str(data.get("kind", "")).endswith("List") and isinstance(data.get("items"), list) else [data]
            for i, obj in enumerate(items):
                if isinstance(obj, dict) and obj.get("kind") != "ResourceClaimTemplate":
                    here = where if len(items) == 1 and items[0] is data else f"{where}: items[{i}]"
                    workload = _workload(obj, here, usage, report)
                    if workload is not None:
                        workloads.append(workload)
    return workloads


def _workload(obj: dict, where: str, usage, report: Report) -> Workload | None:
    modes = {}
    for mode in ("device_plugin", "dra"):
        copy = plain(obj)
        try:
            templates = migrate_object(
                copy,
                names=Names(),
                report=report if mode == "dra" else Report(),
                where=where,
                usage=usage if mode == "dra" else None,
                whole_gpus=mode == "device_plugin",
            )
        except DecodeError as exc:
            raise InputError(f"{where}: {describe(obj)}: {exc}") from None
        modes[mode] = (copy, {t["metadata"]["name"]: t["spec"]["spec"] for t in templates})
    if not modes["dra"][1]:
        return None
    meta = obj.get("metadata") or {}
    name = "/".join(str(x) for x in (obj.get("kind"), meta.get("namespace"), meta.get("name")) if x)
    workload = Workload(name)
    (dp_obj, dp_specs), (dra_obj, dra_specs) = modes["device_plugin"], modes["dra"]
    for (path, dp_spec), (_, dra_spec) in zip(find_pod_specs(dp_obj), find_pod_specs(dra_obj)):
        claim = lambda spec, specs: specs.get((spec.get("resourceClaims") or [{}])[0].get("resourceClaimTemplateName"))  # noqa: E731
        dp, dra = claim(dp_spec, dp_specs), claim(dra_spec, dra_specs)
        if dp is None and dra is None:
            continue
        workload.templates.append(_Pods(_replicas(obj, path, where), dp, dra))
    return workload


def _replicas(obj: Any, path: Path, where: str) -> int:
    """Pods made from the template at `path`: the product of `replicas` and `parallelism` above it."""
    count = 1
    node = obj
    for part in path:
        if isinstance(node, Mapping):
            for key in ("replicas", "parallelism"):
                value = node.get(key)
                if isinstance(value, int) and not isinstance(value, bool):
                    if value < 0 or value > MAX_REPLICAS:
                        raise InputError(f"{where}: {key}: {value} is outside 0..{MAX_REPLICAS}")
                    count *= value
        node = node[part]
    if count > MAX_REPLICAS:
        raise InputError(f"{where}: {count} pods from one template (more than {MAX_REPLICAS})")
    return count


def _engine(spec: FleetSpec) -> tuple[Engine, dict[tuple[str, str], str], dict[tuple[str, str], int]]:
    """An engine over the fleet with its MIG partitions published and its `sharing` entries shared;
    (pool, MIG device) -> its GPU's name; (pool, shareable GPU) -> its memory (nano units)."""
    engine = Engine(scoring=True)
    for cls in CLASSES:
        engine.apply(msgspec.convert(cls, DeviceClass))
    engine.inventory.register_nodes([n.name for n in spec.nodes])
    parents: dict[tuple[str, str], str] = {}
    shared: dict[tuple[str, str], int] = {}
    for _, slices in build_fleet(spec):
        for s in slices:
            by_uuid = {}
            for d in s.spec.devices:
                uuid = d.attributes.get("uuid")
                if uuid is not None and uuid.string:
                    by_uuid[uuid.string] = d.name
                if d.allow_multiple_allocations and "memory" in d.capacity:
                    shared[(s.spec.pool.name, d.name)] = parse_quantity(d.capacity["memory"].value)
            for d in s.spec.devices:
                parent = d.attributes.get("parentUUID")
                if parent is not None and parent.string in by_uuid:
                    parents[(s.spec.pool.name, d.name)] = by_uuid[parent.string]
            engine.apply(s)
    return engine, parents, shared


def _allocate_dra(engine: Engine, parents: dict, shared: dict, workloads: list[Workload]) -> ModeResult:
    """Every pod's DRA claim through the engine, in input order."""
    result = ModeResult()
    started = time.perf_counter()
    n = 0
    for w in workloads:
        held = 0.0
        for t in w.templates:
            if t.dra is None:
                continue
            for _ in range(t.replicas):
                n += 1
                claim = msgspec.convert({"metadata": {"name": f"pod-{n}", "namespace": "plan"}, "spec": t.dra}, ResourceClaim)
                (outcome,) = engine.allocate([claim])
                if outcome.status != "allocated" or outcome.node is None or outcome.allocation is None:  # (allocated: both set)
                    result.not_fitted += 1
                    continue
                result.nodes.add(outcome.node)
                mig = share = False
                for r in outcome.allocation.devices.results:
                    parent = parents.get((r.pool, r.device))
                    result.gpus.add((r.pool, parent or r.device))
                    total = shared.get((r.pool, r.device))
                    if parent is not None:
                        result.mig_workloads.add(w.name)
                        held += _mig_share(r.device)
                        mig = True
                    elif total and r.share_id is not None and parse_quantity(r.consumed_capacity.get("memory", "0")) < total:
                        # a share; a whole-GPU request on a shareable GPU consumes all its memory: a whole GPU
                        result.share_workloads.add(w.name)
                        held += parse_quantity(r.consumed_capacity["memory"]) / total
                        share = True
                    else:
                        held += 1
                result.mig_pods += mig
                result.share_pods += share
        result.per_workload[w.name] = held
    result.seconds = time.perf_counter() - started
    return result


def _allocate_device_plugin(first_fit: FirstFit, workloads: list[Workload]) -> ModeResult:
    """Every pod's whole-GPU claim counted onto the fleet, first fit, in input order."""
    result = ModeResult()
    started = time.perf_counter()
    for w in workloads:
        held = 0.0
        for t in w.templates:
            if t.device_plugin is None:
                continue
            for _ in range(t.replicas):
                placed = first_fit.place(t.device_plugin)
                if placed is None:
                    result.not_fitted += 1
                    continue
                node, gpus = placed
                result.nodes.add(node)
                result.gpus.update(("", g) for g in gpus)
                held += len(gpus)
        result.per_workload[w.name] = held
    result.seconds = time.perf_counter() - started
    return result


def _why(mig: bool, share: bool) -> str:
    """What the workload's DRA pods hold besides whole GPUs."""
    return {(True, True): "MIG slices and GPU shares", (True, False): "MIG slices", (False, True): "GPU shares"}.get((mig, share), "whole GPUs")


def _mig_share(device: str) -> float:
    """A MIG device's compute share of its GPU from dralloc's device name (`gpu-0-mig-1g10gb-19-0`: 1/7)."""
    slices = device.split("-mig-", 1)[1].split("g", 1)[0]
    return int(slices) / 7 if slices.isdigit() else 1.0


def plan(paths: Sequence[str], fleet: Any, usage_path: str | None = None) -> tuple[dict, Report]:
    """The comparison as a JSON-ready dict (see the module doc), and what migrating the workloads reported."""
    started = time.perf_counter()
    report = Report()
    workloads = load_workloads(paths, usage_path, report)
    try:
        spec = load_fleet(fleet)
    except FleetError as exc:
        raise InputError(str(exc)) from None
    loaded = time.perf_counter()
    first_fit = FirstFit(spec, CLASSES)
    dp_fleet = time.perf_counter() - loaded
    dp = _allocate_device_plugin(first_fit, workloads)
    before_dra = time.perf_counter()
    dra_engine, dra_parents, dra_shared = _engine(spec)
    dra_fleet = time.perf_counter() - before_dra
    dra = _allocate_dra(dra_engine, dra_parents, dra_shared, workloads)

    def saved(w: Workload) -> float:
        return round(dp.per_workload.get(w.name, 0.0) - dra.per_workload.get(w.name, 0.0), 2)

    drivers = [
        {
            "workload": w.name,
            "pods": w.pods,
            "device_plugin_gpus": round(dp.per_workload.get(w.name, 0.0), 2),
            "dra_gpus": round(dra.per_workload.get(w.name, 0.0), 2),
            "saved": saved(w),
            "why": _why(w.name in dra.mig_workloads, w.name in dra.share_workloads),
        }
        for w in sorted(workloads, key=lambda w: (-saved(w), w.name))
    ]
    result = {
        "workloads": len(workloads),
        "pods": sum(w.pods for w in workloads),
        "fleet_nodes": len(spec.nodes),
        "fleet_gpus": first_fit.fleet_gpus,
        "device_plugin_gpus": len(dp.gpus),
        "dra_gpus": len(dra.gpus),
        "gpus_saved": len(dp.gpus) - len(dra.gpus),
        "device_plugin_nodes": len(dp.nodes),
        "dra_nodes": len(dra.nodes),
        "not_fitted_device_plugin": dp.not_fitted,
        "not_fitted_dra": dra.not_fitted,
        "dra_pods_on_mig": dra.mig_pods,
        "dra_pods_on_shares": dra.share_pods,
        "drivers": drivers,
        "seconds": {
            "read_and_migrate": round(loaded - started, 3),
            "device_plugin_fleet": round(dp_fleet, 3),
            "device_plugin_allocate": round(dp.seconds, 3),
            "dra_fleet": round(dra_fleet, 3),
            "dra_allocate": round(dra.seconds, 3),
            "total": round(time.perf_counter() - started, 3),
        },
    }
    return result, report
