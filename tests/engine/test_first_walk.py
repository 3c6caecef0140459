"""The first claim of a class walks the fleet on shared outcomes (placement `_settled`, verdicts
`outcomes`/`record`; projection `Projector`): the same verdicts, decisions and charges as one
evaluation per node, without a projection of each device or a `Verdicts.get` per node."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.engine import Engine, cel
from dralloc.allocator.engine.projection import fields_of
from dralloc.allocator.engine.projector import Projector, project
from dralloc.allocator.engine.verdicts import Verdicts
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas.resource import Device, ResourceClaim

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"
H100_NODES = 40


def _fleet(interleaved: bool = False) -> Engine:
    """H100 nodes (8 GPUs and 8 NICs each), then two MIG nodes: the MIG class's first claim (its
    kind not known) walks every H100 node before it finds a device of its class. `interleaved`:
    the first half of the H100 nodes' later slices come last, so those nodes' device ids span
    other nodes' (ids are handed out as slices arrive)."""
    engine = Engine()
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        engine.apply(event.device_class)
    fleet = [{"profile": "h100-sxm", "count": H100_NODES, "prefix": "node"}, {"profile": "h200-sxm-mig", "count": 2, "prefix": "mig"}]
    late = []
    for n, (_, slices) in enumerate(build_fleet(fleet)):
        first, *rest = slices
        engine.apply(first)
        if interleaved and n < H100_NODES // 2:
            late += rest
        else:
            for slice_ in rest:
                engine.apply(slice_)
    for slice_ in late:
        engine.apply(slice_)
    return engine


def _claim(name: str, cls: str, selectors: tuple[str, ...] = (), count: int = 1) -> ResourceClaim:
    request = {"name": "r", "exactly": {"deviceClassName": cls, "count": count, "selectors": [{"cel": {"expression": e}} for e in selectors]}}
    return msgspec.convert({"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"}, "spec": {"devices": {"requests": [request]}}}, ResourceClaim)


CLAIMS = [
    _claim("m0", "mig.nvidia.com"),
    _claim("m1", "mig.nvidia.com", ('device.attributes["gpu.nvidia.com"].profile == "1g.18gb"',)),
    _claim("g0", "gpu.nvidia.com", ('device.attributes["gpu.nvidia.com"].productName == "NVIDIA H200"',)),
    _claim("g1", "gpu.nvidia.com", ('device.capacity["gpu.nvidia.com"].memory.compareTo(quantity("100Gi")) >= 0',)),
    _claim("m2", "mig.nvidia.com", ('device.attributes["gpu.nvidia.com"].profile == "7g.141gb"',)),
    _claim("g2", "gpu.nvidia.com", ('device.attributes["gpu.nvidia.com"].productName == "no such GPU"',)),
    _claim("m3", "mig.nvidia.com"),
]


def _run(engine: Engine) -> list[tuple[object, ...]]:
    """Each claim's outcome, and after it every verdict's bitsets and each node's settled verdicts."""
    out: list[tuple[object, ...]] = []
    for claim in CLAIMS:
        (outcome,) = engine.allocate([claim])
        verdicts = {key: (v.evaluated, v.matched, v.failed, dict(v.errors)) for key, v in engine.verdicts._cache.items()}
        nodes = {name: dict(topo.verdicts) for name in engine.inventory.node_names if (topo := engine.placement.topology.node(name)) is not None}
        out.append((msgspec.to_builtins(outcome), list(engine.verdicts._cache), verdicts, nodes, list(engine.verdicts._recent)))
    return out


def _counting_envs(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many CEL environments are built from now on (one per device evaluated, not shared)."""
    built = [0]
    real = cel.device_env

    def counting(*args: object) -> object:
        built[0] += 1
        return real(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(cel, "device_env", counting)
    return built


@pytest.mark.parametrize("interleaved", [False, True])
def test_the_settled_walk_decides_and_leaves_verdicts_as_a_get_per_node(monkeypatch: pytest.MonkeyPatch, interleaved: bool) -> None:
    envs = _counting_envs(monkeypatch)
    settled = _run(_fleet(interleaved))
    settled_envs, envs[0] = envs[0], 0
    monkeypatch.setattr(Verdicts, "outcomes", lambda self, alt, nodes: [None] * len(nodes))  # every node by `get`, as before
    per_node = _run(_fleet(interleaved))
    assert [o[0]["status"] for o in settled] == ["allocated"] * 5 + ["unsatisfiable", "allocated"]  # type: ignore[index]
    assert settled == per_node
    assert settled_envs == envs[0] > 0  # the same evaluations (and charges)


@pytest.mark.interpreted  # counts calls by replacing Projector.project and Verdicts.get, which compiled callers do not look up
def test_a_first_claim_of_a_class_projects_and_gets_per_device_shape_not_per_node(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = _fleet()
    projected, gets = [0], [0]
    real_project, real_get = Projector.project, Verdicts.get

    def counting_project(self: Projector, *args: object) -> tuple[object, ...]:
        projected[0] += 1
        return real_project(self, *args)  # type: ignore[arg-type]

    def counting_get(self: Verdicts, *args: object) -> object:
        gets[0] += 1
        return real_get(self, *args)  # type: ignore[arg-type]

    monkeypatch.setattr(Projector, "project", counting_project)
    monkeypatch.setattr(Verdicts, "get", counting_get)
    (outcome,) = engine.allocate([CLAIMS[0]])
    assert outcome.status == "allocated" and outcome.node == "mig-0"
    # each device of the walked nodes projected at most once per selector (the class's and the
    # request's), not again on each node visit, and `get` on a few nodes, not on each (41 and more
    # without the settled walk)
    walked = [name for name in engine.inventory.node_names if (topo := engine.placement.topology.node(name)) and topo.verdicts]
    assert len(walked) == H100_NODES + 1
    devices = sum(1 for name in walked for _ in engine.inventory.local.ids(name))
    assert 0 < projected[0] <= 2 * devices
    assert gets[0] < 10


def _device(raw: dict) -> Device:
    return msgspec.convert(raw, Device)


@pytest.mark.parametrize(
    "expression",
    [
        'device.attributes["gpu.example.com"].model == "h100"',
        'device.capacity["gpu.example.com"].memory.compareTo(quantity("1Gi")) > 0',
        'device.attributes["gpu.example.com"].model == "h100" && device.allowMultipleAllocations && device.attributes["x.io"].zone == "a"',
    ],
)
def test_a_projector_projects_as_project_does_whoever_holds_the_values(expression: str) -> None:
    shape = fields_of(expression)
    assert shape is not None
    projector = Projector(shape)
    devices = [
        _device({"name": "a", "attributes": {"model": {"string": "h100"}, "x.io/zone": {"string": "a"}}, "capacity": {"memory": {"value": "80Gi"}}}),
        _device({"name": "b", "attributes": {"gpu.example.com/model": {"string": "h100"}}, "allowMultipleAllocations": True}),
        _device({"name": "c", "attributes": {"model": {"string": "a100"}}, "capacity": {"gpu.example.com/memory": {"value": "1Gi"}}}),
        _device({"name": "d", "attributes": {"uuid": {"string": "3"}}}),
        # both names: the later in the map wins, either way round
        _device({"name": "e", "attributes": {"gpu.example.com/model": {"string": "a100"}, "model": {"string": "h100"}}}),
        _device({"name": "f", "attributes": {"model": {"string": "h100"}, "gpu.example.com/model": {"string": "a100"}}}),
    ]
    shared = devices[0].attributes["model"]
    devices.append(_device({"name": "g", "attributes": {"model": {"string": "a100"}}}))
    devices[-1].attributes["model"] = shared  # one instance held by two devices (engine/repeats.py)
    for device in devices:
        for driver in ("gpu.example.com", "other.example.com"):
            assert projector.project(driver, device) == project(shape, driver, device)


def test_a_verdict_after_a_node_republishes_its_gpus_reads_their_new_ids() -> None:
    """A republished pool gets new device ids, above the node's other pools' (its NICs'): a node's
    verdict starts at its lowest id (`Verdicts.get`'s `low`), so the new GPUs must still be evaluated,
    and what was known of the old ones must not stand for them."""
    engine = Engine()
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        engine.apply(event.device_class)
    fleet = build_fleet([{"profile": "h100-sxm", "count": 2, "prefix": "node"}])
    for _, slices in fleet:
        for slice_ in slices:
            engine.apply(slice_)
    h100 = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 80GB HBM3"'
    nvl = 'device.attributes["gpu.nvidia.com"].productName == "NVIDIA H100 NVL"'
    assert [o.status for o in engine.allocate([_claim("n0", "gpu.nvidia.com", (nvl,))])] == ["unsatisfiable"]  # evaluated: no match anywhere
    first = engine.allocate([_claim("h0", "gpu.nvidia.com", (h100,), count=8)])[0]
    assert (first.status, first.node) == ("allocated", "node-0")
    engine.release("ml/h0")
    (_, (gpus, _nics)), _ = fleet
    lowest = min(rec.id for rec in engine.inventory.devices if rec is not None and rec.local_node == "node-0")
    renamed = [
        msgspec.structs.replace(d, attributes={**d.attributes, "productName": msgspec.structs.replace(d.attributes["productName"], string="NVIDIA H100 NVL")})
        for d in gpus.spec.devices
    ]
    pool = msgspec.structs.replace(gpus.spec.pool, generation=2)
    engine.apply(msgspec.structs.replace(gpus, spec=msgspec.structs.replace(gpus.spec, pool=pool, devices=renamed)))
    ids = sorted(rec.id for rec in engine.inventory.devices if rec is not None and rec.local_node == "node-0" and rec.driver == "gpu.nvidia.com")
    assert ids[0] > lowest  # the NICs hold the node's lowest ids now
    nvl_claim = engine.allocate([_claim("n1", "gpu.nvidia.com", (nvl,), count=8)])[0]
    assert (nvl_claim.status, nvl_claim.node) == ("allocated", "node-0")
    h100_claims = [engine.allocate([_claim(f"h{i}", "gpu.nvidia.com", (h100,), count=8)])[0] for i in (1, 2)]
    assert [(o.status, o.node) for o in h100_claims] == [("allocated", "node-1"), ("unsatisfiable", None)]
