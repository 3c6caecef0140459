"""One trace per claim across the services: W3C context travels in NATS headers."""

from __future__ import annotations

import asyncio
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from dralloc import demo, telemetry
from dralloc.bus import Bus
from dralloc.statuswriter.sinks import read_all

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


async def test_a_claim_is_one_trace_from_ingestor_to_status_writer(bus: Bus, nats_url: str, tmp_path: Path):
    telemetry.setup("test")
    exporter = InMemorySpanExporter()
    trace.get_tracer_provider().add_span_processor(SimpleSpanProcessor(exporter))
    (tmp_path / "c.yaml").write_text((EXAMPLES / "deviceclasses.yaml").read_text() + "---\n" + (EXAMPLES / "nvlink-pair.yaml").read_text())
    fleet = [{"profile": "h100-sxm", "count": 1}]
    async with demo.running(nats_url, paths=[str(tmp_path)], fleet=fleet):
        kv = await bus.key_value("dralloc-claims")
        async with asyncio.timeout(15):
            while not any(s.state == "allocated" for s in await read_all(kv)):
                await asyncio.sleep(0.05)
    exporter.shutdown()

    spans = exporter.get_finished_spans()
    claim_subject = "dra.claims.team-a.h100-nvlink-pair"
    decision_subject = "dra.allocations.team-a.h100-nvlink-pair"
    (sent,) = [s for s in spans if s.name == f"send {claim_subject}"]
    trace_id = sent.context.trace_id
    in_trace = [s for s in spans if s.context.trace_id == trace_id]
    kinds = {(s.name, s.kind) for s in in_trace}
    assert (f"send {claim_subject}", SpanKind.PRODUCER) in kinds  # ingestor
    assert (f"process {claim_subject}", SpanKind.CONSUMER) in kinds  # allocator
    assert (f"send {decision_subject}", SpanKind.PRODUCER) in kinds  # allocator's decision
    assert (f"process {decision_subject}", SpanKind.CONSUMER) in kinds  # status writer
    assert all(s.attributes.get("messaging.system") == "nats" for s in in_trace if s.kind in (SpanKind.PRODUCER, SpanKind.CONSUMER))
    allocate = [s for s in in_trace if s.name == "allocate"]
    assert allocate and allocate[-1].attributes["dralloc.outcome"] == "allocated"
    # The consumer span is the child of the producer span it received.
    (received,) = [s for s in in_trace if s.name == f"process {claim_subject}"]
    assert received.parent.span_id == sent.context.span_id
