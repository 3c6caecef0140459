"""`dralloc plan`'s device-plugin side counts pods onto nodes (plan_device_plugin.FirstFit) instead of
searching the whole fleet with the engine: it must give what the engine without scoring gives."""

from __future__ import annotations

import importlib.util

import msgspec
import pytest
import yaml
from migrate_helpers import EXAMPLES, REPO

from dralloc.allocator.engine import Engine
from dralloc.discovery.fleet import fleet_inventories, load_fleet
from dralloc.discovery.slices import build_slices
from dralloc.migrate.plan import CLASSES, _allocate_device_plugin, load_workloads
from dralloc.migrate.plan_device_plugin import FirstFit
from dralloc.migrate.rewrite import Report
from dralloc.schemas.resource import DeviceClass, ResourceClaim


def _generated(tmp_path, count: int, seed: int) -> tuple[str, str]:
    spec = importlib.util.spec_from_file_location("plan_workloads", REPO / "benchmarks" / "plan_workloads.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    objects, usage = module.generate(count, seed)
    workloads = tmp_path / "workloads.yaml"
    workloads.write_text(yaml.safe_dump_all(objects, sort_keys=False))
    usage_path = tmp_path / "usage.csv"
    usage_path.write_text("namespace,pod,container,peak_memory_mib,peak_utilization\n" + "".join(",".join(map(str, row)) + "\n" for row in usage))
    return str(workloads), str(usage_path)


def _engine_first_fit(fleet, workloads) -> tuple[int, set[str], int, dict[str, float]]:
    """The reference: every pod's whole-GPU claim through one engine over the whole fleet, scoring off."""
    spec = load_fleet(fleet)
    engine = Engine(scoring=False)
    for cls in CLASSES:
        engine.apply(msgspec.convert(cls, DeviceClass))
    engine.inventory.register_nodes([n.name for n in spec.nodes])
    for inventory in fleet_inventories(spec):
        for gpu in inventory.gpus:
            gpu.mig_profiles = ()
        for s in build_slices(inventory, layout=spec.layout):
            engine.apply(s)
    gpus: set[tuple[str, str]] = set()
    nodes: set[str] = set()
    not_fitted, n, per_workload = 0, 0, {}
    for w in workloads:
        held = 0.0
        for t in w.templates:
            for _ in range(t.replicas if t.device_plugin is not None else 0):
                n += 1
                claim = msgspec.convert({"metadata": {"name": f"pod-{n}", "namespace": "plan"}, "spec": t.device_plugin}, ResourceClaim)
                (outcome,) = engine.allocate([claim])
                if outcome.status != "allocated":
                    not_fitted += 1
                    continue
                nodes.add(outcome.node)
                results = outcome.allocation.devices.results
                gpus.update((r.pool, r.device) for r in results)
                held += len(results)
        per_workload[w.name] = held
    return len(gpus), nodes, not_fitted, per_workload


@pytest.mark.parametrize(
    "fleet, count, seed",
    [
        # room for everything: nodes of four profiles, product and family labels choose among them
        (
            [
                {"profile": "h100-sxm", "count": 6},
                {"profile": "h100-sxm-mig", "count": 2},
                {"profile": "l40s-pcie", "count": 5},
                {"profile": "a100-pcie", "count": 2},
            ],
            30,
            3,
        ),
        # too small: pods that do not fit, partly filled nodes taken by later small pods
        ([{"profile": "l40s-pcie", "count": 2}, {"profile": "h100-sxm", "count": 3}], 40, 11),
    ],
)
def test_counting_gives_what_the_engine_gives_without_scoring(tmp_path, fleet, count, seed):
    workloads_path, usage_path = _generated(tmp_path, count, seed)
    workloads = load_workloads([str(EXAMPLES), workloads_path], usage_path, Report())
    gpus, nodes, not_fitted, per_workload = _engine_first_fit(fleet, workloads)
    counted = _allocate_device_plugin(FirstFit(load_fleet(fleet), CLASSES), workloads)
    assert gpus > 0 and len(workloads) > count // 2
    assert (len(counted.gpus), counted.nodes, counted.not_fitted) == (gpus, nodes, not_fitted)
    assert counted.per_workload == per_workload


def test_a_claim_no_profile_admits_fits_nowhere():
    first_fit = FirstFit(load_fleet([{"profile": "l40s-pcie", "count": 2}]), CLASSES)
    hopper = {
        "devices": {
            "requests": [
                {
                    "name": "gpu",
                    "exactly": {
                        "deviceClassName": "gpu.nvidia.com",
                        "count": 1,
                        "selectors": [{"cel": {"expression": "device.attributes['gpu.nvidia.com'].architecture == 'Hopper'"}}],
                    },
                }
            ]
        }
    }
    assert first_fit.place(hopper) is None
    one = {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": 3}}]}}
    # 8 GPUs per L40S node: two pods of 3 on the first node, the third goes to the second
    assert [first_fit.place(one)[0] for _ in range(3)] == ["l40s-pcie-0", "l40s-pcie-0", "l40s-pcie-1"]
    assert first_fit.fleet_gpus == 16
