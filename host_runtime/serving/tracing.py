"""Request tracing with OpenTelemetry, off unless serving.toml names an OTLP/HTTP collector (box.toml's [tracing]).

A span per request (`POST /v1/chat/completions`), joined to the client's trace where it sends a W3C `traceparent`
(the fleet's gateway passes it on to the box that serves), with child spans for where a generation's time went:
`queue`, `prefix_cache.restore`, `prefill` and `decode` from the engine's own measurements (wire.Timings, sent with
its Done event: the engine process has no tracer of its own), and `stream`, this worker relaying the engine's
events to the client. The answer carries the trace in a `traceresponse` header (W3C Trace Context level 2), and a
failed request's log line names its trace id.
"""

from __future__ import annotations

import logging
from urllib.parse import urlsplit

import falcon

from host_runtime.engine import wire
from host_runtime.front.settings import short_hostname

log = logging.getLogger(__name__)

SERVICE_NAME = "everycycle"
TRACER_NAME = "everycycle.serving"
TRACES_PATH = "/v1/traces"  # OTLP/HTTP's path for spans, added to a collector URL that has none


def traces_url(endpoint: str) -> str:
    """The URL spans are posted to: a collector's base URL (http://host:4318) gets OTLP's /v1/traces."""
    return endpoint if urlsplit(endpoint).path not in ("", "/") else endpoint.rstrip("/") + TRACES_PATH


class Tracing:
    """One HTTP worker's tracer: its spans batched and sent to the collector by the SDK's thread (made in the
    worker, after gunicorn forks: a thread does not survive the fork)."""

    def __init__(self, endpoint: str, sample_ratio: float = 1.0, service_name: str = SERVICE_NAME):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
        from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

        # The ratio decides, on the trace id, for a client's traceparent too: its sampled flag no longer forces a
        # span (#56, item 13: any client could make every one of its requests traced). A trace id is judged the
        # same on every box with the same ratio, so a fleet's spans of one trace are kept or dropped together.
        ratio = TraceIdRatioBased(sample_ratio)
        self.provider = TracerProvider(resource=Resource.create({"service.name": service_name,
                                                                 "host.name": short_hostname()}),
                                       sampler=ParentBased(ratio, remote_parent_sampled=ratio,
                                                           remote_parent_not_sampled=ratio))
        self.provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=traces_url(endpoint),
                                                                             timeout=5)))
        self.tracer = self.provider.get_tracer(TRACER_NAME)
        self.propagator = TraceContextTextMapPropagator()


class _HeaderGetter:
    """The propagator's view of a falcon request's headers."""

    def get(self, req: falcon.Request, key: str) -> list[str] | None:
        value = req.get_header(key)
        return None if value is None else [value]

    def keys(self, req: falcon.Request) -> list[str]:
        return list(req.headers)


HEADERS = _HeaderGetter()


class RequestTrace:
    """One request's span and what this worker learns of it: the model, the engine's events and timings."""

    def __init__(self, tracing: Tracing, req: falcon.Request):
        from opentelemetry.trace import SpanKind

        self._tracer = tracing.tracer
        parent = tracing.propagator.extract(req, getter=HEADERS)
        self.span = self._tracer.start_span(f"{req.method} {req.path}", context=parent, kind=SpanKind.SERVER,
                                            attributes={"http.request.method": req.method, "url.path": req.path})
        self._stream = None      # the `stream` span, from the engine's acceptance to the answer's last byte
        self._sent_ns = 0        # when this worker sent the generation to the engine (the engine's phases follow)
        self._completion_tokens = 0
        self._ended = False

    # ---- identity --------------------------------------------------------------------------------------------

    @property
    def trace_id(self) -> str:
        return format(self.span.get_span_context().trace_id, "032x")

    def response_header(self) -> str:
        """W3C `traceresponse`: this request's trace and span, and whether it is sampled."""
        ctx = self.span.get_span_context()
        return f"00-{ctx.trace_id:032x}-{ctx.span_id:016x}-{int(ctx.trace_flags):02x}"

    # ---- what the serving logic tells it ---------------------------------------------------------------------

    def model(self, model_id: str) -> None:
        self.span.set_attribute("everycycle.model", model_id)

    def watch(self, stream, sent_ns: int) -> None:
        """A generation the engine accepted (sent at `sent_ns`): its events pass through `event` from here."""
        from opentelemetry.trace import set_span_in_context

        self._sent_ns = sent_ns
        self.span.set_attribute("everycycle.prompt_tokens", stream.prompt_tokens)
        self._stream = self._tracer.start_span("stream", context=set_span_in_context(self.span))
        stream.on_event = self.event

    def event(self, event) -> None:
        if isinstance(event, wire.Finish):
            self._completion_tokens += event.completion_tokens
        elif isinstance(event, wire.Done):
            self.span.set_attributes({"everycycle.completion_tokens": self._completion_tokens,
                                      "everycycle.cached_tokens": event.cached_tokens})
            if event.timings is not None:
                self._engine_phases(event.timings)
        elif isinstance(event, wire.Error):
            self.span.set_attribute("everycycle.engine_error", event.error.code or event.error.error_type)

    def _engine_phases(self, t: wire.Timings) -> None:
        """The engine's phases as child spans, laid end to end from when this worker sent the request."""
        from opentelemetry.trace import set_span_in_context

        self.span.set_attributes({"everycycle.cache_hit": t.cache_hit or "none",
                                  "everycycle.preemptions": t.preemptions})
        parent = set_span_in_context(self.span)
        at = self._sent_ns
        for name, seconds, attributes in (
                ("queue", t.queued_s, {}),
                ("prefix_cache.restore", t.restore_s, {"everycycle.cache_hit": t.cache_hit or "none"}),
                ("prefill", t.prefill_s, {}),
                ("decode", t.decode_s, {"everycycle.completion_tokens": self._completion_tokens,
                                        "everycycle.parked_s": t.parked_s,
                                        "everycycle.preemptions": t.preemptions})):
            end = at + int(seconds * 1e9)
            if name != "prefix_cache.restore" or t.cache_hit:  # a restore only where a prefix was reused
                self._tracer.start_span(name, context=parent, start_time=at, attributes=attributes).end(end)
            at = end

    # ---- the end -----------------------------------------------------------------------------------------------

    def end(self, status: int, key_name: str | None, route: str | None) -> None:
        """The answer is complete (or the client left): the spans end, a failure is marked and logged."""
        from opentelemetry.trace import Status, StatusCode

        if self._ended:
            return
        self._ended = True
        if route:
            self.span.update_name(f"{self.span.name.split(' ', 1)[0]} {route}")
        if key_name:
            self.span.set_attribute("everycycle.key", key_name)
        self.span.set_attribute("http.response.status_code", status)
        if status >= 500:
            self.span.set_status(Status(StatusCode.ERROR))
        if self._stream is not None:
            self._stream.end()
        self.span.end()

    def streamed(self, body, status: int, key_name: str | None, route: str | None):
        """The answer's body passed on as it is, the spans ended when its last byte is written or the client
        leaves (closing this closes `body`, which cancels the generation as before)."""
        try:
            yield from body
        finally:
            self.end(status, key_name, route)


class TraceMiddleware:
    """Opens each request's span once its key is accepted (after the key check: a client without a valid key
    makes no span, and chooses no trace id the box records, #56 item 13) and ends it with the answer."""

    def __init__(self, tracing: Tracing, keys_required: bool = True):
        self._tracing = tracing
        self._keys_required = keys_required

    def process_request(self, req: falcon.Request, resp: falcon.Response) -> None:
        if self._keys_required and not req.context.get("key_name"):
            return  # an open path asked without a key (a probe): not traced
        req.context.trace = RequestTrace(self._tracing, req)

    def process_response(self, req: falcon.Request, resp: falcon.Response, resource, req_succeeded: bool) -> None:
        trace: RequestTrace | None = req.context.get("trace")
        if trace is None:
            return
        status = resp.status_code
        resp.set_header("traceresponse", trace.response_header())
        if status >= 400:
            # Where to look: the trace of a refusal or failure, by the id the client got in its header too.
            log.log(logging.WARNING if status >= 500 else logging.INFO, "%s %s answered %d (trace_id=%s)",
                    req.method, req.path, status, trace.trace_id)
        key_name, route = req.context.get("key_name"), req.uri_template
        if resp.stream is not None and not hasattr(resp.stream, "read"):
            resp.stream = trace.streamed(resp.stream, status, key_name, route)
        else:
            trace.end(status, key_name, route)


def trace_id_of(req: falcon.Request) -> str | None:
    """The request's trace id, where it is traced (for a log line)."""
    trace = req.context.get("trace")
    return trace.trace_id if trace is not None else None
