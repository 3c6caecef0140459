"""Trace context without recording: when nothing exports, spans only carry ids, and one claim is
still one trace across the services (the ids travel in NATS headers)."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from dralloc import demo, telemetry
from dralloc.bus import Bus
from dralloc.bus.raw import jetstream

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from pipeline import claim_event  # noqa: E402


def traceparent(headers: dict[str, str]) -> tuple[int, int, str]:
    """(trace id, span id, flags) of a W3C traceparent header."""
    _, trace_id, span_id, flags = headers["traceparent"].split("-")
    return int(trace_id, 16), int(span_id, 16), flags


def test_spans_carry_context_until_a_processor_is_added():
    provider = telemetry.PropagatingTracerProvider(Resource.create({"service.name": "t"}))
    tracer = provider.get_tracer("dralloc")  # handed out before any processor, as services do

    with tracer.start_as_current_span("send dra.claims.a.b", kind=SpanKind.PRODUCER, attributes={"x": 1}) as root:
        assert not root.is_recording()
        sent = telemetry.inject({})
    trace_id, span_id, flags = traceparent(sent)
    assert trace_id != 0 and span_id != 0 and flags == "01"  # a new trace, flagged sampled
    assert (trace_id, span_id) == (root.get_span_context().trace_id, root.get_span_context().span_id)

    # The next service continues the trace: same trace id, its own span id.
    child = tracer.start_span("process dra.claims.a.b", context=telemetry.extract(sent), kind=SpanKind.CONSUMER)
    assert not child.is_recording()
    assert child.get_span_context().trace_id == trace_id and child.get_span_context().span_id not in (0, span_id)
    with trace.use_span(child, end_on_exit=True):
        onward = telemetry.inject({})
    assert traceparent(onward)[:2] == (trace_id, child.get_span_context().span_id)

    # A processor added later makes the same tracer record, in the same trace.
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with tracer.start_as_current_span("process dra.allocations.a.b", context=telemetry.extract(onward)) as recorded:
        assert recorded.is_recording()
    (span,) = exporter.get_finished_spans()
    assert span.context.trace_id == trace_id and span.parent.span_id == child.get_span_context().span_id
    provider.shutdown()


async def test_a_claim_and_its_decision_share_a_trace_when_nothing_records(bus: Bus, nats_url: str, monkeypatch):
    telemetry.setup("test")
    provider = trace.get_tracer_provider()
    assert isinstance(provider, telemetry.PropagatingTracerProvider)
    monkeypatch.setattr(provider, "sdk", None)  # as in a service without an exporter (another test may have added one)
    async with demo.running(nats_url, paths=[], services=("allocator",)):
        await bus.publish(claim_event("lonely"))  # no inventory at all: the decision is a failure, written all the same
        async with asyncio.timeout(15):
            while (await bus.stream_state("ALLOCATIONS")).messages < 1:
                await asyncio.sleep(0.05)
    claim = await jetstream(bus).get_msg("CLAIMS", seq=1)
    decision = await jetstream(bus).get_msg("ALLOCATIONS", seq=1)
    assert decision.subject == "dra.allocations.bench.lonely"
    claim_trace, claim_span, _ = traceparent(claim.headers)
    decision_trace, decision_span, _ = traceparent(decision.headers)
    assert claim_trace != 0 and decision_trace == claim_trace and decision_span != claim_span
