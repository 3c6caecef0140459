"""Slices from the bus are checked before they enter the allocator's inventory: the API server's
size limits (`limits.slice_problem`) and dralloc's binding of a node-local pool to its node
(`decisions.node_binding_problem`). A refused slice takes its earlier version with it, so a
rebuild (which replays the latest event per subject) ends with the same inventory as live."""

from __future__ import annotations

from pathlib import Path

import msgspec
import pytest

from dralloc.allocator.decisions import Allocate, Decisions, node_binding_problem
from dralloc.discovery.fleet import build_fleet
from dralloc.ingestor.sources import events_from_manifests
from dralloc.manifests import load_paths
from dralloc.schemas import events as ev
from dralloc.schemas.limits import slice_problem
from dralloc.schemas.resource import ResourceClaim, ResourceSlice

CLASSES = Path(__file__).resolve().parents[2] / "examples" / "deviceclasses.yaml"


def gpu_slice(node: str, count: int, *, pool: str | None = None, name: str | None = None) -> ResourceSlice:
    """A node's GPU slice as dralloc's discovery builds it (real attributes), with `count` GPUs."""
    ((_, slices),) = build_fleet([{"profile": "h100-sxm", "count": 1, "prefix": node}])
    template = next(s for s in slices if s.spec.driver == "gpu.nvidia.com")
    first = template.spec.devices[0]
    devices = [msgspec.structs.replace(first, name=f"gpu-{i}") for i in range(count)]
    spec = msgspec.structs.replace(
        template.spec, devices=devices, node_name=f"{node}-0", pool=msgspec.structs.replace(template.spec.pool, name=pool or f"{node}-0")
    )
    return msgspec.structs.replace(template, spec=spec, metadata=msgspec.structs.replace(template.metadata, name=name or f"{node}-0-gpus"))


def test_a_slice_past_the_api_limits_is_refused_with_the_limit_named():
    assert slice_problem(gpu_slice("n", 128)) is None
    assert slice_problem(gpu_slice("n", 6_000)) == "spec.devices: at most 128 devices per slice, has 6,000"
    crowded = gpu_slice("n", 1)
    device = crowded.spec.devices[0]
    attributes = {**device.attributes, **{f"extra{i}": device.attributes[next(iter(device.attributes))] for i in range(40)}}
    crowded.spec.devices[0] = msgspec.structs.replace(device, attributes=attributes)
    assert slice_problem(crowded).startswith("spec.devices[0]: at most 32 attributes and capacities together, has ")
    twice = gpu_slice("n", 2)
    twice.spec.devices[1] = twice.spec.devices[0]
    assert slice_problem(twice) == "spec.devices[1].name: duplicate device name 'gpu-0'"
    bad_name = gpu_slice("n", 1)
    bad_name.spec.devices[0] = msgspec.structs.replace(bad_name.spec.devices[0], name="GPU 0")
    assert slice_problem(bad_name) == "spec.devices[0].name: 'GPU 0' is not a DNS label"


def test_counter_names_are_dns_labels_where_defined_and_a_device_consumes_from_two_sets_at_most():
    from dralloc.schemas.resource import Counter, CounterSet, DeviceCounterConsumption

    def with_counters(set_name: str, counter: str, consumed_sets: int = 1) -> ResourceSlice:
        s = gpu_slice("n", 1)
        s.spec.shared_counters = [CounterSet(name=set_name, counters={counter: Counter(value="80Gi")})]
        uses = [DeviceCounterConsumption(counter_set=set_name, counters={counter: Counter(value="1Gi")})] * consumed_sets
        s.spec.devices[0] = msgspec.structs.replace(s.spec.devices[0], consumes_counters=uses)
        return s

    assert slice_problem(with_counters("gpu-0-counters", "memory")) is None
    assert slice_problem(with_counters("gpu-0-counters", "memory", consumed_sets=2)) is None
    assert slice_problem(with_counters("GPU0", "memory")) == "spec.sharedCounters[0].name: 'GPU0' is not a DNS label"
    assert slice_problem(with_counters("gpu-0", 'mem"],["x')) == "spec.sharedCounters[0].counters: 'mem\"],[\"x' is not a DNS label"
    long_name = "m" * 5_000
    assert slice_problem(with_counters("gpu-0", long_name)) == f"spec.sharedCounters[0].counters: {long_name[:80] + '...'!r} is not a DNS label"
    assert slice_problem(with_counters("gpu-0", "memory", consumed_sets=3)) == "spec.devices[0].consumesCounters: at most 2 entries, has 3"


def test_skip_node_operations_from_the_bus_are_checked_as_the_api_server_does():
    """They are copied into the status of every claim the slice's devices serve: a hostile
    publisher's list must not reach them."""
    s = gpu_slice("n", 1)
    s.spec.skip_node_operations = ["*"]
    assert slice_problem(s) is None
    s.spec.skip_node_operations = ["NodePrepareResources"]
    assert slice_problem(s) == 'spec.skipNodeOperations: NodePrepareResources may be skipped only with NodeUnprepareResources (or with "*")'
    s.spec.skip_node_operations = ["NodeUnprepareResources"] * 50_000
    assert slice_problem(s) == "spec.skipNodeOperations: each operation at most once"


def test_a_node_local_pool_is_named_after_its_node():
    assert node_binding_problem(gpu_slice("n", 1)) is None
    assert node_binding_problem(gpu_slice("n", 1, pool="other-0")) == (
        "spec.pool.name 'other-0' is not spec.nodeName 'n-0' (a node-local pool is named after its node)"
    )


def claim(name: str, gpus: int) -> ResourceClaim:
    return msgspec.convert(
        {"metadata": {"name": name, "namespace": "ml", "uid": f"uid-{name}"},
         "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}}},
        ResourceClaim,
    )  # fmt: skip


@pytest.mark.parametrize("bad", ["6000-devices", "foreign-pool"])
def test_the_book_refuses_the_slice_and_forgets_its_earlier_version(bad: str):
    book = Decisions(max_gang=8)
    for event in events_from_manifests(load_paths([str(CLASSES)]), print):
        book.apply_inventory(event)
    assert book.apply_inventory(ev.ResourceSlicePublished(slice=gpu_slice("n", 2))) is None
    c = claim("a", 2)
    assert book.submitted(c) == Allocate(c)
    outcome, _ = book.allocate(c)
    assert outcome.status == "allocated"
    book.engine.release(c.key)
    replacement = gpu_slice("n", 6_000) if bad == "6000-devices" else gpu_slice("n", 4, pool="other-0")
    refused = book.apply_inventory(ev.ResourceSlicePublished(slice=replacement))
    assert refused is not None and refused.startswith("ResourceSlice n-0-gpus refused: spec.")
    outcome, commit = book.allocate(claim("b", 1))
    assert outcome.status == "unsatisfiable" and commit is None  # neither the new nor the old version is there
