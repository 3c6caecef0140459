"""End to end over a cluster: claims in the (emulated) API server get their status written with the
committed allocation, by the real ingestor, allocator and status writer over a real nats-server
(claims allocated on their own; Pods as units and the RBAC check are in test_kube_pods.py)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from kube_emulator import ApiServer
from kube_objects import CLASS, claim, node_slice
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from dralloc import telemetry
from dralloc.allocator import service as allocator
from dralloc.bus import Bus
from dralloc.ingestor import service as ingestor
from dralloc.ingestor.kubernetes import KubernetesSource, KubeSourceOptions
from dralloc.kube import KubeSettings
from dralloc.statuswriter import service as statuswriter
from dralloc.statuswriter.kubernetes import KubernetesSink

SLICE = node_slice([{"name": "gpu-0", "attributes": {"index": {"int": 0}}}, {"name": "gpu-1", "attributes": {"index": {"int": 1}}}])


@pytest.fixture
async def services(apiserver: ApiServer, bus: Bus) -> AsyncIterator[None]:
    """The ingestor (Kubernetes source, slices on, claims no Pod uses allocated at once:
    ``DRALLOC_INGESTOR_UNUSED_CLAIMS=allocate``), allocator and status writer. (The default,
    Pods as units behind the scheduling gate, is tested in test_kube_pods.py.)"""
    settings = KubeSettings(server=str(apiserver.url).rstrip("/"))
    stop = asyncio.Event()
    options = KubeSourceOptions(settings=settings, slices=True, unused_claims="allocate")
    source = KubernetesSource(None, print, options=options)
    sink = KubernetesSink(settings=settings)
    tasks = [
        asyncio.create_task(ingestor.serve(bus, ingestor.Config(source="kubernetes"), stop, source=source)),
        asyncio.create_task(allocator.serve(bus, allocator.Config(ack_wait=5), stop)),
        asyncio.create_task(statuswriter.serve(bus, statuswriter.Config(sink="kubernetes", ack_wait=5), stop, sink=sink)),
    ]
    yield
    stop.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 10)
    await sink.close()


async def allocation_of(apiserver: ApiServer, name: str, timeout: float = 10) -> dict[str, Any]:
    async with asyncio.timeout(timeout):
        while True:
            obj = apiserver.read("resourceclaims", "ml", name)
            if obj and (obj.get("status") or {}).get("allocation"):
                return obj["status"]
            await asyncio.sleep(0.05)


def devices(status: dict[str, Any]) -> set[str]:
    return {r["device"] for r in status["allocation"]["devices"]["results"]}


async def test_claims_get_their_allocation_and_deleted_claims_release_devices(apiserver: ApiServer, services: None) -> None:
    apiserver.apply(CLASS)
    apiserver.apply(SLICE)
    pod = {"apiVersion": "v1", "kind": "Pod", "name": "trainer", "uid": "pod-1", "controller": True}
    apiserver.apply(claim("a", "ml", metadata={"ownerReferences": [pod]}))
    apiserver.apply(claim("b", "ml"))
    a, b = await allocation_of(apiserver, "a"), await allocation_of(apiserver, "b")
    assert devices(a) | devices(b) == {"gpu-0", "gpu-1"}
    result = a["allocation"]["devices"]["results"][0]
    assert (result["driver"], result["pool"], result["request"]) == ("gpu.example.com", "node-0", "gpu")
    assert a["allocation"]["nodeSelector"]  # node-local devices: the claim says where it can run
    assert a["reservedFor"] == [{"resource": "pods", "name": "trainer", "uid": "pod-1"}]
    assert "reservedFor" not in b

    # Deleting `a` frees its device: the next claim gets exactly that one.
    apiserver.remove("resourceclaims", "ml", "a")
    apiserver.apply(claim("d", "ml"))
    d = await allocation_of(apiserver, "d")
    assert devices(d) == devices(a)

    # Every status write was a patch of the status subresource: each claim written once, and `a`
    # cleared once more when deleted (its finalizer held it: cleared, then the finalizer dropped).
    status_patches = [key for verb, sub, key in apiserver.writes if sub == "status"]
    assert sorted(k[2] for k in status_patches) == ["a", "a", "b", "d"]
    assert apiserver.read("resourceclaims", "ml", "a") is None


async def test_a_claim_allocated_elsewhere_keeps_its_device(apiserver: ApiServer, services: None) -> None:
    """A claim the cluster already allocated (say, by the scheduler) holds its device for dralloc too."""
    apiserver.apply(CLASS)
    apiserver.apply(SLICE)
    taken = {"request": "gpu", "driver": "gpu.example.com", "pool": "node-0", "device": "gpu-1"}
    apiserver.apply({**claim("elsewhere", "ml"), "status": {"allocation": {"devices": {"results": [taken]}}}})
    apiserver.apply(claim("new", "ml"))
    assert devices(await allocation_of(apiserver, "new")) == {"gpu-0"}
    apiserver.apply(claim("third", "ml"))
    await asyncio.sleep(1.0)  # both devices are held: `third` must stay unallocated
    assert not (apiserver.read("resourceclaims", "ml", "third").get("status") or {}).get("allocation")
    # The foreign allocation is never rewritten by dralloc.
    assert apiserver.read("resourceclaims", "ml", "elsewhere")["status"]["allocation"]["devices"]["results"] == [taken]


async def test_the_status_write_is_part_of_the_claims_trace(apiserver: ApiServer, services: None) -> None:
    telemetry.setup("test")
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    apiserver.apply(CLASS)
    apiserver.apply(SLICE)
    apiserver.apply(claim("traced", "ml"))
    await allocation_of(apiserver, "traced")
    async with asyncio.timeout(5):
        while not (writes := [s for s in exporter.get_finished_spans() if s.name == "write ResourceClaim status"]):
            await asyncio.sleep(0.02)
    exporter.shutdown()
    (write,) = writes
    assert write.kind is SpanKind.CLIENT and write.attributes["dralloc.outcome"] == "written"
    assert write.attributes["dralloc.claim"] == "traced" and write.attributes["k8s.namespace.name"] == "ml"
    # Same trace as the ingestor's publish of the claim: one trace per claim, Kubernetes to Kubernetes.
    # (The ingestor sends the claim again once its status is written: the cluster's truth; the first is the claim's.)
    sent = min((s for s in exporter.get_finished_spans() if s.name == "send dra.claims.ml.traced"), key=lambda s: s.start_time)
    assert write.context.trace_id == sent.context.trace_id


async def test_the_status_names_the_node_operations_the_slice_skips(apiserver: ApiServer, services: None) -> None:
    """Kubernetes 1.37's optional node operations: a driver with no node plugin publishes
    `skipNodeOperations` and the allocator copies them into the results, or the kubelet waits for
    a plugin that is not there. Each device's come from its own slice."""
    apiserver.apply(CLASS)
    skipping = node_slice([{"name": "gpu-0"}])
    skipping["spec"] = {**skipping["spec"], "skipNodeOperations": ["*"], "pool": {"name": "node-0", "generation": 1, "resourceSliceCount": 2}}
    plain = node_slice([{"name": "gpu-1"}])
    plain["metadata"] = {"name": "node-0-gpu-b"}
    plain["spec"] = {**plain["spec"], "pool": {"name": "node-0", "generation": 1, "resourceSliceCount": 2}}
    apiserver.apply(skipping)
    apiserver.apply(plain)
    both = claim("both", "ml")
    both["spec"]["devices"]["requests"][0]["exactly"]["count"] = 2
    apiserver.apply(both)
    results = (await allocation_of(apiserver, "both"))["allocation"]["devices"]["results"]
    assert {r["device"]: r.get("skipNodeOperations") for r in results} == {"gpu-0": ["*"], "gpu-1": None}
