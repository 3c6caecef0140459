"""A small OTLP/HTTP receiver: what an OpenTelemetry collector would get from the services.

It listens on a free port of 127.0.0.1 and accepts what the SDK's OTLP/HTTP
exporters send (``POST /v1/traces`` and ``/v1/metrics``, protobuf, optionally
gzip), decodes it with the OTLP protobuf definitions (`opentelemetry.proto`) and
keeps it flattened: one `Span` per span, one `Point` per metric data point, each
with the ``service.name`` of the process's resource. No SDK code reads what the
services sent: only the wire format.
"""

from __future__ import annotations

import gzip
import threading
import zlib
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import ExportMetricsServiceRequest, ExportMetricsServiceResponse
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest, ExportTraceServiceResponse
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1 import trace_pb2

KINDS = {v: k.removeprefix("SPAN_KIND_") for k, v in trace_pb2.Span.SpanKind.items()}
"""Span kind number -> INTERNAL, SERVER, CLIENT, PRODUCER, CONSUMER (UNSPECIFIED)."""


@dataclass(frozen=True)
class Span:
    service: str
    trace_id: str
    span_id: str
    parent_id: str
    """Empty for a trace's root."""
    name: str
    kind: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class Point:
    service: str
    metric: str
    kind: str
    """gauge, sum or histogram."""
    attributes: dict[str, Any]
    value: float
    """The value; for a histogram, the sum."""
    count: int
    """A histogram's count (1 for other points)."""
    bounds: tuple[float, ...] = ()
    """A histogram's explicit bucket boundaries, and its count per bucket (one more than bounds)."""
    buckets: tuple[int, ...] = ()


def _value(v: AnyValue) -> Any:
    field = v.WhichOneof("value")
    if field == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, field) if field else None


def _attributes(pairs: list[KeyValue]) -> dict[str, Any]:
    return {kv.key: _value(kv.value) for kv in pairs}


class OtlpReceiver:
    """``with OtlpReceiver() as receiver:`` serves at ``receiver.endpoint`` until the block ends."""

    def __init__(self) -> None:
        self.spans: list[Span] = []
        self.points: list[Point] = []
        self.requests: dict[str, int] = {}
        """Path -> POST requests decoded."""
        self.errors: list[str] = []
        """Requests that could not be decoded (the test fails on any)."""
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-receiver", daemon=True)

    @property
    def endpoint(self) -> str:
        """For ``OTEL_EXPORTER_OTLP_ENDPOINT`` (the exporters add /v1/traces, /v1/metrics)."""
        return f"http://127.0.0.1:{self._server.server_address[1]}"

    def __enter__(self) -> OtlpReceiver:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def snapshot(self) -> tuple[list[Span], list[Point]]:
        with self._lock:
            return list(self.spans), list(self.points)

    def _receive(self, path: str, body: bytes) -> bytes:
        """Decode one export request; the protobuf answer to send back."""
        if path == "/v1/traces":
            request = ExportTraceServiceRequest.FromString(body)
            spans = [
                Span(
                    service=_attributes(rs.resource.attributes).get("service.name", ""),
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_id=s.parent_span_id.hex(),
                    name=s.name,
                    kind=KINDS[s.kind],
                    attributes=_attributes(s.attributes),
                )
                for rs in request.resource_spans
                for ss in rs.scope_spans
                for s in ss.spans
            ]
            with self._lock:
                self.spans += spans
            return ExportTraceServiceResponse().SerializeToString()
        if path == "/v1/metrics":
            request = ExportMetricsServiceRequest.FromString(body)
            points = []
            for rm in request.resource_metrics:
                service = _attributes(rm.resource.attributes).get("service.name", "")
                for sm in rm.scope_metrics:
                    for m in sm.metrics:
                        kind = m.WhichOneof("data")
                        for p in getattr(m, kind).data_points:
                            if kind == "histogram":
                                shape = (p.sum, p.count, tuple(p.explicit_bounds), tuple(p.bucket_counts))
                            else:
                                shape = (getattr(p, p.WhichOneof("value")), 1, (), ())
                            points.append(Point(service, m.name, kind, _attributes(p.attributes), *shape))
            with self._lock:
                self.points += points
            return ExportMetricsServiceResponse().SerializeToString()
        raise LookupError(path)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                encoding = (self.headers.get("Content-Encoding") or "").lower()
                try:
                    if encoding == "gzip":
                        body = gzip.decompress(body)
                    elif encoding == "deflate":
                        body = zlib.decompress(body)
                    answer = receiver._receive(self.path, body)
                except LookupError:
                    self.send_error(404)
                    return
                except Exception as exc:  # noqa: BLE001 - a request we cannot read fails the test, not the server
                    with receiver._lock:
                        receiver.errors.append(f"{self.path}: {type(exc).__name__}: {exc}")
                    self.send_error(400)
                    return
                with receiver._lock:
                    receiver.requests[self.path] = receiver.requests.get(self.path, 0) + 1
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:  # quiet: pytest shows failures, not traffic
                pass

        return Handler
