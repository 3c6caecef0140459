"""The observability path for real: the services as separate processes, configured only by the
OTEL_* variables compose.yaml gives them, export over OTLP/HTTP to a receiver standing in for
the OpenTelemetry collector (and Jaeger behind it). What arrives on the wire is checked: one
connected trace per claim across ingestor, allocator and status writer, discovery's slice
publication, and the allocator's and status writer's metrics."""

from __future__ import annotations

import asyncio
import os
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import yaml
from otlp_receiver import OtlpReceiver, Point, Span

from dralloc.bus import Bus
from dralloc.bus.raw import jetstream
from dralloc.schemas import events as ev

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from pipeline import Service, Stack, StreamReader  # noqa: E402

NAMESPACE = "otlp"
CLAIMS = {"fits": 1, "too-big": 16}  # GPUs asked for; the stack's one node has 8
ALLOCATOR_METRICS = (
    "dralloc.claims",
    "dralloc.allocation.duration",
    "dralloc.devices.allocated",
    "dralloc.devices.free",
    "dralloc.node.fragmentation",
    "dralloc.class.fragmentation",
    "dralloc.consumer.lag",
)


def compose_otel_env(endpoint: str) -> dict[str, str]:
    """The OTEL_* variables compose.yaml gives every dralloc service, the collector's address replaced."""
    env = yaml.safe_load((REPO / "compose.yaml").read_text())["x-dralloc"]["environment"]
    otel = {k: str(v) for k, v in env.items() if k.startswith("OTEL_")}
    assert "OTEL_EXPORTER_OTLP_ENDPOINT" in otel, "compose.yaml no longer points the services at a collector"
    return {**otel, "OTEL_EXPORTER_OTLP_ENDPOINT": endpoint}


def claim_manifest(name: str, gpus: int) -> dict:
    return {
        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
        "metadata": {"name": name, "namespace": NAMESPACE},
        "spec": {"devices": {"requests": [{"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com", "count": gpus}}]}},
    }  # fmt: skip


def messaging_subject(span: Span) -> str | None:
    return span.attributes.get("messaging.destination.name")


async def eventually(condition: Callable[[], bool], timeout: float) -> None:
    """Wait until `condition()` holds, at most `timeout` seconds (then the assertions say what is missing)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while not condition() and asyncio.get_running_loop().time() < deadline:
        await asyncio.sleep(0.1)


async def test_claims_are_traced_and_measured_over_otlp(tmp_path: Path, monkeypatch):
    for name in [k for k in os.environ if k.startswith("OTEL_")]:
        monkeypatch.delenv(name)  # only what the test sets; OTEL_SERVICE_NAME unset: services name themselves
    manifests = tmp_path / "claims"
    manifests.mkdir()
    (manifests / "claims.yaml").write_text(yaml.safe_dump_all([claim_manifest(n, g) for n, g in CLAIMS.items()]))

    with OtlpReceiver() as receiver:
        env = {**compose_otel_env(receiver.endpoint), "OTEL_METRIC_EXPORT_INTERVAL": "500", "OTEL_BSP_SCHEDULE_DELAY": "100"}
        async with Stack(nodes=1, env=env) as stack, await Bus.connect(stack.nats.url, name="test") as bus:
            await stack.ready(bus, timeout=30)
            # The claims go through the ingestor's file source, in an ingestor process of their own
            # that publishes once and exits (its spans leave at exit).
            ingestor = Service("ingestor-claims", ["ingestor", "-f", str(manifests), "--once", "--nats-url", stack.nats.url], env, stack.root)
            await ingestor.start()
            assert await asyncio.wait_for(ingestor.proc.wait(), 15) == 0
            decisions = StreamReader(bus, "ALLOCATIONS")

            async def decided() -> dict[str, str]:
                await decisions.read_new()
                return {
                    s.event.key.split("/", 1)[1]: type(s.event).__name__
                    for s in decisions.seen
                    if isinstance(s.event, ev.AllocationCommitted | ev.AllocationFailed) and s.event.key.startswith(f"{NAMESPACE}/")
                }

            async with asyncio.timeout(15):
                while len(outcomes := await decided()) < len(CLAIMS):
                    await asyncio.sleep(0.1)
            assert outcomes == {"fits": "AllocationCommitted", "too-big": "AllocationFailed"}

            def written() -> bool:  # the status writer's part of every claim's trace has arrived
                spans, _ = receiver.snapshot()
                done = {messaging_subject(s) for s in spans if s.service == "dralloc-statuswriter" and s.kind == "CONSUMER"}
                return all(f"dra.allocations.{NAMESPACE}.{n}" in done for n in CLAIMS)

            def measured() -> bool:
                _, points = receiver.snapshot()
                seen = {(p.service, p.metric) for p in points}
                claims = {p.attributes.get("outcome") for p in points if p.metric == "dralloc.claims" and p.service == "dralloc-allocator"}
                return (
                    all(("dralloc-allocator", m) in seen for m in ALLOCATOR_METRICS)
                    and ("dralloc-statuswriter", "dralloc.consumer.lag") in seen
                    and {"committed", "unsatisfiable"} <= claims
                )

            await eventually(written, 10)
            await eventually(measured, 10)
            slices = (await jetstream(bus).stream_info("INVENTORY", subjects_filter="dra.inventory.>")).state.subjects or {}
        # The stack has stopped (SIGTERM): whatever the services still held was flushed at exit.
        spans, points = receiver.snapshot()

    assert not receiver.errors
    assert receiver.requests.get("/v1/traces") and receiver.requests.get("/v1/metrics")
    services = {s.service for s in spans}
    assert {"dralloc-discovery", "dralloc-ingestor", "dralloc-allocator", "dralloc-statuswriter"} <= services

    for name in CLAIMS:
        check_claim_trace(spans, name)

    # Discovery's slice publication: a PRODUCER span per slice now in INVENTORY.
    published = {messaging_subject(s) for s in spans if s.service == "dralloc-discovery" and s.kind == "PRODUCER"}
    assert slices and set(slices) <= published
    assert all(
        s.attributes.get("messaging.system") == "nats" and s.name == f"send {messaging_subject(s)}"
        for s in spans
        if s.service == "dralloc-discovery" and s.kind == "PRODUCER"
    )

    check_allocator_metrics(points)
    lag = {(p.attributes["stream"], p.attributes["consumer"]) for p in points if p.metric == "dralloc.consumer.lag"}
    assert ("CLAIMS", "allocator") in lag and ("ALLOCATIONS", "statuswriter-local") in lag


def check_claim_trace(spans: list[Span], name: str) -> None:
    """One trace for the claim: ingestor -> allocator -> status writer, every parent in it but the root's."""
    claim, decision = f"dra.claims.{NAMESPACE}.{name}", f"dra.allocations.{NAMESPACE}.{name}"
    about = [s for s in spans if messaging_subject(s) in (claim, decision)]
    trace_ids = {s.trace_id for s in about}
    assert len(trace_ids) == 1, f"{name}: the claim's messages are in {len(trace_ids)} traces"
    (trace_id,) = trace_ids
    trace = [s for s in spans if s.trace_id == trace_id]
    ids = {s.span_id for s in trace}
    assert len(ids) == len(trace), f"{name}: a span arrived twice"
    roots = [s for s in trace if not s.parent_id]
    assert len(roots) == 1, f"{name}: {len(roots)} roots"
    assert (roots[0].service, roots[0].kind, roots[0].name) == ("dralloc-ingestor", "PRODUCER", f"send {claim}")
    orphans = [(s.service, s.name) for s in trace if s.parent_id and s.parent_id not in ids]
    assert not orphans, f"{name}: spans whose parent is not in the trace: {orphans}"

    hops = Counter((s.service, s.kind, messaging_subject(s)) for s in trace if s.kind in ("PRODUCER", "CONSUMER"))
    assert hops[("dralloc-ingestor", "PRODUCER", claim)] == 1
    assert hops[("dralloc-allocator", "CONSUMER", claim)] >= 1  # a redelivery would be another
    assert hops[("dralloc-allocator", "PRODUCER", decision)] >= 1
    assert hops[("dralloc-statuswriter", "CONSUMER", decision)] >= 1
    for s in trace:
        if s.kind in ("PRODUCER", "CONSUMER"):
            assert s.attributes.get("messaging.system") == "nats", s
            verb = "send" if s.kind == "PRODUCER" else "process"
            assert s.name == f"{verb} {messaging_subject(s)}", s
    by_id = {s.span_id: s for s in trace}
    for s in trace:  # each message's CONSUMER span is the child of the PRODUCER span that sent it
        if s.kind == "CONSUMER":
            parent = by_id[s.parent_id]
            assert (parent.kind, messaging_subject(parent)) == ("PRODUCER", messaging_subject(s)), s
    allocate = [s for s in trace if s.name == "allocate" and s.service == "dralloc-allocator"]
    assert allocate and allocate[0].attributes["dralloc.outcome"] == ("allocated" if name == "fits" else "unsatisfiable")


def check_allocator_metrics(points: list[Point]) -> None:
    def last(metric: str, **attributes: str) -> Point:
        found = [p for p in points if p.metric == metric and all(p.attributes.get(k) == v for k, v in attributes.items())]
        mine = [p for p in found if p.service == "dralloc-allocator"]
        assert mine, f"no {metric} {attributes} from dralloc-allocator (from: {sorted({p.service for p in found})})"
        return mine[-1]

    # Cumulative: the last export counts every decision; the stack's readiness probe is one more commit.
    assert last("dralloc.claims", outcome="committed").value == 2
    assert last("dralloc.claims", outcome="unsatisfiable").value == 1
    duration = last("dralloc.allocation.duration", outcome="committed")
    assert duration.kind == "histogram" and duration.count == 2 and 0 < duration.value < 5
    # The buckets are for seconds: they tell a decision under 10 ms from one over 100 ms (the SDK's
    # default boundaries, 0, 5, 10, ... 10000, are for milliseconds and would put both in one).
    assert {0.01, 0.1} <= set(duration.bounds), duration.bounds
    assert sum(duration.buckets[: duration.bounds.index(0.1) + 1]) == 2, (duration.bounds, duration.buckets)
    cls = "gpu.nvidia.com"
    assert last("dralloc.devices.allocated", node="node-0", device_class=cls).value == 2  # probe + fits
    assert last("dralloc.devices.free", node="node-0", device_class=cls).value == 6
    assert last("dralloc.node.fragmentation", node="node-0", device_class=cls).value == 0.0  # one NVSwitch fabric: 6 free together
    assert last("dralloc.class.fragmentation", device_class=cls).value == 1.0  # every free GPU is on a node in use
    assert last("dralloc.consumer.lag", stream="CLAIMS", consumer="allocator").kind == "gauge"
