"""An OTLP/HTTP collector in the test's own process: what an OpenTelemetry SDK posts to /v1/traces (protobuf, as
the OTLP exporter sends it) decoded with OpenTelemetry's own protobuf classes and kept as spans to assert on."""

from __future__ import annotations

import gzip
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (ExportTraceServiceRequest,
                                                                      ExportTraceServiceResponse)


@dataclass(frozen=True)
class Span:
    name: str
    trace_id: str   # hex, as in a traceparent
    span_id: str
    parent_id: str  # "" for a root span
    start_ns: int
    end_ns: int
    attributes: dict
    service: str
    host: str
    status: int     # 0 unset, 1 ok, 2 error


def _value(v):
    kind = v.WhichOneof("value")
    return getattr(v, kind) if kind else None


class OTLPReceiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0):
        self.spans: list[Span] = []
        self.posts = 0
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                if self.path != "/v1/traces":
                    self.send_error(404)
                    return
                receiver._add(ExportTraceServiceRequest.FromString(body))
                reply = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

            def log_message(self, *args):
                pass

        self._server = ThreadingHTTPServer((host, port), Handler)
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def _add(self, request: ExportTraceServiceRequest) -> None:
        spans = []
        for resource_spans in request.resource_spans:
            resource = {a.key: _value(a.value) for a in resource_spans.resource.attributes}
            for scope in resource_spans.scope_spans:
                for s in scope.spans:
                    spans.append(Span(s.name, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                                      s.start_time_unix_nano, s.end_time_unix_nano,
                                      {a.key: _value(a.value) for a in s.attributes},
                                      resource.get("service.name", ""), resource.get("host.name", ""),
                                      s.status.code))
        with self._lock:
            self.spans.extend(spans)
            self.posts += 1

    def trace(self, trace_id: str) -> list[Span]:
        with self._lock:
            return [s for s in self.spans if s.trace_id == trace_id]

    def wait_for_trace(self, trace_id: str, names: set[str], timeout: float = 30.0) -> list[Span]:
        """The trace's spans once it has one of each name (the SDK batches them: a few seconds)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            spans = self.trace(trace_id)
            if names <= {s.name for s in spans}:
                return spans
            time.sleep(0.1)
        raise AssertionError(f"trace {trace_id}: spans {sorted(s.name for s in self.trace(trace_id))}, "
                             f"wanted {sorted(names)}")

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
