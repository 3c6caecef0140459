"""`telemetry.extract` and `telemetry.inject` read and write W3C trace context straight from the
headers under OpenTelemetry's default propagators: the same contexts and headers as the propagators."""

from __future__ import annotations

import pytest
from opentelemetry import baggage, propagate, trace
from opentelemetry import context as otel_context
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags, TraceState

from dralloc import telemetry

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
SPAN = "00f067aa0ba902b7"

HEADERS = [
    {},
    {"Nats-Msg-Id": "x"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01"},
    {"traceparent": f"00-{TRACE}-{SPAN}-00", "Nats-Msg-Id": "x"},
    {"traceparent": f" 00-{TRACE}-{SPAN}-01\t"},  # whitespace around, as the propagator allows
    {"traceparent": f"01-{TRACE}-{SPAN}-01-future-part"},  # a later version may add fields
    {"traceparent": f"00-{TRACE}-{SPAN}-01-extra"},  # version 00 may not
    {"traceparent": f"ff-{TRACE}-{SPAN}-01"},  # the forbidden version
    {"traceparent": f"00-{'0' * 32}-{SPAN}-01"},  # all-zero trace id
    {"traceparent": f"00-{TRACE}-{'0' * 16}-01"},  # all-zero span id
    {"traceparent": f"00-{TRACE.upper()}-{SPAN}-01"},  # upper case is not W3C
    {"traceparent": "garbage"},
    {"traceparent": ""},
    {"traceparent": f"00-{TRACE}-{SPAN}-01" + " " * 600},  # over the length limit
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "tracestate": "vendor=abc,other=1"},
    {"traceparent": f"00-{TRACE}-{SPAN}-01", "baggage": "claim=a"},
]


def described(context: otel_context.Context) -> tuple:
    span = trace.get_current_span(context).get_span_context()
    return span.trace_id, span.span_id, span.trace_flags, span.is_remote, dict(span.trace_state or {}), span.is_valid, dict(baggage.get_all(context))


@pytest.mark.parametrize("headers", HEADERS, ids=range(len(HEADERS)))
def test_extract_reads_what_the_propagators_read(headers: dict[str, str]):
    assert described(telemetry.extract(headers)) == described(propagate.extract(dict(headers)))


@pytest.mark.parametrize("state", [None, TraceState([("vendor", "abc")])])
@pytest.mark.parametrize("flags", [0, 1])
def test_inject_writes_what_the_propagators_write(state: TraceState | None, flags: int):
    span = NonRecordingSpan(SpanContext(int(TRACE, 16), int(SPAN, 16), is_remote=False, trace_flags=TraceFlags(flags), trace_state=state))
    token = otel_context.attach(trace.set_span_in_context(span))
    try:
        ours, theirs = telemetry.inject({"Nats-Msg-Id": "x"}), {"Nats-Msg-Id": "x"}
        propagate.inject(theirs)
    finally:
        otel_context.detach(token)
    assert ours == theirs and ours["traceparent"] == f"00-{TRACE}-{SPAN}-0{flags}"


def test_inject_without_a_span_or_with_baggage():
    assert telemetry.inject({}) == {}  # no current span: nothing to carry
    token = otel_context.attach(baggage.set_baggage("claim", "a"))
    try:
        ours, theirs = telemetry.inject({}), {}
        propagate.inject(theirs)
    finally:
        otel_context.detach(token)
    assert ours == theirs == {"baggage": "claim=a"}


def test_inject_a_given_span_without_making_it_current():
    span = NonRecordingSpan(SpanContext(int(TRACE, 16), int(SPAN, 16), is_remote=False, trace_flags=TraceFlags(1)))
    theirs: dict[str, str] = {}
    propagate.inject(theirs, context=trace.set_span_in_context(span))
    assert telemetry.inject({}, span) == theirs == {"traceparent": f"00-{TRACE}-{SPAN}-01"}
    assert not trace.get_current_span().get_span_context().is_valid  # (nothing was made current)
